"""Whether a finished row's folder can be kept or reused: every file there, and its scores true.

A row proves itself from its own files, before a resumed run keeps it and before another run reuses
it (``damage``): timing.json and a results_*.json per task group must parse; each task with samples
must have its samples file, holding the very examples its results file records (lm-eval's
``task_hashes``), each example's document matching its ``doc_hash`` and one example per document
evaluated (``n-samples``); and every score aggregated by mean must be the mean of its samples'
values (within float rounding), every group's score the mean of its tasks' (by size, or plain). A
hand-edited score, a samples file from another run, or a truncated file is therefore never reused.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from ensemble_bench.run.folder import (
    RESULTS_GLOB,
    SAMPLES_SUFFIX,
    TIMING,
    parse_json,
    results_date,
    results_files,
    samples_file,
)

TOLERANCE = 1e-9  # a mean recomputed in another order differs by far less; an edited score by far more


def _file_problem(path: Path) -> str | None:
    """Why one file of a row cannot be used (missing, not parsing), or None."""
    try:
        value = parse_json(path)
    except FileNotFoundError:
        return f"{path.name} is missing"
    except (OSError, ValueError) as err:
        return f"{path.name} does not parse ({type(err).__name__})"
    if path.suffix != SAMPLES_SUFFIX and not isinstance(value, dict):
        return f"{path.name} does not parse (not a JSON object)"
    return None


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _samples_hash(samples: list) -> str | None:
    """lm-eval's hash of a task's samples (as it records it in results_*.json: task_hashes); None when
    a line lacks the fields it is made of."""
    try:
        return _sha256("".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"] for s in samples))
    except (TypeError, KeyError):
        return None


def _doc_problem(samples: list[dict], task: str, results: dict) -> str | None:
    """An example whose document is not the one its doc_hash records, or a count of documents other
    than the one the results file says were evaluated."""
    for sample in samples:
        if "doc" in sample and _sha256(json.dumps(sample["doc"], indent=2, ensure_ascii=False)) != sample["doc_hash"]:
            return f"example {sample.get('doc_id')}'s document is not the one its doc_hash records"
    counted = results.get("n-samples", {}).get(task, {}).get("effective")
    documents = {sample.get("doc_id") for sample in samples}
    if isinstance(counted, int) and len(documents) != counted:
        return f"it holds {len(documents)} documents where {counted} were evaluated"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= TOLERANCE * max(1.0, abs(a), abs(b))


def _score_problem(samples: list[dict], task: str, results: dict) -> str | None:
    """A score of ``task`` aggregated by mean that is not the mean of its samples' values."""
    scores = results.get("results", {}).get(task, {})
    config = results.get("configs", {}).get(task, {})
    means = [m["metric"] for m in config.get("metric_list") or [] if isinstance(m, dict)
             and m.get("aggregation", "mean") == "mean" and isinstance(m.get("metric"), str)]
    for metric in means:
        for flt in dict.fromkeys(s.get("filter", "none") for s in samples):
            values = [s.get(metric) for s in samples if s.get("filter", "none") == flt]
            recorded = scores.get(f"{metric},{flt}")
            if not _is_number(recorded) or not values or not all(_is_number(v) for v in values):
                continue
            if not _close(sum(values) / len(values), recorded):
                return f"its {metric},{flt} of {task} is {recorded}, but its samples give {sum(values) / len(values)}"
    return None


def _size(name: str, results: dict) -> int:
    below = results.get("group_subtasks", {}).get(name)
    if below:
        return sum(_size(child, results) for child in below)
    counted = results.get("n-samples", {}).get(name, {}).get("effective")
    return counted if isinstance(counted, int) else 0


def _group_problem(results: dict) -> str | None:
    """A group's score that is neither the size-weighted nor the plain mean of its tasks' scores."""
    scores = results.get("results", {})
    for group, below in (results.get("group_subtasks") or {}).items():
        for key, recorded in scores.get(group, {}).items():
            parts = [scores.get(child, {}).get(key) for child in below or []]
            if "," not in key or "_stderr" in key or not _is_number(recorded) or not parts \
                    or not all(_is_number(p) for p in parts):  # scores only ("metric,filter"), not sample_len
                continue
            sizes = [_size(child, results) for child in below]
            weighted = sum(p * n for p, n in zip(parts, sizes)) / sum(sizes) if sum(sizes) else math.nan
            if not (_close(weighted, recorded) or _close(sum(parts) / len(parts), recorded)):
                return f"its {key} of group {group} is {recorded}, but its tasks give {weighted}"
    return None


def _samples_problem(row_dir: Path, results_path: Path, results: dict) -> str | None:
    """Every task with samples in one results file (its task_hashes) must have its file beside it,
    samples_<task>_<the same date>.jsonl, holding the very examples that hash records, whose values
    give the file's scores."""
    date = results_date(results_path)
    hashes = results.get("task_hashes")
    for task, recorded in (hashes if isinstance(hashes, dict) else {}).items():
        path = samples_file(row_dir, task, date)
        if problem := _file_problem(path):
            return problem
        samples = parse_json(path)
        if _samples_hash(samples) != recorded:
            return f"{path.name} does not hold the examples {results_path.name} records"
        if not all(isinstance(s, dict) for s in samples):
            return f"{path.name} does not parse (a line is not a JSON object)"
        if problem := _doc_problem(samples, task, results) or _score_problem(samples, task, results):
            return f"{path.name} does not give {results_path.name}: {problem}"
    if problem := _group_problem(results):
        return f"{results_path.name}: {problem}"
    return None


def damage(row_dir: Path, groups: list[str]) -> str | None:
    """Why a finished row cannot be kept, or None. Every file it must have is checked: timing.json,
    a results_*.json naming each of the run's task groups (one per distinct limit), and for every
    task with samples in each results file, its samples file holding the examples recorded there and
    giving the scores recorded there."""
    if problem := _file_problem(row_dir / TIMING):
        return problem
    found: dict[Path, dict] = {}
    for path in results_files(row_dir):
        if problem := _file_problem(path):
            return problem
        found[path] = parse_json(path)
    evaluated = {group for results in found.values()
                 if isinstance(subtasks := results.get("group_subtasks"), dict) for group in subtasks}
    if missing := [group for group in groups if group not in evaluated]:
        return f"no {RESULTS_GLOB} for its task group {missing[0]}"
    return next((problem for path, results in found.items() if (problem := _samples_problem(row_dir, path, results))),
                None)
