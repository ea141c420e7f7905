"""The run folder: every file name of a run and of its rows, and the writers of ensbench's own files.

Layout of one run (``results/<recipe>/<run id>/``)::

    recipe.yaml          the recipe as run (``write_recipe``: the one writer, for ``run`` and ``ensbench-lm-eval``)
    params.json          every row's method parameters, defaults included
    tasks/               generated lm-eval task configs
    cache/<row>.db       lm-eval's response cache of each row
    reused.json          the rows this run copied from other runs, and from where
    .<row>.partial/      a row being written (renamed to <row>/ when complete); .<row>.damaged/ one set aside
    <row>/               lm-eval's files of one row (results_<date>.json, samples_<task>_<date>.jsonl), timing.json
                         (``write_row_timing``), span_trace.jsonl (span methods); appears only when the row is complete
    cache/<row>_rank0.db.sittings.json   the counters of a row's earlier sittings (``sittings``)
    summary.md / .csv    the table, written last: summary.md marks the run finished (``is_finished``)
    paired.csv           the paired tests of the summary

A row's text-free extract of a samples file is ``scores_<task>.jsonl`` (``report.samples``). Every file is
written atomically (``cache.atomic_write_text``) and every JSON file is read by ``parse_json`` (or, where a
damaged file ends the command, ``read_json``). The runner, the row store, the lm-eval route and the reports
name these files through this module only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ensemble_bench import settings
from ensemble_bench.cache import atomic_write_text
from ensemble_bench.errors import CACHE, CACHE_DB_SUFFIX, EnvironmentFault, UserError

# CACHE (the responses' folder) and CACHE_DB_SUFFIX (a row's file in it) are defined in errors: its damaged-cache
# line names that file, and errors imports no module of the package
RECIPE = "recipe.yaml"
PARAMS = "params.json"
TASKS = "tasks"
REUSED = "reused.json"
TIMING = "timing.json"
SPAN_TRACE = "span_trace.jsonl"
SUMMARY = "summary.md"  # written last: its presence marks a run finished
SUMMARY_CSV = "summary.csv"
PAIRED_CSV = "paired.csv"
RESULTS_PREFIX, RESULTS_SUFFIX = "results_", ".json"  # lm-eval's results_<date>.json, one per evaluation
RESULTS_GLOB = f"{RESULTS_PREFIX}*{RESULTS_SUFFIX}"
SAMPLES_PREFIX, SAMPLES_SUFFIX = "samples_", ".jsonl"  # lm-eval's samples_<task>_<date>.jsonl
SAMPLES_GLOB = f"{SAMPLES_PREFIX}*{SAMPLES_SUFFIX}"
EXTRACT_PREFIX = "scores_"  # scores_<task>.jsonl: a samples file without its text (report.samples)
EXTRACT_GLOB = f"{EXTRACT_PREFIX}*{SAMPLES_SUFFIX}"
LM_EVAL_OUTPUT = "results.json"  # the output_path ensbench-lm-eval gives lm-eval: it writes the dated files beside it
SITTINGS_SUFFIX = ".sittings.json"  # beside a row's response cache: the counters of its earlier sittings


def output_root(recipe) -> Path:
    """The recipe's ``output:`` folder with ``~`` and ``$VAR`` expanded: the one reading of it, used by
    the preflight and the run alike (``settings.expand_path``)."""
    return settings.expand_path(recipe.output, f"output: '{recipe.output}'")


def is_finished(run_dir: Path) -> bool:
    return (run_dir / SUMMARY).exists()


def partial_row(run_dir: Path, label: str) -> Path:
    """Where a row is written until it is complete (then renamed to ``<row>``)."""
    return inside(run_dir, f".{label}.partial")


def set_aside(run_dir: Path, label: str) -> Path:
    """Where a damaged finished row is moved before it is recomputed."""
    return inside(run_dir, f".{label}.damaged")


KEPT_BYTES = 64 << 20  # the most JSON text reading_once keeps parsed (a large group's results file: ~0.5 MiB)


@dataclass
class _Reads:
    found: dict = field(default_factory=dict)
    size: int = 0  # bytes of the files kept


_READ: list[_Reads] = []  # while reading_once() holds: what was listed and read, by what and where


@contextmanager
def reading_once() -> Iterator[None]:
    """Within it, every listing of results files and every JSON file ``read_json`` reads is done once, however
    often it is asked for (up to KEPT_BYTES of files kept): for a report command, whose runs do not change
    while they are read (``table`` on a run of 10,000 rows listed and read each row's results file five
    times). Outside it, every call reads the disk."""
    _READ.append(_Reads())
    try:
        yield
    finally:
        _READ.pop()


def _once(key: tuple, read: Callable[[], Any], size: int = 0) -> Any:
    if not _READ:
        return read()
    reads = _READ[-1]
    if key in reads.found:
        return reads.found[key]
    value = read()  # a fault is raised again next time: it is not kept
    if reads.size + size <= KEPT_BYTES:
        reads.found[key] = value
        reads.size += size
    return value


def results_files(folder: Path, nested: bool = False) -> list[Path]:
    """lm-eval's results files in ``folder`` (``nested``: in it and every folder below), sorted."""
    return list(_once(("results", str(folder), nested),
                      lambda: sorted(folder.rglob(RESULTS_GLOB) if nested else folder.glob(RESULTS_GLOB))))


