"""The registry of methods (re-exported by ``ensemble_bench.methods``, which fills it): name -> a
method's declaration, and the class doing its work imported on first use."""

from __future__ import annotations

import importlib
import pkgutil
import types
import typing
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, NamedTuple

from pydantic import ValidationError

from ensemble_bench.decoding.params import MethodSpec
from ensemble_bench.decoding.stats import RunStats
from ensemble_bench.errors import UserError

DECLARED: dict[str, type[MethodSpec]] = {}  # name -> declaration, in registration order
ON_REGISTER: list[Callable[[type[MethodSpec]], None]] = []  # called with each method registered (``when_registered``)

ALONE = "single"  # the method that evaluates one member by itself


def register_method(cls: type[MethodSpec]) -> type[MethodSpec]:
    """Add a method to the registry under ``cls.name`` (also usable as a class decorator): a declaration
    whose ``implementation`` ("module:Class") is imported on first use, or a class that does the work
    itself. Its lm-eval model (``ensemble_bench.run.lm.LM_CLASSES[name]``, class ``<Name>LM``) is made
    here, by the hook lm.py adds (``when_registered``) once it is imported."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isidentifier() or not name.islower():
        raise ValueError(f"a method's name is a lower-case identifier, got {name!r}")
    if DECLARED.get(name, cls) is not cls:
        raise ValueError(f"method '{name}' is already registered ({DECLARED[name].__qualname__})")
    DECLARED[name] = cls
    for hook in ON_REGISTER:
        hook(cls)
    return cls


def when_registered(hook: Callable[[type[MethodSpec]], None]) -> None:
    """Call ``hook`` with every method registered so far and with each one registered from now on (how
    lm.py makes one lm-eval model per method without methods/ importing lm-eval)."""
    ON_REGISTER.append(hook)
    for cls in list(DECLARED.values()):
        hook(cls)


def implementation_of(spec: type[MethodSpec]) -> type:
    """The class that does a declared method's work: the ``implementation`` its declaration names, imported;
    ``spec`` itself when it names none of its own (a class doing its work, as a subclass of one does)."""
    if spec.implementation is None or "implementation" not in vars(spec):
        return spec
    module, _, attribute = spec.implementation.partition(":")
    cls = getattr(importlib.import_module(module), attribute)
    if not (isinstance(cls, type) and issubclass(cls, spec)):
        raise TypeError(f"{spec.implementation} does not extend the declaration of '{spec.name}' ({spec.__qualname__})")
    return cls


class Methods(MutableMapping):
    """name -> the class that does the method's work, its module imported on first use (``DECLARED``
    holds the declarations); setting an entry registers it, deleting one unregisters it."""

    def __init__(self):
        self._loaded: dict[str, type] = {}

    def __getitem__(self, name: str) -> type:
        if name not in self._loaded:
            self._loaded[name] = implementation_of(DECLARED[name])
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in DECLARED

    def __setitem__(self, name: str, cls: type[MethodSpec]) -> None:
        if getattr(cls, "name", None) != name:
            raise ValueError(f"method '{name}' is registered under its own name, got {getattr(cls, 'name', None)!r}")
        register_method(cls)

    def __delitem__(self, name: str) -> None:
        del DECLARED[name]
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(DECLARED))

    def __len__(self) -> int:
        return len(DECLARED)


METHODS = Methods()


def discover(package: str) -> None:
    """Import every declaration module (``*_params``) of ``package``: each registers its methods."""
    for module in pkgutil.iter_modules(importlib.import_module(package).__path__):
        if module.name.endswith("_params"):
            importlib.import_module(f"{package}.{module.name}")


def method_spec(name: str) -> type[MethodSpec]:
    """A method's declaration (its Params and facts), loading no torch; UserError if none has that name."""
    try:
        return DECLARED[name]
    except KeyError:
        raise UserError(f"unknown method '{name}' (known: {', '.join(sorted(DECLARED))})") from None


def get_method(name: str) -> type:
    """The class that does a method's work (a ``decoding/method.Method``), its module imported on first use."""
    method_spec(name)
    return METHODS[name]


def is_alone(name: str) -> bool:
    """Whether a method name (e.g. a stored row's) evaluates a member alone."""
    return name in DECLARED and DECLARED[name].alone


class ParamDoc(NamedTuple):
    """One parameter of a method as a recipe writes it."""

    name: str     # the recipe's key (the serialization name: SweetSpan's ``lambda``)
    type: str     # e.g. "int | str", "float | null", "list[float] | null"
    default: str  # as YAML would write it
    meaning: str  # the field's description


def describe_params(name: str) -> list[ParamDoc]:
    """Every parameter of a method, in declaration order: name, type, default and meaning."""
    params = method_spec(name).Params
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
    method = DECLARED.get(name)
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

