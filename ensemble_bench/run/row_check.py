"""Whether a finished row's folder can be kept or reused: every file there, and its scores true.

A row proves itself from its own files, before a resumed run keeps it and before another run reuses
it (``damage``): timing.json and a results_*.json per task group must parse; each task with samples
must have its samples file, holding the very examples its results file records (lm-eval's
``task_hashes``: a results file must record one for every task it scores), each example's document
matching its ``doc_hash`` and one example per document evaluated (``n-samples``) and per filter;
every example must count toward a score of its task (its ``filter`` names one: lm-eval logs one
example per document and filter, and scores each ``metric,filter``); and every score aggregated by
mean must be the mean of its samples' values (within float rounding), every group's score the mean
of its tasks' (by size, or plain), every group's tasks present and every group score one that some
task under it has. A hand-edited score, a samples file from another run, or a truncated file is
therefore never reused, nor one whose samples were renamed out of the check, whose task hashes were
removed, or whose task was deleted from the results file under an edited group score.
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
    """An example whose document is not the one its doc_hash records, a count of documents other
    than the one the results file says were evaluated, or a filter without one example per document."""
    for sample in samples:
        if "doc" in sample and _sha256(json.dumps(sample["doc"], indent=2, ensure_ascii=False)) != sample["doc_hash"]:
            return f"example {sample.get('doc_id')}'s document is not the one its doc_hash records"
    counted = _part(_part(results, "n-samples"), task).get("effective")
    documents = {_key(sample.get("doc_id")) for sample in samples}
    if isinstance(counted, int) and len(documents) != counted:
        return f"it holds {len(documents)} documents where {counted} were evaluated"
    for flt in dict.fromkeys(_filter(s) for s in samples):
        mine = [_key(s.get("doc_id")) for s in samples if _filter(s) == flt]
        if len(mine) != len(documents) or set(mine) != documents:
            return f"its filter {flt!r} has {len(mine)} examples of {len(documents)} documents, not one each"
    return None


def _part(mapping: dict, name: str) -> dict:
    """``mapping[name]`` when it is a JSON object, else empty (a damaged file is judged, not trusted)."""
    value = mapping.get(name)
    return value if isinstance(value, dict) else {}


def _key(value: Any) -> Any:
    """A value of a samples line as a set member (a list or object written where a name belongs: its JSON)."""
    return value if isinstance(value, (str, int, float, type(None))) else json.dumps(value, sort_keys=True)


def _filter(sample: dict) -> Any:
    return _key(sample.get("filter", "none"))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_value(value: Any) -> bool:
    """A sample's value of a metric that lm-eval can average: a finite number or a bool."""
    return isinstance(value, bool) or _is_number(value)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= TOLERANCE * max(1.0, abs(a), abs(b))


def _unscored_problem(samples: list[dict], task: str, results: dict) -> str | None:
    """An example that counts toward no score of ``task``: its filter names no ``metric,filter`` of
    the results file (lm-eval scores every metric of every filter it logs examples for)."""
    scored = {key.split(",", 1)[1] for key in _part(_part(results, "results"), task) if "," in key}
    for sample in samples:
        if _filter(sample) not in scored:
            return (f"example {sample.get('doc_id')}'s filter {_filter(sample)!r} names no score of {task}"
                    + (f" (its scores have filters {', '.join(map(repr, sorted(scored)))})" if scored else ""))
    return None


def _averaged(metric: str, config: dict) -> bool:
    """Whether lm-eval aggregates ``metric`` by mean: as the task's metric_list says, else by the
    metric's registered aggregation; a metric with neither is averaged (lm-eval's fallback)."""
    listed = config.get("metric_list")
    for entry in listed if isinstance(listed, list) else []:
        if isinstance(entry, dict) and entry.get("metric") == metric:
            return entry.get("aggregation", "mean") == "mean"
    from lm_eval.api import metrics, registry

    registered = registry.metric_agg_registry.get(metric) if metric in registry.metric_agg_registry else None
    return registered is None or registered is metrics.mean


def _score_problem(samples: list[dict], task: str, results: dict) -> str | None:
    """A score of ``task`` aggregated by mean that is not a number, or not the mean of its samples'
    values (a document may lack a metric: lm-eval averages the ones that have it)."""
    config = _part(_part(results, "configs"), task)
    for key, recorded in _part(_part(results, "results"), task).items():
        metric, _, flt = key.partition(",")
        if not flt or metric.endswith("_stderr") or not _averaged(metric, config):
            continue
        values = [s[metric] for s in samples if _filter(s) == flt and metric in s]
        if not values:
            continue
        if not _is_number(recorded) or not all(_is_value(v) for v in values):
            return f"its {key} of {task} is {recorded!r}, its samples' values are not all numbers"
        if not _close(sum(values) / len(values), recorded):
            return f"its {key} of {task} is {recorded}, but its samples give {sum(values) / len(values)}"
    return None


