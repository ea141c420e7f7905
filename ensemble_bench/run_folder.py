"""The run folder: every file name of a run and of its rows, and the writers of ensbench's own files.

Layout of one run (``results/<recipe>/<run id>/``)::

    recipe.yaml          the recipe as run (``write_recipe``: the one writer, for ``run`` and ``ensbench-lm-eval``)
    params.json          every row's method parameters, defaults included
    tasks/               generated lm-eval task configs
    cache/<row>.db       lm-eval's response cache of each row
    reused.json          the rows this run copied from other runs, and from where
    <row>/               lm-eval's files of one row (results_*.json, samples_*.jsonl), timing.json (``write_timing``),
                         span_trace.jsonl (span methods); appears only when the row is complete
    summary.md / .csv    the table, written last: summary.md marks the run finished (``is_finished``)
    paired.csv           the paired tests of the summary

Every file is written atomically (``cache.atomic_write_text``). The runner, the row store, the lm-eval
route and the reports name these files through this module only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from ensemble_bench import settings
from ensemble_bench.cache import atomic_write_text
from ensemble_bench.errors import UserError

RECIPE = "recipe.yaml"
PARAMS = "params.json"
TASKS = "tasks"
CACHE = "cache"
REUSED = "reused.json"
TIMING = "timing.json"
SPAN_TRACE = "span_trace.jsonl"
SUMMARY = "summary.md"  # written last: its presence marks a run finished
SUMMARY_CSV = "summary.csv"
PAIRED_CSV = "paired.csv"


def output_root(recipe) -> Path:
    """The recipe's ``output:`` folder with ``~`` and ``$VAR`` expanded: the one reading of it, used by
    the preflight and the run alike (``settings.expand_path``)."""
    return settings.expand_path(recipe.output, f"output: '{recipe.output}'")


def is_finished(run_dir: Path) -> bool:
    return (run_dir / SUMMARY).exists()


def write_recipe(run_dir: Path, recipe) -> None:
    """The recipe as run, fields at their defaults included, ``None`` fields left out."""
    dumped = recipe.model_dump(mode="json", exclude_none=True)
    atomic_write_text(run_dir / RECIPE, yaml.safe_dump(dumped, sort_keys=False))


def write_timing(row_dir: Path, timing: dict[str, Any]) -> None:
    atomic_write_text(row_dir / TIMING, json.dumps(timing, indent=2))


def recorded_key(row_dir: Path) -> str | None:
    """The row key a finished row's timing.json records (row_store), or None (absent, unreadable, older)."""
    try:
        found = json.loads((row_dir / TIMING).read_text()).get("row_key")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def inside(folder: Path, name: str) -> Path:
    """``folder / name``, refused unless it is an entry of that folder (no separator, no '..', no
    link out): every path the runner writes or deletes goes through here (labels are also checked
    when the recipe is read)."""
    path = folder / name
    if name in ("", ".", "..") or "/" in name or "\\" in name or path.resolve().parent != folder.resolve():
        raise UserError(f"{name!r} would be written outside the run folder {folder}; refused")
    return path
