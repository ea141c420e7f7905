"""UniTE's determine-then-ensemble model selection (UniTE Sec. 4.1), on candidates' scores and answer lengths
(read from earlier runs by report/select.py).

Start with the best model on the target tasks; then, best first, add each model whose score is within ``gap``
(absolute, in accuracy points as a fraction: 0.10 = 10 points, as the paper's examples read) of the best and
whose mean response length is within ``length_ratio`` (longer / shorter <= 2) of the best model's, until
``max_models`` are chosen. Response length is the mean number of words of the model's generated answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ensemble_bench.errors import UserError


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
