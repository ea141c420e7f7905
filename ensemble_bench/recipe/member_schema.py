"""A recipe's members (model, dtype, device, backend and its section, Ray resources) and their placement:
strict pydantic models, part of the recipe's schema (recipe/schema.py). The backends a member may name
and their sections are read from the registry (members/backends.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ensemble_bench.members.backends import DEFAULT, backend_spec, backends, sections
from ensemble_bench.recipe.lines import LABEL

# every float of a recipe (weights, thresholds, Ray resources, ...) must be finite: NaN and +-inf are refused
STRICT = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class MemberSpec(BaseModel):
    model_config = {**STRICT, "extra": "allow"}  # the one extra key: the backend's section (``_with_section``)
    model: str = Field(min_length=1)
    name: str | None = Field(default=None, pattern=LABEL, max_length=200)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:\d+)?|mps)$")
    chat_template: bool = False  # as lm-eval: off unless asked for (--apply_chat_template)
    kind: Literal["auto", "causal", "seq2seq"] = "auto"  # seq2seq: an encoder-decoder (NLLB, T5, ...)
    # run the Python code shipped in the model's repository (InternLM3, DeciLM, ...); off: only transformers' own
    trust_remote_code: bool = False
    weight: float | None = Field(default=None, gt=0)
    paper_row: str | None = None  # the row of a paper's table this member alone fills (`ensbench table --layout`)
    # loading (from_pretrained): accelerate's layer placement, per-device limits, bitsandbytes
    device_map: Literal["auto", "balanced", "balanced_low_0", "sequential"] | dict[str, int | str] | None = None
    max_memory: dict[str, int | str] | None = None  # e.g. {0: 20GiB, cpu: 64GiB}; needs device_map
    quantization: Literal["8bit", "4bit"] | None = None
    # the Ray actor of this member (placement kind ray; not used with local placement)
    num_gpus: float = Field(default=0, ge=0)
    num_cpus: float | None = Field(default=None, ge=0)
    resources: dict[str, float] | None = None  # custom Ray resources, e.g. {node_a100: 1}
    # what steps the model (members/backends.py): transformers in this process, an in-process vLLM engine
    # (docs/backends.md), ...; a backend with settings of its own reads them from the member's `<backend>:` key
    backend: str = DEFAULT

    @field_validator("backend", mode="before")
    @classmethod
    def _registered(cls, value: Any) -> Any:
        if value not in backends():
            *others, last = [repr(name) for name in backends()]
            expected = f"{', '.join(others)} or {last}" if others else last
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
        return value

    @classmethod
    def keyed_sections(cls) -> dict[str, type[BaseModel]]:
        """The keys a member may give beside its fields: each backend's section, by the backend's name."""
        return {name: backend.section for name, backend in sections().items()}

    @model_validator(mode="wrap")
    @classmethod
    def _with_section(cls, data: Any, handler):
        """A member and its backend's section (``vllm: {...}``), validated together: every mistake of
        both as pydantic errors at their fields; the section is kept as the member's one extra key."""
        if not isinstance(data, dict):
            return handler(data)
        known = sections()
        given = {key: value for key, value in data.items() if key in known}
        unknown = [key for key in data if key not in cls.model_fields and key not in known]
        errors, parsed, member = [], {}, None
        try:
            member = handler({key: value for key, value in data.items() if key not in given and key not in unknown})
        except ValidationError as err:
            errors += err.errors()
        for key, value in given.items():
            try:
                parsed[key] = None if value is None else known[key].section.model_validate(value)
            except ValidationError as err:
                errors += [{**error, "loc": (key, *error["loc"])} for error in err.errors()]
        errors += [{"type": "extra_forbidden", "loc": (key,), "msg": "Extra inputs are not permitted",
                    "input": data[key]} for key in unknown]
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, [
                {"type": PydanticCustomError(e["type"], e["msg"]), "loc": e["loc"], "input": e["input"]}
                for e in errors])
        object.__setattr__(member, "__pydantic_extra__", {key: value for key, value in parsed.items() if value})
        problem = member._backend_problem()
        if problem is not None:
            raise ValueError(problem)
        return member

    def _backend_problem(self) -> str | None:
        for key in self.model_extra or {}:
            if key != self.backend:
                return f"{key}: {backends()[key].section_holds} need backend: {key}"
        return backend_spec(self.backend).refused(self)

    @property
    def section(self) -> BaseModel | None:
        """The settings of the member's backend (its ``<backend>:`` key), or None."""
        return (self.model_extra or {}).get(self.backend)

    @field_validator("max_memory", mode="before")
    @classmethod
    def _device_keys_as_text(cls, value):  # YAML reads `0: 20GiB` with an int key
        return {str(k) if isinstance(k, int) else k: v for k, v in value.items()} if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _placement_consistent(self):
        if self.device_map is not None and self.device != "cpu":  # cpu: the default, as a run folder stores it
            raise ValueError("set device or device_map, not both (device_map places the layers itself)")
        if self.max_memory is not None and self.device_map is None:
            raise ValueError("max_memory needs a device_map (e.g. device_map: auto)")
        return self

    @property
    def label(self) -> str:
        return self.name or self.model.rstrip("/").split("/")[-1].removesuffix(".gguf")

    def load_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of members.load_member."""
        return {"model": self.model, "dtype": self.dtype, "device": self.device, "chat_template": self.chat_template,
                "name": self.label, "device_map": self.device_map, "quantization": self.quantization,
                "kind": self.kind, "trust_remote_code": self.trust_remote_code, "backend": self.backend,
                **self.section_kwargs(),
                "max_memory": {int(k) if k.isdigit() else k: v for k, v in self.max_memory.items()}
                if self.max_memory else None}

    def section_kwargs(self) -> dict[str, Any]:
        """The backend's section as load_member's keyword (its name: ``vllm={...}``); none for a backend
        without one."""
        if backend_spec(self.backend).section is None:
            return {}
        return {self.backend: self.section.model_dump() if self.section is not None else None}

    def actor_options(self) -> dict[str, Any]:
        """Ray actor options (placement kind ray)."""
        return {"num_gpus": self.num_gpus, "num_cpus": self.num_cpus, "resources": self.resources}


DEFAULT_SCHEDULE_TIMEOUT_S = 600.0


class PlacementSpec(BaseModel):
    """Where members run: in this process (local), or each in a Ray actor (ray)."""

    model_config = STRICT
    kind: Literal["local", "ray"] = "local"
    address: str | None = Field(default=None, pattern=r"^(auto|ray://\S+|[^\s:/]+:\d+)$")  # null: start one here
    num_cpus: int | None = Field(default=None, gt=0)  # size of a cluster started here (address null)
    num_gpus: int | None = Field(default=None, ge=0)
    # an actor Ray cannot place by then ends the run (null: DEFAULT_SCHEDULE_TIMEOUT_S)
    schedule_timeout_s: float | None = Field(default=None, gt=0)
    # copies of the whole ensemble (members + method), each in its own Ray actor, answering whole batches
    replicas: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _consistent(self):
        if self.kind == "local" and self.replicas != 1:
            raise ValueError("replicas need kind: ray (each replica is a Ray actor)")
        if self.kind == "local" and (self.address, self.num_cpus, self.num_gpus) != (None, None, None):
            raise ValueError("address, num_cpus and num_gpus need kind: ray")
        if self.kind == "local" and self.schedule_timeout_s is not None:
            raise ValueError("schedule_timeout_s needs kind: ray")
        if self.address is not None and (self.num_cpus, self.num_gpus) != (None, None):
            raise ValueError("num_cpus / num_gpus size a cluster started here: leave them out with an address")
        return self

    @property
    def schedule_timeout(self) -> float:
        """Seconds to wait for Ray to place every member."""
        return DEFAULT_SCHEDULE_TIMEOUT_S if self.schedule_timeout_s is None else self.schedule_timeout_s


def check_placement(recipe, source: str) -> list[str]:
    """A line per member whose device does not fit the placement (packages: ``preflight.preflight``)."""
    lines = []
    for i, member in enumerate(recipe.members):
        device = member.device
        if recipe.placement.kind == "ray" and device.startswith("cuda") and member.device_map is None:
            index = int(device.partition(":")[2] or 0)
            if index >= member.num_gpus:
                lines.append(f"{source}: members[{i}].num_gpus: device '{device}' under placement ray needs "
                             f"num_gpus > {index} (the actor sees only its own GPUs, as cuda:0, cuda:1, ...)")
    return lines
