"""``ensbench select``'s reading and writing around UniTE's determine-then-ensemble selection (the rule is
methods/unite_selection.py): the candidates are the single-model rows of finished ``ensbench run``
directories, with their scores and the mean number of words of their generated answers over the generation
tasks (multiple-choice tasks have none); the chosen models become a new recipe.
"""

from __future__ import annotations

from pathlib import Path

from ensemble_bench.errors import UserError
from ensemble_bench.methods import method_spec
from ensemble_bench.methods.unite_selection import Candidate, Decision
from ensemble_bench.report.summary import finished_recipe, recipe_benchmarks, row_scores
from ensemble_bench.run.folder import TIMING, read_json, samples_files


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


def selected_recipe(decisions: list[Decision], method: str, name: str) -> dict:
    """A recipe for the chosen models (best first, the best as the method's lead member when it has
    one: UniTE's primary) on the source run's tasks: one ``method`` (the source's ``methods`` and
    ``sweep`` are left out, whatever its shape)."""
    chosen = [d.candidate for d in decisions if d.verdict.startswith("chosen")]
    source = finished_recipe(Path(chosen[0].source))
    params: dict = {"name": method}
    lead_param = method_spec(method).lead_param
    if lead_param is not None:
        params[lead_param] = chosen[0].label
    data = source.model_dump(mode="json", exclude_none=True)
    for planned_rows in ("methods", "sweep"):  # the source's ensemble rows: the new recipe has one method
        data.pop(planned_rows, None)
    data.update(name=name, description=f"{method} of the models chosen by ensbench select",
                members=[{k: v for k, v in c.member.items() if k != "weight"} for c in chosen],  # the old ensemble's
                method=params, singles=True)
    return data
