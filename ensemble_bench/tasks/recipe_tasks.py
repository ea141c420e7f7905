"""A recipe's tasks as lm-eval will run them, read from the recipe by attribute (this package does not
import ensemble_bench.recipe): its include_path folders (their task files checked before lm-eval's
index opens them), each task as a Benchmark, what stops the tasks on this machine (unknown names,
gen_kwargs that do not apply, hub data not cached while offline, task code without consent), and the
gen_kwargs to write. lm-eval's task index itself: tasks/lm_eval_tasks.py."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ensemble_bench import settings
from ensemble_bench.errors import UserError
from ensemble_bench.tasks import DEFAULT_VARIANT, Benchmark, get_benchmark, is_builtin
from ensemble_bench.tasks.lm_eval_tasks import (
    Found,
    entry_yamls,
    find_entry,
    generation_kwargs,
    leaf_configs,
    lm_eval_benchmark,
    task_index,
)
from ensemble_bench.tasks.task_code import TaskCode, task_code
from ensemble_bench.tasks.task_sources import LOCAL_BUILDERS, data_problems, task_file_problems


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
    lines += task_file_problems(folders)  # before lm-eval's index opens any of them
    if lines:
        raise several(UserError, lines)
    return folders


def task_index_of(recipe, folders: Sequence[Path]) -> dict[str, Found] | None:
    """lm-eval's task index with the recipe's include_path ``folders`` over it (seconds, once a process for
    the stock tasks), or None when every recipe task is built in (nothing to look up)."""
    return None if all(is_builtin(task.name) for task in recipe.tasks) else task_index(folders)


def task_benchmarks(recipe, index: dict[str, Found] | None) -> list[Benchmark]:
    """The Benchmark of every recipe task; a task that is not built in is looked up in lm-eval's task
    index (``index``: :func:`task_index_of`). One that cannot be found is given as named, with no metric:
    :func:`task_preflight` says why."""
    return [get_benchmark(task.name, task.variant) if is_builtin(task.name) else _as_found(task.name, index or {})
            for task in recipe.tasks]


def _as_found(name: str, index: dict[str, Found]) -> Benchmark:
    try:
        return lm_eval_benchmark(name, index)
    except UserError:
        return Benchmark(name, DEFAULT_VARIANT, name, 0, "", offline=False, builtin=False)


def _task_lines(recipe, index: dict[str, Found]) -> list[str]:
    """A line per task that is not built in and that lm-eval's index cannot run as written: an unknown
    name, gen_kwargs that do not apply, task code without consent, data that cannot be read."""
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
        lines += _task_code_lines(recipe, i, task_code(entry_yamls(entry, index)))
        lines += [f"tasks[{i}].name: '{task.name}' reads {line}" for line in task_data_problems(entry, index)]
        if missing := _uncached_hub_data(entry, index, packaged_ok=getattr(recipe, "data", None) == "offline"):
            lines.append(f"tasks[{i}].name: '{task.name}' reads {missing} from the hub, but {settings.hub_offline()} "
                         "is set and no copy is cached here: unset it to download, or run where it is cached")
    return lines


def _task_code_lines(recipe, i: int, found_code: tuple[list[TaskCode], list[str]]) -> list[str]:
    """A line per ``!function`` of task ``i`` naming a module found nowhere (or an include chain that cannot
    be followed), and, unless the recipe allows task code, a line per module the task would import and run
    (``found_code``: ``task_code.task_code`` of its YAML files)."""
    code, problems = found_code
    lines = [f"tasks[{i}].name: {line}" for line in problems]
    if not getattr(recipe, "allow_task_code", False):
        lines += [f"tasks[{i}].name: '{recipe.tasks[i].name}' imports and runs {found.shown()} ({found.origin()}), "
                  "unsandboxed: set allow_task_code: true (or --set allow_task_code=true) to run it" for found in code]
    return lines


def task_data_problems(entry: Found, index: dict[str, Found]) -> list[str]:
    """What would stop the data of every task below ``entry`` loading (``task_sources.data_problems``), once each."""
    return list(dict.fromkeys(line for cfg in leaf_configs(entry, index) for line in data_problems(cfg)))


def recipe_task_code(recipe, index: dict[str, Found] | None) -> list[TaskCode]:
    """The modules the recipe's tasks import through ``!function`` (and so run), installed code aside
    (``index``: :func:`task_index_of`)."""
    found: dict[Path, TaskCode] = {}
    for task in recipe.tasks:
        if index is not None and not is_builtin(task.name) and task.name in index:
            found.update((code.module, code) for code in task_code(entry_yamls(index[task.name], index))[0])
    return list(found.values())


def _uncached_hub_data(entry: Found, index: dict[str, Found], packaged_ok: bool = False) -> str | None:
    """The first hub dataset below ``entry`` that cannot be read here: the hub switched off and neither
    the datasets cache nor the hub cache holding it (None when the hub is on). ``packaged_ok``
    (``data: offline``): a dataset ensemble-bench packages is read from its local copy (tasks/stock_data.py)."""
    if not settings.hub_offline():
        return None
    import datasets.config
    import huggingface_hub.constants

    from ensemble_bench.tasks.data_store import packaged_copy_available

    for path in dict.fromkeys(cfg.get("dataset_path") for cfg in leaf_configs(entry, index)):
        if not isinstance(path, str) or path in LOCAL_BUILDERS or Path(path).expanduser().exists():
            continue
        if packaged_ok and packaged_copy_available(path):
            continue
        cached = (Path(datasets.config.HF_DATASETS_CACHE) / path.replace("/", "___"),
                  Path(huggingface_hub.constants.HF_HUB_CACHE) / f"datasets--{path.replace('/', '--')}")
        if not any(folder.exists() for folder in cached):
            return path
    return None


def task_preflight(recipe, index: dict[str, Found] | None) -> list[str]:
    """What stops the recipe's tasks on this machine, one line each: a name that is neither built in nor an
    lm-eval task or group here (close matches named), gen_kwargs that do not apply, task code without
    consent, a local data file that is missing or no regular file, a dataset script, a hub dataset not
    cached while the hub is off (an include_path that is not a folder: :func:`include_folders`).
    ``index``: :func:`task_index_of`."""
    return [] if index is None else _task_lines(recipe, index)


def generation_overrides(recipe, benches: Sequence[Benchmark], index: dict[str, Found]) -> dict[str, dict[str, Any]]:
    """lm-eval task name -> ``{"generation_kwargs": ..., "repeats": n}`` for every recipe task with gen_kwargs or
    repeats (``benches``: the recipe's tasks as Benchmarks; ``index``: the run's, its generated task folder
    included)."""
    from ensemble_bench.errors import several

    found, lines = {}, []
    for i, (task, bench) in enumerate(zip(recipe.tasks, benches)):
        if task.repeats is not None:
            found[bench.task] = {"repeats": task.repeats}
        if task.gen_kwargs is None:
            continue
        try:
            found.setdefault(bench.task, {})["generation_kwargs"] = generation_kwargs(
                find_entry(bench.task, index), index, task.gen_kwargs.given())
        except UserError as err:
            lines.append(f"tasks[{i}].gen_kwargs: {err}")
    if lines:
        raise several(UserError, lines)
    return found


__all__ = ["generation_overrides", "include_folders", "recipe_task_code", "task_benchmarks", "task_data_problems",
           "task_index_of", "task_preflight"]
