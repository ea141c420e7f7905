"""The recipe's schema (members, placement, method entries, tasks: strict pydantic models) and its plan:
the rows, each with its method's validated parameters (``plan_rows``, built once as ``Recipe.plan``),
and its benchmarks. Loading a YAML file and listing every mistake at once: recipe/load.py."""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from ensemble_bench.decoding.sampling_params import SamplingOverride
from ensemble_bench.errors import UserError, several
from ensemble_bench.members.backends import backend_spec
from ensemble_bench.methods import ALONE, is_alone, method_spec
from ensemble_bench.recipe.lines import LABEL, SAFE_NAME, is_safe_label, pydantic_lines
from ensemble_bench.recipe.member_schema import STRICT, MemberSpec, PlacementSpec
from ensemble_bench.tasks import Benchmark
from ensemble_bench.tasks.recipe_tasks import task_benchmarks

SEED_MAX = 2**32 - 1  # the largest seed numpy and lm-eval take
LIMIT_MAX = sys.maxsize  # lm-eval slices the documents with itertools.islice, which takes no larger stop


class MethodSpec(BaseModel):
    """One ensemble row: a method, its parameters (the other keys) and optionally a row label and
    the members it ensembles (by name; default all)."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    name: str = Field(min_length=1)
    label: str | None = Field(default=None, pattern=LABEL)
    members: list[str] | None = Field(default=None, min_length=1)
    paper_row: str | None = None  # the row of a paper's table this entry fills (`ensbench table --layout`)
    sampling: SamplingOverride | None = None  # over the tasks' settings and the recipe's sampling, for its rows

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


# a task or group name as lm-eval writes them (it names files after it): no path separators, no spaces
TASK_NAME = r"^[A-Za-z0-9][A-Za-z0-9._+:()=-]*$"
IncludePath = Annotated[str, Field(min_length=1)] | list[Annotated[str, Field(min_length=1)]] | None


class GenKwargs(BaseModel):
    """A task's generation settings, named as lm-eval's ``--gen_kwargs`` names them. They update the
    task's own ``generation_kwargs`` in the task config the run writes."""

    model_config = STRICT
    until: Annotated[str, Field(min_length=1)] | list[Annotated[str, Field(min_length=1)]] | None = None
    max_gen_toks: int | None = Field(default=None, gt=0)
    do_sample: bool | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)

    def given(self) -> dict[str, Any]:
        """The settings the recipe gives (lm-eval's names)."""
        return self.model_dump(exclude_none=True)


class TaskSpec(BaseModel):
    """A recipe task: a built-in benchmark, or any lm-eval task or group (``include_path``: folders
    with task YAML of one's own)."""

    model_config = STRICT
    name: str = Field(pattern=TASK_NAME, max_length=200)
    variant: str | None = None
    shots: int | None = Field(default=None, ge=0, validation_alias=AliasChoices("shots", "num_fewshot"))
    limit: int | None = Field(default=None, gt=0, le=LIMIT_MAX)
    gen_kwargs: GenKwargs | None = None
    repeats: int | None = Field(default=None, gt=0, le=1000)  # answers per request (lm-eval's repeats), for the task
    include_path: IncludePath = None

    @model_validator(mode="before")
    @classmethod
    def _one_shot_count(cls, value):
        if isinstance(value, dict) and "shots" in value and "num_fewshot" in value:
            raise ValueError("give shots or num_fewshot (two names of one field), not both")
        return value


