"""Any lm-eval task or group in a recipe, beside the built-in benchmarks.

A recipe task whose name is not a built-in benchmark is looked up in lm-eval's task index: its
stock tasks (about 15,000 YAML files, indexed once per process: :func:`stock_index`, ~6-12 s on 2
cores) with the recipe's ``include_path`` folders over them, as lm-eval's ``--include_path`` does.
Such a task runs on its own data (its ``dataset_path``: the hub, lm-eval's datasets cache or local
files); only built-in benchmarks have packaged offline copies.

Scores are read back from lm-eval's results files (:func:`benchmark_from_results`), never from the
index, so a finished run reads on a machine without the task's YAML folder.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ensemble_bench.errors import UserError
from ensemble_bench.tasks import DEFAULT_VARIANT, LM_EVAL_NAMES, REGISTRY, Benchmark, get_benchmark, is_builtin

if TYPE_CHECKING:
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import Entry

# lm-eval's metric of a task whose config lists none (lm_eval.api.registry.DEFAULT_METRIC_REGISTRY, first of each)
DEFAULT_METRICS = {"loglikelihood": "perplexity", "loglikelihood_rolling": "word_perplexity",
                   "multiple_choice": "acc", "generate_until": "exact_match"}
MAX_GROUP_DEPTH = 16  # nesting of groups inside groups (lm-eval's deepest is about 4)


@functools.cache
def stock_index() -> dict[str, Entry]:
    """lm-eval's own tasks, groups and tags by name: indexed once per process (seconds)."""
    import lm_eval.tasks
    from lm_eval.tasks._index import TaskIndex

    return TaskIndex.build([Path(lm_eval.tasks.__file__).parent])


def task_index(folders: Sequence[Path] = ()) -> dict[str, Entry]:
    """The stock index with the tasks of ``folders`` over it (a later folder wins, as in lm-eval)."""
    from lm_eval.tasks._index import TaskIndex

    return {**stock_index(), **TaskIndex.build([Path(folder) for folder in folders])}


def task_manager(folders: Sequence[Path] = ()) -> TaskManager:
    """An lm-eval TaskManager over :func:`task_index` (the stock tasks are not indexed again)."""
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_defaults=False)
    manager.task_index.update(task_index(folders))
    return manager


def find_entry(name: str, index: dict[str, Entry]) -> Entry:
    """The index entry of task or group ``name``; UserError naming close matches if there is none."""
    from lm_eval.tasks._index import Kind

    entry = index.get(name)
    if entry is None:
        close = difflib.get_close_matches(name, [*REGISTRY, *LM_EVAL_NAMES, *index], n=4, cutoff=0.75)
        hint = f" (close: {', '.join(close)})" if close else " (lm-eval lists them: lm-eval ls tasks)"
        raise UserError(f"unknown task {name!r}: not a built-in benchmark, nor an lm-eval task or group here"
                        f"{hint}; a task of your own: its folder in include_path")
    if entry.kind is Kind.TAG:
        raise UserError(f"{name!r} is an lm-eval tag (a set of tasks with no common score): name a group or "
                        "list its tasks one by one")
    return entry


def _members(cfg: dict) -> Iterator[tuple[str | None, dict]]:
    """(name, overrides) of each member of a group config's task list."""
    for item in cfg.get("task") or []:
        if isinstance(item, str):
            yield item, {}
        elif isinstance(item, dict):
            yield item.get("task", item.get("group")), {k: v for k, v in item.items() if k not in ("task", "group")}


def leaf_configs(entry: Entry, index: dict[str, Entry], above: dict | None = None, depth: int = 0) -> Iterator[dict]:
    """The config of every task below ``entry`` as lm-eval builds it: the task's own keys, overridden
    by the keys its groups set for their members (tags expanded; inline tasks as written)."""
    from lm_eval.tasks._factory import GROUP_FIELD_NAMES
    from lm_eval.tasks._index import Kind

    above = above or {}
    cfg = entry.cfg or {}
    if depth > MAX_GROUP_DEPTH:
        raise UserError(f"group {entry.name!r} nests deeper than {MAX_GROUP_DEPTH} groups")
    if entry.kind is Kind.TAG:
        for name in sorted(entry.tags):
            if name in index:
                yield from leaf_configs(index[name], index, above, depth + 1)
    elif entry.kind is Kind.GROUP:
        own = {k: v for k, v in cfg.items() if k not in GROUP_FIELD_NAMES}
        for name, overrides in _members(cfg):
            here = {**own, **above, **overrides}
            child = index.get(name) if name else None
            yield from leaf_configs(child, index, here, depth + 1) if child is not None else [here]
    else:
        yield {**cfg, **above}


