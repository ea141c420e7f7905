"""Reading the files of a run folder: lm-eval's JSON results and JSON-lines samples (one line
naming a damaged file), one row of a run (``RunRow``), the leaf tasks of an lm-eval group, the metrics lm-eval reports on 0-100."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ensemble_bench.errors import EnvironmentFault
from ensemble_bench.recipe import Row

# lm-eval reports these corpus metrics (sacrebleu) on 0-100; every score in a report is 0..1
PERCENT_METRICS = ("bleu", "chrf", "ter")


@dataclass(frozen=True)
class RunRow:
    """One evaluated row of a run: its plan, its timing.json and its scores."""
    plan: Row
    timing: dict
    scores: dict[str, tuple[float, int]]  # benchmark name -> (score 0..1, examples)


def leaf_tasks(group_subtasks: dict, name: str) -> list[str]:
    children = group_subtasks.get(name)
    if children is None:
        return [name]
    return [leaf for child in children for leaf in leaf_tasks(group_subtasks, child)]


def damaged(path: Path, err: Exception) -> EnvironmentFault:
    return EnvironmentFault(f"{path}: damaged or unreadable ({type(err).__name__}): run its recipe again with "
                            "--fresh, or leave this run out")


def read_json(path: Path):
    """A JSON file of a run, or one line naming the damaged file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise damaged(path, err) from None


def read_json_lines(path: Path) -> list:
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, ValueError) as err:
        raise damaged(path, err) from None