class Recipe(BaseModel):
    model_config = STRICT
    _plan: tuple | None = PrivateAttr(default=None)  # the rows, once planned (``plan``)
    name: str = Field(pattern=LABEL, max_length=200)
    description: str = ""
    members: list[MemberSpec] = Field(min_length=1)
    method: MethodSpec | None = None  # one ensemble row; or
    methods: list[MethodSpec] | None = Field(default=None, min_length=1)  # several (e.g. a paper table)
    singles: bool = False
    tasks: list[TaskSpec] = Field(min_length=1)
    include_path: IncludePath = None  # folders of lm-eval task YAML, for every task (tasks[i].include_path: one)
    limit: int | None = Field(default=None, gt=0, le=LIMIT_MAX)
    batch_size: int = Field(default=1, gt=0)
    seed: int = Field(default=1234, ge=0, le=SEED_MAX)
    output: str = "results"
    data: Literal["hub", "offline"] = "hub"
    fewshot_as_multiturn: bool = False
    allow_code_execution: bool = False  # MBPP / HumanEval run generated programs (sandboxed subprocesses)
    allow_unisolated_execution: bool = False  # ... even where no namespace isolation works (docs/code_execution.md)
    allow_task_code: bool = False  # include_path tasks may import their own Python (!function), unsandboxed
    placement: PlacementSpec = PlacementSpec()  # local, or each member in a Ray actor
    sampling: SamplingOverride | None = None  # over every task's own settings, for every row (docs/sampling.md)
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

    @field_validator("method", "methods", "tasks", mode="before")
    @classmethod
    def _names_as_mappings(cls, value):
        """`gac` is short for `{name: gac}`, alone or in a list."""
        if isinstance(value, list):
            return [{"name": v} if isinstance(v, str) else v for v in value]
        return {"name": value} if isinstance(value, str) else value

    @property
    def plan(self) -> list[Row]:
        """The recipe's rows with their validated parameters (``plan_rows``), built on first use and kept:
        every part of a command reads this one plan."""
        if self._plan is None:
            self._plan = tuple(plan_rows(self))
        return list(self._plan)

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> Recipe:
        """A copy; with ``update`` its plan is built anew from the updated fields."""
        copied = super().model_copy(update=update, deep=deep)
        if update:
            copied._plan = None
        return copied

    @property
    def ensembles(self) -> list[MethodSpec]:
        """The recipe's method entries: ``methods``, or ``method`` alone."""
        return list(self.methods) if self.methods is not None else [self.method]

    def ensemble_members(self, spec: MethodSpec) -> tuple[int, ...]:
        """Indices (into ``members``) of the members one method entry ensembles."""
        labels = [m.label for m in self.members]
        return tuple(labels.index(n) for n in spec.members) if spec.members else tuple(range(len(labels)))

    @model_validator(mode="after")
    def _labels_unique(self):
        labels = [m.label for m in self.members]
        unsafe = next((label for label in labels if not is_safe_label(label)), None)
        if unsafe is not None:
            raise ValueError(f"the model name gives the label {unsafe!r}, not a safe folder name: set 'name' "
                             f"({SAFE_NAME})")
        if len(set(labels)) != len(labels):
            raise ValueError(f"member names must be unique (got {labels}); set 'name' on each member")
        if (self.method is None) == (self.methods is None):
            raise ValueError("give either 'method' (one ensemble) or 'methods' (a list of them), not both or neither")
        if self.sweep and len(self.ensembles) > 1:
            raise ValueError("sweep needs a single method entry")
        for spec in self.ensembles:
            unknown = [n for n in spec.members or [] if n not in labels]
            if unknown:
                raise ValueError(f"method '{spec.name}' names unknown member '{unknown[0]}' (members: {labels})")
        return self

    @model_validator(mode="after")
    def _backends_placed(self):
        placed = self.members if self.placement.kind == "ray" else []
        refusal = next((line for m in placed if (line := backend_spec(m.backend).refused_in_actor(m))), None)
        if refusal is not None:
            raise ValueError(refusal)
        return self

    def task_limit(self, task: TaskSpec) -> int | None:
        return task.limit if task.limit is not None else self.limit

    def fingerprint(self) -> str:
        """Hash of everything that changes results (not the output folder); fields left at their
        defaults are left out, so adding a field later keeps old runs resumable."""
        content = self.model_dump(exclude={"output", "description"}, exclude_defaults=True)
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:12]


# --- the plan of a recipe: its rows and benchmarks ---------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One evaluated model of a run."""

    label: str
    method: str
    members: tuple[int, ...]  # indices into recipe.members
    overrides: tuple[tuple[str, Any], ...] = ()  # method parameters set by the recipe's sweep
    spec: int | None = None  # index into recipe.ensembles (None: a member alone)
    params: Any = field(default=None, compare=False)  # the method's validated parameters, defaults filled in


