"""Recipes: YAML files naming members, a method and its hyper-parameters, tasks and shots; and the
plan of a recipe (its rows and benchmarks). The schema and the plan are recipe/schema.py, the error lines
recipe/lines.py; this module reads a recipe and reports every mistake at once (schema, methods, tasks,
placement, plan); the rest of the package imports them from the recipe package (recipe/__init__.py).

Every bad field becomes one ``UserError`` line: ``<file>: <field>: <what is allowed>``.
"""

from __future__ import annotations

import copy
import functools
import operator
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ensemble_bench.errors import UserError, several
from ensemble_bench.recipe.lines import failed_fields, field_path, problems_of, pydantic_lines
from ensemble_bench.recipe.member_schema import check_placement
from ensemble_bench.recipe.overrides import Override, blame
from ensemble_bench.recipe.overrides import apply as apply_overrides
from ensemble_bench.recipe.schema import Recipe, TaskSpec, plan_rows, validate_method
from ensemble_bench.tasks import get_benchmark, is_builtin
from ensemble_bench.yaml_limits import MAX_RECIPE_BYTES, RecipeLimit, RecipeLoader


def _method_problems(recipe: Recipe, source: str) -> list[str]:
    """A line per method entry (and sweep point) whose parameters or members do not fit the method."""
    lines = []
    for i, spec in enumerate(recipe.ensembles):
        field = f"methods[{i}]" if recipe.methods is not None else "method"
        lines += problems_of(partial(validate_method, recipe, spec, source, field))
        for point in recipe.sweep_points() if recipe.sweep else []:
            lines += problems_of(partial(validate_method, recipe, spec, f"{source}: sweep {point}", field, point))
    return lines