def _children(group: str, results: dict) -> list[str]:
    below = _part(results, "group_subtasks").get(group)
    return [child for child in below if isinstance(child, str)] if isinstance(below, list) else []


def _size(name: str, results: dict) -> int:
    """A task's count of examples, or the sum of a group's tasks'."""
    if name in _part(results, "group_subtasks"):
        return sum(_size(leaf, results) for leaf in _leaves(name, results))
    counted = _part(_part(results, "n-samples"), name).get("effective")
    return counted if isinstance(counted, int) else 0


def _leaves(group: str, results: dict, seen: frozenset[str] = frozenset()) -> list[str]:
    """The tasks under a group, through its subgroups (what lm-eval aggregates a group's scores over);
    a group listed under itself (a damaged file) adds nothing."""
    groups, seen = _part(results, "group_subtasks"), seen | {group}
    return [leaf for child in _children(group, results) if child not in seen
            for leaf in (_leaves(child, results, seen) if child in groups else [child])]


def _group_problem(results: dict) -> str | None:
    """A group that lists a task or group without results, a score of it that none of its tasks has,
    or one that is neither the size-weighted nor the plain mean of its tasks' scores."""
    scores = _part(results, "results")
    for group in _part(results, "group_subtasks"):
        below = _children(group, results)
        if missing := [child for child in below if child not in scores]:
            return f"its group {group} lists {missing[0]}, which has no results"
        for key, recorded in _part(scores, group).items():
            if "," not in key or "_stderr" in key:  # scores only ("metric,filter"), not sample_len
                continue
            if not any(_is_number(_part(scores, leaf).get(key)) for leaf in _leaves(group, results)):
                return f"its {key} of group {group} is {recorded!r}, but none of its tasks has that score"
            if not _is_number(recorded):
                return f"its {key} of group {group} is {recorded!r}, not a number"
            parts = [_part(scores, child).get(key) for child in below]
            if not all(_is_number(p) for p in parts):  # lm-eval averages the tasks that have the score
                continue
            sizes = [_size(child, results) for child in below]
            weighted = sum(p * n for p, n in zip(parts, sizes)) / sum(sizes) if sum(sizes) else math.nan
            if not (_close(weighted, recorded) or _close(sum(parts) / len(parts), recorded)):
                return f"its {key} of group {group} is {recorded}, but its tasks give {weighted}"
    return None


def _scored_tasks(results: dict) -> set[str]:
    """The tasks (not groups) a results file scores: those with a config, a count of examples, or
    scores of their own."""
    groups = _part(results, "group_subtasks")
    return {task for part in ("configs", "n-samples", "results") for task in _part(results, part) if task not in groups}


def _hashes_problem(hashes: Any, results: dict) -> str | None:
    """A results file must record lm-eval's task_hashes, one for every task it scores (each proves
    that task's samples file)."""
    if not isinstance(hashes, dict):
        return "it records no task_hashes (the hash of each task's examples)"
    if missing := sorted(_scored_tasks(results) - set(hashes)):
        return f"it records no task hash for task {missing[0]}"
    return None


def _samples_problem(row_dir: Path, results_path: Path, results: dict) -> str | None:
    """Every task with samples in one results file (its task_hashes) must have its file beside it,
    samples_<task>_<the same date>.jsonl, holding the very examples that hash records, whose values
    give the file's scores."""
    date = results_date(results_path)
    hashes = results.get("task_hashes")
    if problem := _hashes_problem(hashes, results):
        return f"{results_path.name}: {problem}"
    for task, recorded in hashes.items():
        path = samples_file(row_dir, task, date)
        if problem := _file_problem(path):
            return problem
        samples = parse_json(path)
        if _samples_hash(samples) != recorded:
            return f"{path.name} does not hold the examples {results_path.name} records"
        if not all(isinstance(s, dict) for s in samples):
            return f"{path.name} does not parse (a line is not a JSON object)"
        if problem := (_doc_problem(samples, task, results) or _unscored_problem(samples, task, results)
                       or _score_problem(samples, task, results)):
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
