"""UniTE's determine-then-ensemble model selection (UniTE Sec. 4.1), from earlier runs' results.

Candidates are the single-model rows of finished ``ensbench run`` directories. Start with the
best model on the target tasks; then, best first, add each model whose score is within ``gap``
(absolute, in accuracy points as a fraction: 0.10 = 10 points, as the paper's examples read) of
the best and whose mean response length is within ``length_ratio`` (longer / shorter <= 2) of
the best model's, until ``max_models`` are chosen. Response length is the mean number of words
of the model's generated answers over the generation tasks (multiple-choice tasks have none).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ensemble_bench.errors import UserError
from ensemble_bench.methods import get_method
from ensemble_bench.report.summary import finished_recipe, recipe_benchmarks, row_scores
from ensemble_bench.run.folder import TIMING, read_json, samples_files


@dataclass(frozen=True)
class Candidate:
    label: str
    member: dict           # the member's recipe entry
    scores: dict[str, float]  # benchmark name -> score (0..1)
    mean_words: float | None  # mean words per generated answer, None without generation tasks
    source: str


@dataclass(frozen=True)
class Decision:
    candidate: Candidate
    score: float
    gap: float | None
    length_ratio: float | None
    verdict: str


def _response_words(row_dir: Path) -> list[int]:
    words = []
    for samples in samples_files(row_dir):
        for record in read_json(samples):
            for response in record.get("resps", []):
                if response and isinstance(response[0], str):
                    words.append(len(response[0].split()))
    return words


def load_candidates(run_dirs: list[Path]) -> list[Candidate]:
    """Every single-model row of the given runs (a later run's row replaces an earlier one's)."""
    found: dict[str, Candidate] = {}
    for run_dir in run_dirs:
        recipe = finished_recipe(run_dir)
        benches = recipe_benchmarks(run_dir, recipe)
        for spec in recipe.members:
            row_dir = run_dir / spec.label
            if not (row_dir / TIMING).exists():
                continue
            scores = {name: value for name, (value, _) in row_scores(row_dir, benches).items()}
            words = _response_words(row_dir)
            found[spec.label] = Candidate(spec.label, spec.model_dump(mode="json", exclude_none=True), scores,
                                          sum(words) / len(words) if words else None, str(run_dir))
    if len(found) < 2:
        raise UserError(f"need at least 2 candidate models with single-model rows, found {len(found)}")
    return list(found.values())


def select_models(candidates: list[Candidate], max_models: int = 3, gap: float = 0.10,
                  length_ratio: float = 2.0, tasks: list[str] | None = None) -> list[Decision]:
    """Determine-then-ensemble: the decisions for every candidate, best first."""
    shared = set.intersection(*(set(c.scores) for c in candidates))
    target = [t for t in (tasks or sorted(shared))]
    missing = [t for t in target if t not in shared]
    if missing or not target:
        raise UserError(f"tasks {missing or '(none)'} are not scored for every candidate "
                        f"(shared: {', '.join(sorted(shared)) or 'none'})")
    score = {c.label: sum(c.scores[t] for t in target) / len(target) for c in candidates}
    ranked = sorted(candidates, key=lambda c: -score[c.label])
    best = ranked[0]
    decisions = [Decision(best, score[best.label], None, None, "chosen (best)")]
    chosen = 1
    for candidate in ranked[1:]:
        difference = score[best.label] - score[candidate.label]
        ratio = _length_ratio(best, candidate)
        if difference > gap:
            verdict = f"rejected: gap > {gap:.2f}"
        elif ratio is not None and ratio > length_ratio:
            verdict = f"rejected: length ratio > {length_ratio:g}"
        elif chosen >= max_models:
            verdict = f"not needed ({max_models} chosen)"
        else:
            verdict = "chosen"
            chosen += 1
        decisions.append(Decision(candidate, score[candidate.label], difference, ratio, verdict))
    return decisions


def _length_ratio(a: Candidate, b: Candidate) -> float | None:
    if not a.mean_words or not b.mean_words:
        return None
    return max(a.mean_words, b.mean_words) / min(a.mean_words, b.mean_words)


def selected_recipe(decisions: list[Decision], method: str, name: str) -> dict:
    """A recipe for the chosen models (best first, the best as the method's lead member when it has
    one: UniTE's primary) on the source run's tasks: one ``method`` (the source's ``methods`` and
    ``sweep`` are left out, whatever its shape)."""
    chosen = [d.candidate for d in decisions if d.verdict.startswith("chosen")]
    source = finished_recipe(Path(chosen[0].source))
    params: dict = {"name": method}
    lead_param = get_method(method).lead_param
    if lead_param is not None:
        params[lead_param] = chosen[0].label
    data = source.model_dump(mode="json", exclude_none=True)
    for planned_rows in ("methods", "sweep"):  # the source's ensemble rows: the new recipe has one method
        data.pop(planned_rows, None)
    data.update(name=name, description=f"{method} of the models chosen by ensbench select",
                members=[{k: v for k, v in c.member.items() if k != "weight"} for c in chosen],  # the old ensemble's
                method=params, singles=True)
    return data