def parse_recipe(data: Any, source: str = "recipe") -> Recipe:
    """Validate a recipe mapping: its schema, method parameters, benchmarks and plan. Nothing of the
    machine is read (model files, packages, devices, the network: ``preflight.preflight`` checks those),
    so a stored run parses on any machine. Every mistake is reported at once: one UserError of one
    line each (``errors.several``)."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: a recipe must be a YAML mapping, got {type(data).__name__}")
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as err:
        lines = [*pydantic_lines(source, err, model=Recipe), *_problems_beside(data, err, source)]
        raise several(UserError, list(dict.fromkeys(lines))) from None
    lines = [*_method_problems(recipe, source), *task_problems(recipe, source),
             *check_placement(recipe, source)]
    # the rows, planned once here with the parameters just validated (their labels alone otherwise)
    lines += problems_of(lambda: recipe.plan if not lines else plan_rows(recipe, with_params=False), f"{source}: ")
    if lines:
        raise several(UserError, list(dict.fromkeys(lines)))
    return recipe


# what the method checks read of a member (its label, its weight): a member that failed in one of these has
# its methods checked on no guess
MEMBER_IDENTITY = ("model", "name", "weight")


def _problems_beside(data: dict, err: ValidationError, source: str) -> list[str]:
    """The method, task and placement problems of a recipe whose schema failed elsewhere, so that every
    mistake is reported at once (a member's dtype, a method's threshold and a task's limit: three lines).
    Each failing field is left out (a top-level field, a field of a member, a task or the placement: its
    default then holds) and the rest validated again; a line about a field left out is not repeated.
    Nothing when the members' list, a member's model, name or weight, the method entries or the sweep
    failed, or the rest does not validate (a required field failed): the methods cannot be read without
    them."""
    fields = failed_fields(err)
    if not all(_can_leave_out(data, field) for field in fields):
        return []
    rest = copy.deepcopy(data)
    for *parents, key in fields:
        functools.reduce(operator.getitem, parents, rest).pop(key, None)
    try:
        recipe = Recipe.model_validate(rest)
    except ValidationError:
        return []
    left_out = tuple(f"{source}: {field_path(field)}" for field in fields)
    lines = [*_method_problems(recipe, source), *task_problems(recipe, source), *check_placement(recipe, source)]
    return [line for line in lines if not line.startswith(left_out)]


def _can_leave_out(data: dict, field: tuple) -> bool:
    """Whether a failing field (pydantic's location) is a key given in the recipe whose absence leaves its
    methods readable as written (see ``_problems_beside``)."""
    node = data
    for part in field[:-1]:
        if not (isinstance(node, dict) and part in node or isinstance(node, list) and isinstance(part, int)
                and 0 <= part < len(node)):
            return False
        node = node[part]
    if not (isinstance(node, dict) and field and field[-1] in node) or field[0] in ("method", "methods", "sweep"):
        return False
    return field[0] != "members" or len(field) > 2 and field[2] not in MEMBER_IDENTITY


def _builtin_problems(recipe: Recipe, i: int, task: TaskSpec) -> list[str]:
    """What is wrong with a task that names a built-in benchmark (``tasks[i].field: message`` lines)."""
    try:
        bench = get_benchmark(task.name, task.variant)
    except UserError as err:
        return [f"tasks[{i}].{'name' if task.variant is None else 'variant'}: {err}"]
    lines = []
    if bench.runs_code and not recipe.allow_code_execution:
        lines.append(f"tasks[{i}].name: benchmark '{task.name}' runs the generated programs: set "
                     "allow_code_execution: true (each runs in a subprocess with time and memory limits)")
    shots, most = bench.default_shots if task.shots is None else task.shots, bench.max_shots(recipe.data)
    if most is not None and shots > most:
        lines.append(f"tasks[{i}].shots: at most {most} for '{task.name}' with data: {recipe.data} "
                     f"(its few-shot pool), got {shots}")
    if bench.pass_k is not None and task.repeats is not None and task.repeats < bench.pass_k:
        lines.append(f"tasks[{i}].repeats: benchmark '{task.name}' ({bench.variant}) reports pass@{bench.pass_k} from "
                     f"its samples: give at least {bench.pass_k} repeats, got {task.repeats}")
    if task.gen_kwargs is not None and bench.primary_metric.startswith("acc,"):
        lines.append(f"tasks[{i}].gen_kwargs: benchmark '{task.name}' is scored by log-likelihood and generates "
                     "no text: remove gen_kwargs")
    return lines


def task_problems(recipe: Recipe, source: str = "recipe") -> list[str]:
    """Every problem of the recipe's tasks, one ``<source>: tasks[i].<field>: <message>`` line each, read
    from the recipe alone. A name that is not built in is taken as an lm-eval task or group: the preflight
    looks it up (``tasks.recipe_tasks.task_preflight``), since indexing lm-eval's tasks takes seconds."""
    lines: list[str] = []
    listed: dict[str, int] = {}  # the lm-eval task or group -> the first task naming it
    for i, task in enumerate(recipe.tasks):
        if is_builtin(task.name):
            lines += _builtin_problems(recipe, i, task)
            key = get_benchmark(task.name).name  # arc_challenge is arc_c; mmlu's two variants share one name
        elif task.variant is not None:
            lines.append(f"tasks[{i}].variant: only built-in benchmarks have variants; '{task.name}' is an lm-eval "
                         "task or group as named")
            key = task.name
        else:
            key = task.name
        if key in listed:  # results and tables hold one score per benchmark
            lines.append(f"tasks[{i}].name: benchmark '{task.name}' is listed already (tasks[{listed[key]}]): list "
                         "each benchmark once (another variant: a recipe of its own)")
        listed.setdefault(key, i)
    return [f"{source}: {line}" for line in lines]


def _read_text(path: Path) -> str:
    """The recipe file as text; UserError if it cannot be read, is too large or is not UTF-8."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_RECIPE_BYTES + 1)  # never more: the path may be /dev/zero
    except OSError as err:
        raise UserError(f"{path}: cannot read recipe: {err.strerror or err}") from None
    if len(data) > MAX_RECIPE_BYTES:
        raise UserError(f"{path}: larger than {MAX_RECIPE_BYTES} bytes (1 MiB), the most a recipe may have")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}): "
                        "save the recipe as UTF-8") from None


def load_recipe(path: str | Path, overrides: list[Override] | None = None) -> Recipe:
    """The recipe in the YAML file ``path``, with command-line ``overrides`` applied before it is
    validated (a line about a field an override set names the override)."""
    path = Path(path)
    data = apply_overrides(_read_yaml(path), overrides or [])
    try:
        return parse_recipe(data, str(path))
    except UserError as err:
        raise blame(err, str(path), overrides or []) from None


def _read_yaml(path: Path) -> Any:
    text = _read_text(path)
    try:
        data = yaml.load(text, Loader=RecipeLoader)  # noqa: S506 - a SafeLoader
    except RecipeLimit as err:
        raise UserError(f"{path}: line {err.problem_mark.line + 1}: {err.problem}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise UserError(f"{path}: not valid YAML{where}: {getattr(err, 'problem', None) or err}") from None
    except ValueError as err:  # a value YAML reads but Python cannot hold (an int of 5000 digits, 2024-13-01)
        raise UserError(f"{path}: not valid YAML: {err}") from None
    return data
