"""Registry of methods: name -> class. A method is one module and one line of ``BUILT_IN`` below
(or, for a method defined elsewhere, one call of ``register_method``); its lm-eval model
(``ensemble_bench.run.lm``), its row in ``ensbench list`` and its docs table follow from the class."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any, NamedTuple

from pydantic import ValidationError

from ensemble_bench.decoding.method import Generation, GenerationRequest, LoglikelihoodRequest, Method, MethodParams
from ensemble_bench.decoding.stats import RunStats
from ensemble_bench.errors import UserError
from ensemble_bench.methods.adafuse import AdaFuse
from ensemble_bench.methods.byte_level import ByteLevel
from ensemble_bench.methods.chared import CharED
from ensemble_bench.methods.coolfusion import CoolFusion
from ensemble_bench.methods.deepen import Deepen
from ensemble_bench.methods.eva import Eva
from ensemble_bench.methods.gac import Gac
from ensemble_bench.methods.lvr import Lvr
from ensemble_bench.methods.mbr import Mbr
from ensemble_bench.methods.packllm import PackLLM
from ensemble_bench.methods.rerank import Rerank
from ensemble_bench.methods.safe import Safe
from ensemble_bench.methods.single import Single
from ensemble_bench.methods.sweetspan import SweetSpan
from ensemble_bench.methods.unite import Unite
from ensemble_bench.methods.voting import Voting

METHODS: dict[str, type[Method]] = {}
ON_REGISTER: list[Callable[[type[Method]], None]] = []  # called with each method registered (``when_registered``)

ALONE = Single.name  # the method that evaluates one member by itself

__all__ = ["ALONE", "METHODS", "Generation", "GenerationRequest", "LoglikelihoodRequest", "Method", "MethodParams",
           "ParamDoc", "RunStats", "current_params", "describe_params", "get_method", "is_alone", "read_stats",
           "register_method", "when_registered"]


def register_method(cls: type[Method]) -> type[Method]:
    """Add a method to the registry under ``cls.name`` (also usable as a class decorator). Its
    lm-eval model (``ensemble_bench.run.lm.LM_CLASSES[name]``, class ``<Name>LM``) is made here, by the
    hook lm.py adds (``when_registered``) once it is imported."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isidentifier() or not name.islower():
        raise ValueError(f"a method's name is a lower-case identifier, got {name!r}")
    if METHODS.get(name, cls) is not cls:
        raise ValueError(f"method '{name}' is already registered ({METHODS[name].__qualname__})")
    METHODS[name] = cls
    for hook in ON_REGISTER:
        hook(cls)
    return cls


def when_registered(hook: Callable[[type[Method]], None]) -> None:
    """Call ``hook`` with every method registered so far and with each one registered from now on (how
    lm.py makes one lm-eval model per method without methods/ importing lm-eval)."""
    ON_REGISTER.append(hook)
    for cls in list(METHODS.values()):
        hook(cls)


BUILT_IN = (Single, Gac, Unite, Deepen, Voting, Mbr, Rerank, CoolFusion, SweetSpan, PackLLM, CharED, Safe, ByteLevel,
            Lvr, Eva, AdaFuse)
for _method in BUILT_IN:
    register_method(_method)


def get_method(name: str) -> type[Method]:
    try:
        return METHODS[name]
    except KeyError:
        raise UserError(f"unknown method '{name}' (known: {', '.join(sorted(METHODS))})") from None


def is_alone(name: str) -> bool:
    """Whether a method name (e.g. a stored row's) evaluates a member alone."""
    return name in METHODS and METHODS[name].alone


class ParamDoc(NamedTuple):
    """One parameter of a method as a recipe writes it."""

    name: str     # the recipe's key (the serialization name: SweetSpan's ``lambda``)
    type: str     # e.g. "int | str", "float | null", "list[float] | null"
    default: str  # as YAML would write it
    meaning: str  # the field's description


def describe_params(name: str) -> list[ParamDoc]:
    """Every parameter of a method, in declaration order: name, type, default and meaning."""
    params = get_method(name).Params
    return [ParamDoc(field.serialization_alias or key, type_text(field.annotation), default_text(field.default),
                     field.description or "") for key, field in params.model_fields.items()]


def type_text(annotation: Any) -> str:
    """A field's type as a recipe writer reads it (``None`` is ``null``, ``Literal`` lists its values)."""
    if annotation is type(None):
        return "null"
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(arg) for arg in typing.get_args(annotation))
    if origin is typing.Literal:
        return " | ".join(f'"{value}"' for value in typing.get_args(annotation))
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_text(a) for a in typing.get_args(annotation))}]"
    return getattr(annotation, "__name__", str(annotation))


def default_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def current_params(name: str, stored: dict[str, Any]) -> dict[str, Any]:
    """Stored parameters (a run's params.json row, timing.json's ``params``) as this code names them:
    the papers' spellings read (``primary`` -> ``lead``, ``filter_ratio`` -> ``lambda``,
    ``weights: average`` -> null), a retired parameter at the value that meant today's behaviour dropped
    (GaC's ``temperature: 0``), and defaults filled in; as stored if they no longer validate."""
    method = METHODS.get(name)
    if method is None:
        return dict(stored)
    kept = {key: value for key, value in stored.items() if key not in method.retired or method.retired[key] != value}
    try:
        return method.Params.model_validate(without_defaults(method.Params, kept)).model_dump(mode="json")
    except ValidationError:
        return dict(stored)


def without_defaults(params: type, stored: dict[str, Any]) -> dict[str, Any]:
    """A stored full dump less the fields at their default: a field that applies only beside another
    (CoRE's ``core_beta`` beside ``core: true``) then validates as the default it was."""
    fields = params.model_fields
    return {key: value for key, value in stored.items()
            if key not in fields or fields[key].is_required() or value != _json_default(fields[key])}


def _json_default(field) -> Any:
    default = field.get_default(call_default_factory=True)
    return list(default) if isinstance(default, tuple) else default


def read_stats(data: dict[str, Any]) -> RunStats:
    """A results file's statistics (timing.json, or the ``ensbench`` section of lm-eval's results) as a
    RunStats, its parameters named as this code names them (``current_params``)."""
    stats = RunStats.from_json(data)
    return stats if not stats.params else RunStats.from_json(
        {**data, "params": current_params(stats.method, stats.params)})