def _task_metric(cfg: dict) -> str | None:
    """``<metric>,<filter>`` of a task config: its first metric under its first filter."""
    metrics = cfg.get("metric_list") or [{"metric": DEFAULT_METRICS.get(cfg.get("output_type", "generate_until"))}]
    filters = cfg.get("filter_list")
    metric = metrics[0].get("metric") if isinstance(metrics[0], dict) else None
    name = filters[0].get("name", "none") if isinstance(filters, list) and filters and isinstance(filters[0], dict) \
        else "none"
    return f"{metric},{name}" if isinstance(metric, str) and not metric.startswith("!") else None


def _aggregate_metric(cfg: dict) -> str | None:
    """``<metric>,<filter>`` of a group's first aggregate, or None when it aggregates nothing."""
    found = cfg.get("aggregate_metric_list")
    first = (found[0] if isinstance(found, list) and found else found) if found else None
    if not isinstance(first, dict) or not isinstance(first.get("metric"), str):
        return None
    filters = first.get("filter_list", "none")
    return f"{first['metric']},{filters if isinstance(filters, str) else (filters or ['none'])[0]}"


def primary_metric(entry: Entry, index: dict[str, Entry]) -> str | None:
    """The score of a task (its first metric) or group (its first aggregate; else its first task's metric,
    averaged over its tasks by size)."""
    from lm_eval.tasks._index import Kind

    if entry.kind is Kind.GROUP and (aggregate := _aggregate_metric(entry.cfg or {})):
        return aggregate
    return next((metric for cfg in leaf_configs(entry, index) if (metric := _task_metric(cfg))), None)


def lm_eval_benchmark(name: str, index: dict[str, Entry]) -> Benchmark:
    """A recipe task that is not built in, as a Benchmark: lm-eval's task or group ``name``."""
    from lm_eval.tasks._index import Kind

    entry = find_entry(name, index)
    shots = (entry.cfg or {}).get("num_fewshot")
    return Benchmark(name, DEFAULT_VARIANT, name, shots if isinstance(shots, int) else 0,
                     primary_metric(entry, index) or "", offline=False, is_group=entry.kind is Kind.GROUP,
                     builtin=False)


def generation_kwargs(entry: Entry, index: dict[str, Entry], given: dict[str, Any]) -> dict[str, Any]:
    """The ``generation_kwargs`` to write for a task or group: its tasks' own, updated with ``given`` as
    lm-eval's ``--gen_kwargs`` updates them. UserError when nothing below it generates text, or when
    its tasks generate with different settings (one group override cannot keep both)."""
    from lm_eval.defaults import default_gen_kwargs

    merged = []
    for cfg in leaf_configs(entry, index):
        if cfg.get("output_type", "generate_until") != "generate_until":
            continue
        own = cfg.get("generation_kwargs") or default_gen_kwargs(cfg.get("fewshot_delimiter", "\n\n"))
        merged.append({**own, **given})
    distinct = {json.dumps(kwargs, sort_keys=True, default=str): kwargs for kwargs in merged}
    if not distinct:
        raise UserError(f"{entry.name!r} generates no text (multiple choice or log-likelihood): gen_kwargs do not "
                        "apply; remove them")
    if len(distinct) > 1:
        raise UserError(f"the tasks of group {entry.name!r} generate with different settings: give gen_kwargs to "
                        "its tasks, listed one by one")
    return next(iter(distinct.values()))


def _result_metric(results: dict, name: str) -> str | None:
    """The primary metric of task or group ``name`` in one lm-eval results file."""
    config = results.get("configs", {}).get(name)
    if isinstance(config, dict):
        return _task_metric(config)
    scores = results.get("results", {}).get(name, {})
    aggregate = next((key for key, value in scores.items() if "," in key and "_stderr," not in key
                      and isinstance(value, (int, float))), None)
    if aggregate is not None:
        return aggregate
    leaves = results.get("group_subtasks", {}).get(name) or []
    return next((metric for leaf in leaves if (metric := _result_metric(results, leaf))), None)


def benchmark_from_results(name: str, variant: str | None, results: Sequence[dict]) -> Benchmark:
    """A recipe task as a Benchmark when reading a run: a built-in one from the registry; any other with
    the metric its lm-eval results files record (no task index, no YAML folder needed)."""
    if is_builtin(name):
        return get_benchmark(name, variant)
    metric = next((found for one in results if (found := _result_metric(one, name))), "")
    is_group = any(one.get("group_subtasks", {}).get(name) for one in results)
    return Benchmark(name, DEFAULT_VARIANT, name, 0, metric, offline=False, is_group=is_group, builtin=False)