def results_date(path: Path) -> str:
    """``results_2026-11-23T08-42-00.313753.json`` -> its date, which its samples files share."""
    return path.name.removeprefix(RESULTS_PREFIX).removesuffix(RESULTS_SUFFIX)


def samples_file(row_dir: Path, task: str, date: str) -> Path:
    return row_dir / f"{SAMPLES_PREFIX}{task}_{date}{SAMPLES_SUFFIX}"


def samples_files(row_dir: Path, task: str | None = None) -> list[Path]:
    """A row's samples files (of one task), sorted: the newest of a task last."""
    if task is None:
        return sorted(row_dir.glob(SAMPLES_GLOB))
    return sorted(p for p in row_dir.glob(f"{SAMPLES_PREFIX}{task}_*{SAMPLES_SUFFIX}") if samples_task(p) == task)


def samples_task(path: Path) -> str:
    """``samples_nq_open_2026-11-23T08-42-00.313753.jsonl`` -> ``nq_open``."""
    return path.name[len(SAMPLES_PREFIX):].rsplit("_", 1)[0]


def newest_samples(row_dir: Path) -> dict[str, Path]:
    """lm-eval task name -> its newest samples file in the row folder."""
    return {samples_task(path): path for path in samples_files(row_dir)}


def extract_file(folder: Path, task: str) -> Path:
    return folder / f"{EXTRACT_PREFIX}{task}{SAMPLES_SUFFIX}"


def cache_db(run_dir: Path, label: str) -> Path:
    """lm-eval's response cache of one row (lm-eval appends _rank<n>.db to the name it is given)."""
    return inside(run_dir / CACHE, label + CACHE_DB_SUFFIX)


def sittings_file(db: Path) -> Path:
    """The statistics of a row's earlier sittings, beside its response cache (``cache/<row>_rank0.db``)."""
    return db.with_name(db.name.removesuffix(".db") + SITTINGS_SUFFIX)


def parse_json(path: Path) -> Any:
    """The JSON value of a .json file, or the list of values of a .jsonl file (one per line): the one JSON
    reader of a run's files; OSError or ValueError when missing or damaged."""
    text = path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()] if path.suffix == SAMPLES_SUFFIX else json.loads(text)


def damaged(path: Path, err: Exception | str) -> EnvironmentFault:
    why = err if isinstance(err, str) else type(err).__name__
    return EnvironmentFault(f"{path}: damaged or unreadable ({why}): run its recipe again with --fresh, or leave "
                            "this run out")


def read_json(path: Path) -> Any:
    """A JSON file of a run (a JSON object), or a JSON-lines file (a list of objects, one per line); else
    one line naming the damaged file (valid JSON of another shape too: ``[]`` for timing.json). Within
    ``reading_once`` a JSON file is read once; a JSON-lines (samples) file is not kept: it may be large,
    and a report reads each once anyway."""
    if path.suffix == SAMPLES_SUFFIX:
        return _read_checked(path)
    try:
        size = path.stat().st_size
    except OSError:
        size = 0  # _read_checked names the file
    return _once(("json", str(path)), lambda: _read_checked(path), size)


def _read_checked(path: Path) -> Any:
    try:
        found = parse_json(path)
    except (OSError, ValueError) as err:
        raise damaged(path, err) from None
    if not all(isinstance(value, dict) for value in (found if path.suffix == SAMPLES_SUFFIX else [found])):
        raise damaged(path, "valid JSON, but not " + ("one object per line" if path.suffix == SAMPLES_SUFFIX else
                                                      "a JSON object"))
    return found


def write_span_trace(row_dir: Path, traces: list[dict]) -> None:
    """Span-level methods' candidates and scores per round, one JSON line each."""
    atomic_write_text(row_dir / SPAN_TRACE, "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in traces))


def write_params(run_dir: Path, params: dict[str, Any]) -> None:
    atomic_write_text(run_dir / PARAMS, json.dumps(params, indent=1, sort_keys=True))


def write_recipe(run_dir: Path, recipe) -> None:
    """The recipe as run, fields at their defaults included, ``None`` fields left out."""
    dumped = recipe.model_dump(mode="json", exclude_none=True)
    atomic_write_text(run_dir / RECIPE, yaml.safe_dump(dumped, sort_keys=False))


def write_timing(row_dir: Path, timing: dict[str, Any]) -> None:
    atomic_write_text(row_dir / TIMING, json.dumps(timing, indent=2))


def write_row_timing(row_dir: Path, recipe, row, reported: dict[str, Any]) -> None:
    """A finished row's timing.json, one layout for ``ensbench run`` and ``ensbench-lm-eval``: the row's label,
    method and members (by label), then what its run reported (the method's statistics, the scoring's, ...)."""
    members = [recipe.members[i].label for i in row.members]
    write_timing(row_dir, {"label": row.label, "method": row.method, "members": members, **reported})


def recorded_key(row_dir: Path) -> str | None:
    """The row key a finished row's timing.json records (row_store), or None (absent, unreadable, older)."""
    try:
        found = parse_json(row_dir / TIMING).get("row_key")
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