def plan_rows(recipe: Recipe, with_params: bool = True) -> list[Row]:
    """A row per member alone (``singles``, or a ``single`` method), then a row per method entry
    and sweep point, each with its validated parameters. Labels are unique (a recipe that repeats one
    is refused). Built once per recipe: read it as ``recipe.plan`` (``with_params=False``: the rows
    alone, to check their labels beside other mistakes)."""
    singles = [Row(m.label, ALONE, (i,), params=method_spec(ALONE).Params()) for i, m in enumerate(recipe.members)]
    ensembles = []
    for index, spec in enumerate(recipe.ensembles):
        if is_alone(spec.name):
            continue
        for point in recipe.sweep_points():
            label = spec.label or spec.name + "".join(f"-{k}={v}" for k, v in point.items())
            params = validate_method(recipe, spec, "recipe", overrides=point)[1] if with_params else None
            ensembles.append(Row(label, spec.name, recipe.ensemble_members(spec), tuple(point.items()), index, params))
    rows = (singles if recipe.singles or not ensembles else []) + ensembles
    labels = [row.label for row in rows]
    unsafe = next((label for label in labels if not is_safe_label(label)), None)
    if unsafe is not None:
        raise UserError(f"the row label {unsafe!r} is not a safe folder name ({SAFE_NAME}); "
                        "give the method entry a 'label'")
    counts = Counter(labels)  # (list.count per label took seconds on a sweep of 10,000 rows)
    repeated = next((label for label in labels if counts[label] > 1), None)
    if repeated:
        raise UserError(f"two rows of the recipe are labelled '{repeated}'; give each method entry a 'label'")
    return rows


def selected_benchmarks(recipe: Recipe, index: dict | None) -> list[tuple[Benchmark, int | None, int | None]]:
    """(benchmark, shots, limit) per recipe task; refuses built-in benchmarks that cannot run yet. A task
    that is not built in is looked up in ``index``, lm-eval's task index with the recipe's include_path
    folders (``recipe_tasks.task_index_of``; None when every task is built in)."""
    chosen = []
    for task, bench in zip(recipe.tasks, task_benchmarks(recipe, index)):
        if bench.needs:
            raise UserError(f"benchmark '{task.name}' cannot run: {bench.needs}")
        if recipe.data == "offline" and bench.builtin and not bench.offline:
            raise UserError(f"benchmark '{task.name}' has no offline data; use data: hub")
        chosen.append((bench, task.shots, recipe.task_limit(task)))
    return chosen


def validate_method(recipe: Recipe, spec: MethodSpec, source: str, field: str = "method",
                    overrides: dict[str, Any] | None = None):
    """The method class and its validated parameters for one method entry, or a one-line UserError."""
    try:
        method = method_spec(spec.name)
    except UserError as err:
        raise UserError(f"{source}: {field}.name: {err}") from None
    members = [recipe.members[i] for i in recipe.ensemble_members(spec)]
    given = {**spec.params, **(overrides or {})}
    weighted = [m.label for m in members if m.weight is not None]
    if weighted and "weights" not in method.Params.model_fields:
        raise UserError(f"{source}: members: '{weighted[0]}' sets weight, but method '{method.name}' takes no "
                        "member weights: remove weight (or give it only to members of a weighted method)")
    if weighted and "weights" not in given:
        given = {**given, "weights": [m.weight if m.weight is not None else 1.0 for m in members]}
    try:
        params = method.Params.model_validate(given)
    except ValidationError as err:
        raise several(UserError, pydantic_lines(source, err, prefix=field, model=method.Params)) from None
    try:
        method.check_members(params, [m.label for m in members])
    except UserError as err:
        raise UserError(f"{source}: {err}") from None
    count = len(members)
    if not method.alone and (count < method.min_members or
                             (method.max_members is not None and count > method.max_members)):
        raise UserError(f"{source}: members: method '{method.name}' takes {method.min_members}"
                        f"{'+' if method.max_members is None else f'-{method.max_members}'} members, got {count}")
    return method, params