__all__ = ["benchmark_from_results", "find_entry", "generation_kwargs", "leaf_configs", "lm_eval_benchmark",
           "primary_metric", "stock_index", "task_index", "task_manager"]


# --- a recipe's tasks (the recipe is read by attribute: this package does not import ensemble_bench.recipe) ---
def _as_list(value: str | list[str] | None) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def _named_folders(recipe) -> list[tuple[str, str]]:
    """(field, folder as written) of every include_path: the recipe's, then each task's."""
    named = [("include_path", folder) for folder in _as_list(recipe.include_path)]
    return named + [(f"tasks[{i}].include_path", folder) for i, task in enumerate(recipe.tasks)
                    for folder in _as_list(task.include_path)]


def include_folders(recipe) -> list[Path]:
    """The recipe's include_path folders with ``~`` and ``$VARS`` expanded (settings.expand_path),
    recipe level first; UserError (one line each) for one that is not a folder."""
    from ensemble_bench import settings
    from ensemble_bench.errors import lines_of, several

    folders, lines = [], []
    for field, written in _named_folders(recipe):
        try:
            folder = settings.expand_path(written, f"{field}: '{written}'")
        except UserError as err:
            lines += lines_of(err)
            continue
        if not folder.is_dir():
            lines.append(f"{field}: '{written}' is not a folder: name a folder of lm-eval task YAML files")
        elif folder not in folders:
            folders.append(folder)
    if lines:
        raise several(UserError, lines)
    return folders


def task_benchmarks(recipe, index: dict[str, Entry] | None = None) -> list[Benchmark]:
    """The Benchmark of every recipe task; a task that is not built in is looked up in lm-eval's task
    index (``index``, else the stock one with the recipe's include_path folders: seconds, once a process).
    One that cannot be found is given as named, with no metric: :func:`task_preflight` says why."""
    if index is None and not all(is_builtin(task.name) for task in recipe.tasks):
        try:
            index = task_index(include_folders(recipe))
        except UserError:  # a folder that is not there: task_preflight names it
            index = stock_index()
    return [get_benchmark(task.name, task.variant) if is_builtin(task.name) else _as_found(task.name, index)
            for task in recipe.tasks]


def _as_found(name: str, index: dict[str, Entry]) -> Benchmark:
    try:
        return lm_eval_benchmark(name, index)
    except UserError:
        return Benchmark(name, DEFAULT_VARIANT, name, 0, "", offline=False, builtin=False)


def _task_lines(recipe, index: dict[str, Entry]) -> list[str]:
    """A line per task that is not built in and that lm-eval's index cannot run as written: an unknown
    name, gen_kwargs that do not apply."""
    lines = []
    for i, task in enumerate(recipe.tasks):
        if is_builtin(task.name):
            continue
        try:
            entry = find_entry(task.name, index)
        except UserError as err:
            lines.append(f"tasks[{i}].name: {err}")
            continue
        if task.gen_kwargs is not None:
            try:
                generation_kwargs(entry, index, task.gen_kwargs.given())
            except UserError as err:
                lines.append(f"tasks[{i}].gen_kwargs: {err}")
    return lines


def task_preflight(recipe) -> list[str]:
    """What stops the recipe's tasks on this machine, one line each: an include_path that is not a folder,
    a name that is neither built in nor an lm-eval task or group here (close matches named), gen_kwargs
    that do not apply. Indexes lm-eval's tasks only when a task is not built in."""
    from ensemble_bench.errors import lines_of

    try:
        folders = include_folders(recipe)
    except UserError as err:
        return list(lines_of(err))
    if all(is_builtin(task.name) for task in recipe.tasks):
        return []
    return _task_lines(recipe, task_index(folders))


def generation_overrides(recipe, benches: Sequence[Benchmark], index: dict[str, Entry]) -> dict[str, dict[str, Any]]:
    """lm-eval task name -> ``{"generation_kwargs": ...}`` for every recipe task with gen_kwargs (``benches``:
    the recipe's tasks as Benchmarks; ``index``: the run's, its generated task folder included)."""
    from ensemble_bench.errors import several

    found, lines = {}, []
    for i, (task, bench) in enumerate(zip(recipe.tasks, benches)):
        if task.gen_kwargs is None:
            continue
        try:
            found[bench.task] = {"generation_kwargs": generation_kwargs(find_entry(bench.task, index), index,
                                                                        task.gen_kwargs.given())}
        except UserError as err:
            lines.append(f"tasks[{i}].gen_kwargs: {err}")
    if lines:
        raise several(UserError, lines)
    return found


__all__ += ["generation_overrides", "include_folders", "task_benchmarks", "task_preflight"]
