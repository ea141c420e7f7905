"""What the plan says about sampling, before any model loads: which recipe tasks sample (their own
``generation_kwargs``, the recipe's ``gen_kwargs``, a ``sampling:`` override over them), with how many
repeats; and, one line per row, a row whose method cannot sample (or decodes speculatively) while a task
asks it to: the dry run refuses it, so that no task is decoded greedily while its results say it sampled.

A built-in benchmark's own settings are its template's (MBPP's pass_at_k variant samples), else greedy;
any other task is read from lm-eval's task index."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ensemble_bench.decoding.request_sampling import SamplingPolicy, row_policy
from ensemble_bench.decoding.sampling_params import SamplingParams
from ensemble_bench.errors import UserError
from ensemble_bench.methods import method_spec
from ensemble_bench.tasks import get_benchmark, is_builtin
from ensemble_bench.tasks.lm_eval_tasks import Found


@dataclass(frozen=True)
class TaskSettings:
    """One generating task below a recipe task: its generation settings as lm-eval will read them and
    its ``repeats``."""

    task: int  # the recipe task's index
    name: str
    gen_kwargs: dict[str, Any]
    repeats: int = 1
    takes: tuple[str, int] | None = None  # a filter that reads the first k samples of a request: (its name, k)


def task_settings(recipe, index: Mapping[str, Found] | None) -> list[TaskSettings]:
    """The settings of every generating task the recipe runs (an lm-eval group: each of its tasks).
    ``index``: lm-eval's task index with the include_path folders (``recipe_tasks.task_index_of``; None when
    every task is built in). A task lm-eval cannot find here is left out: the preflight names it."""
    from ensemble_bench.tasks.lm_eval_tasks import find_entry, leaf_configs

    found = []
    for i, task in enumerate(recipe.tasks):
        given = task.gen_kwargs.given() if task.gen_kwargs else {}
        if is_builtin(task.name):
            own, repeats, takes = _builtin_settings(task)
            found.append(TaskSettings(i, task.name, {**own, **given}, task.repeats or repeats, takes))
            continue
        if index is None:
            continue
        try:
            leaves = list(leaf_configs(find_entry(task.name, index), index))
        except UserError:
            continue
        found += [TaskSettings(i, cfg.get("task") or task.name, {**(cfg.get("generation_kwargs") or {}), **given},
                               task.repeats or int(cfg.get("repeats") or 1), _first_k_filter(cfg))
                  for cfg in leaves if cfg.get("output_type", "generate_until") == "generate_until"]
    return found


def _first_k_filter(config: Mapping[str, Any]) -> tuple[str, int] | None:
    """The filter of a task config that reads the most samples per request through lm-eval's
    ``take_first_k`` (gsm8k_cot_self_consistency's maj@8): (its name, k); None without one."""
    taken = [(str(entry.get("name")), int(step["k"])) for entry in config.get("filter_list") or []
             if isinstance(entry, Mapping) for step in entry.get("filter") or []
             if isinstance(step, Mapping) and step.get("function") == "take_first_k" and "k" in step]
    return max(taken, key=lambda found: found[1], default=None)


def _builtin_settings(task) -> tuple[dict[str, Any], int, tuple[str, int] | None]:
    """A built-in benchmark's own generation settings and repeats: its template's (tasks/templates), else
    greedy and one (the stock tasks they name decode greedily: tests/tasks/test_task_sampling.py)."""
    from ensemble_bench.tasks.task_configs import template_path
    from ensemble_bench.tasks.task_sources import read_task_yaml

    path = template_path(get_benchmark(task.name, task.variant).task)
    config = read_task_yaml(path).config if path is not None else None
    if not isinstance(config, dict):
        return {}, 1, None
    return dict(config.get("generation_kwargs") or {}), int(config.get("repeats") or 1), _first_k_filter(config)


def _said(policy: SamplingPolicy, settings: TaskSettings) -> str | None:
    """How a task samples under a policy, in words; None when it decodes greedily."""
    params = policy.params(settings.gen_kwargs)
    if params.greedy:
        return None
    given = params.model_dump()
    shown = [f"temperature {params.temperature}"] + [f"{key} {given[key]}" for key in ("top_p", "top_k", "min_p")
                                                     if given[key] != SamplingParams.model_fields[key].default]
    repeats = [f"{settings.repeats} samples per request"] if settings.repeats > 1 else []
    return ", ".join([*shown, *repeats, f"seed {policy.seed}"])


def sampling_problems(recipe, index: Mapping[str, Found] | None) -> list[str]:
    """A line per task whose generation settings cannot be read (out of range) or whose repeats are fewer
    than one of its filters reads (lm-eval would stop at scoring, after every sample), and per row whose method
    decodes greedily only (or speculatively) while one of the recipe's tasks samples under the row's
    settings."""
    settings = task_settings(recipe, index)
    lines = []
    for found in settings:
        try:
            SamplingPolicy().params(found.gen_kwargs)
        except UserError as err:
            lines.append(f"tasks[{found.task}] '{found.name}': {err}")
        if found.takes is not None and found.repeats < found.takes[1]:
            name, k = found.takes
            lines.append(f"tasks[{found.task}] '{found.name}': its filter '{name}' reads the first {k} samples of "
                         f"each request, but repeats is {found.repeats}: set repeats to {k} or more")
    if lines:
        return lines
    for row in recipe.plan:
        method = method_spec(row.method)
        speculative = bool(getattr(row.params, "speculative", 0))
        if method.samples and not (speculative and method.speculative_sampling_problem(row.params)):
            continue
        policy = row_policy(recipe, row)
        asking = next((s for s in settings if _said(policy, s)), None)
        if asking is None:
            continue
        why = method.speculative_sampling_problem(row.params) if method.samples else "decodes greedily only"
        fix = "set speculative: 0" if method.samples else "use a method that samples (docs/sampling.md)"
        lines.append(f"row {row.label}: method '{row.method}' {why}, but tasks[{asking.task}] '{asking.name}' "
                     f"samples ({_said(policy, asking)}): {fix}, or give the entry sampling: {{do_sample: false}}")
    return lines


def sampling_notes(recipe, index: Mapping[str, Found] | None) -> list[str]:
    """Lines beside the plan: each task that samples (and how, under the recipe's own settings), each
    entry whose ``sampling:`` changes that, and a task whose repeats all decode greedily."""
    notes = []
    base = SamplingPolicy(recipe.seed, recipe.sampling)
    for settings in task_settings(recipe, index):
        said = _said(base, settings)
        where = f"tasks[{settings.task}] '{settings.name}'"
        if said is not None:
            notes.append(f"{where} samples: {said}")
        elif settings.repeats > 1:
            notes.append(f"{where} asks for {settings.repeats} repeats but decodes greedily: they are all the same "
                         "answer")
    for spec in recipe.ensembles:
        if spec.sampling is not None:
            notes.append(f"method {spec.label or spec.name}: sampling: {spec.sampling.model_dump(exclude_none=True)} "
                         "over the tasks' settings")
    return notes
