"""Recipes: YAML files naming members, a method and its hyper-parameters, tasks and shots.

Every bad field becomes one ``UserError`` line: ``<file>: <field>: <what is allowed>``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ensemble_bench.errors import UserError
from ensemble_bench.members.sources import check_spec
from ensemble_bench.methods import get_method
from ensemble_bench.tasks import get_benchmark

STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)


class MemberSpec(BaseModel):
    model_config = STRICT
    model: str = Field(min_length=1)
    name: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:\d+)?|mps)$")
    chat_template: bool = True
    weight: float | None = Field(default=None, gt=0)

    @property
    def label(self) -> str:
        return self.name or self.model.rstrip("/").split("/")[-1].removesuffix(".gguf")


class MethodSpec(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    name: str = Field(min_length=1)

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class TaskSpec(BaseModel):
    model_config = STRICT
    name: str = Field(min_length=1)
    variant: str | None = None
    shots: int | None = Field(default=None, ge=0)
    limit: int | None = Field(default=None, gt=0)


class Recipe(BaseModel):
    model_config = STRICT
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    members: list[MemberSpec] = Field(min_length=1)
    method: MethodSpec
    singles: bool = False
    tasks: list[TaskSpec] = Field(min_length=1)
    limit: int | None = Field(default=None, gt=0)
    batch_size: int = Field(default=1, gt=0)
    seed: int = 1234
    output: str = "results"
    data: Literal["hub", "offline"] = "hub"
    fewshot_as_multiturn: bool = False
    allow_code_execution: bool = False  # MBPP / HumanEval run generated programs (sandboxed subprocesses)
    sweep: dict[str, list[Any]] | None = None  # one method parameter -> values: one ensemble row each

    @field_validator("sweep")
    @classmethod
    def _one_parameter(cls, value):
        if value is not None and (len(value) != 1 or not next(iter(value.values()))):
            raise ValueError("sweep names exactly one method parameter with a non-empty list of values")
        return value

    def sweep_points(self) -> list[dict[str, Any]]:
        """The method-parameter overrides of each ensemble row ([{}] without a sweep)."""
        if not self.sweep:
            return [{}]
        (name, values), = self.sweep.items()
        return [{name: value} for value in values]

    @field_validator("method", mode="before")
    @classmethod
    def _method_as_name(cls, value):
        return {"name": value} if isinstance(value, str) else value

    @field_validator("tasks", mode="before")
    @classmethod
    def _task_as_name(cls, value):
        if isinstance(value, list):
            return [{"name": t} if isinstance(t, str) else t for t in value]
        return value

    @model_validator(mode="after")
    def _labels_unique(self):
        labels = [m.label for m in self.members]
        if len(set(labels)) != len(labels):
            raise ValueError(f"member names must be unique (got {labels}); set 'name' on each member")
        return self

    def task_limit(self, task: TaskSpec) -> int | None:
        return task.limit if task.limit is not None else self.limit

    def fingerprint(self) -> str:
        """Hash of everything that changes results (not the output folder)."""
        content = self.model_dump(exclude={"output", "description"})
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:12]


def _field_path(loc, prefix: str = "") -> str:
    path = prefix
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "recipe"


def _pydantic_line(source: str, err: ValidationError, prefix: str = "") -> str:
    first = err.errors()[0]
    loc = [p for p in first["loc"] if not (isinstance(p, str) and ("[" in p or p.startswith("function-")))]
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown field"
    given = first.get("input")
    shown = "" if first["type"] in ("missing", "extra_forbidden") or isinstance(given, (dict, list)) else f" (got {given!r})"
    return f"{source}: {_field_path(loc, prefix)}: {message}{shown}"


def parse_recipe(data: Any, source: str = "recipe") -> Recipe:
    """Validate a recipe mapping, including method parameters, benchmarks and model strings."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: a recipe must be a YAML mapping, got {type(data).__name__}")
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as err:
        raise UserError(_pydantic_line(source, err)) from None
    validate_method(recipe, source)
    for point in recipe.sweep_points() if recipe.sweep else []:
        validate_method(recipe, f"{source}: sweep {point}", point)
    for i, task in enumerate(recipe.tasks):
        try:
            bench = get_benchmark(task.name, task.variant)
        except UserError as err:
            raise UserError(f"{source}: tasks[{i}].name: {err}") from None
        if bench.runs_code and not recipe.allow_code_execution:
            raise UserError(f"{source}: tasks[{i}].name: benchmark '{task.name}' runs the generated programs: set "
                            "allow_code_execution: true (each runs in a subprocess with time and memory limits)")
    for i, member in enumerate(recipe.members):
        try:
            check_spec(member.model)
        except UserError as err:
            raise UserError(f"{source}: members[{i}].model: {err}") from None
    return recipe


def validate_method(recipe: Recipe, source: str, overrides: dict[str, Any] | None = None):
    try:
        method = get_method(recipe.method.name)
    except UserError as err:
        raise UserError(f"{source}: method.name: {err}") from None
    given = {**recipe.method.params, **(overrides or {})}
    if "weights" in method.Params.model_fields and "weights" not in given and any(
            m.weight is not None for m in recipe.members):
        given = {**given, "weights": [m.weight if m.weight is not None else 1.0 for m in recipe.members]}
    try:
        params = method.Params.model_validate(given)
    except ValidationError as err:
        raise UserError(_pydantic_line(source, err, prefix="method")) from None
    try:
        method.check_members(params, [m.label for m in recipe.members])
    except UserError as err:
        raise UserError(f"{source}: {err}") from None
    count = len(recipe.members)
    if method.name != "single" and (count < method.min_members or
                                    (method.max_members is not None and count > method.max_members)):
        raise UserError(f"{source}: members: method '{method.name}' takes {method.min_members}"
                        f"{'+' if method.max_members is None else f'-{method.max_members}'} members, got {count}")
    return method, params


def load_recipe(path: str | Path) -> Recipe:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise UserError(f"{path}: cannot read recipe: {err.strerror or err}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise UserError(f"{path}: not valid YAML{where}: {getattr(err, 'problem', None) or err}") from None
    return parse_recipe(data, str(path))
