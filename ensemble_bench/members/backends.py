"""The registry of backends (what steps a member's model: transformers in this process, an in-process vLLM
engine, ...): name -> its declaration, read by the recipe's schema, the preflight and the row keys, and its
loader imported on first use. A backend is one module, ``<name>_backend.py`` in this package (or in a
package passed to ``discover``), declaring itself with ``register_backend``; the declaration imports no
torch, so validating a recipe loads no backend (as methods' ``<name>_params.py`` declarations)."""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from ensemble_bench.errors import UserError

DEFAULT = "transformers"  # a member naming no backend; its rows' keys name none (as before backends existed)


@dataclass(frozen=True)
class Backend:
    """A backend's declaration: its recipe name, its member section and what it needs, and the
    "module:function" that loads a member (called with ``load_member``'s keywords, its section's
    settings as ``section``)."""

    name: str                                  # ``backend: <name>`` in a recipe's member
    loader: str                                # "module:function", imported on first load
    section: type[BaseModel] | None = None     # the member's ``<name>:`` mapping, when it takes one
    section_holds: str = "settings"            # what that mapping holds, as an error line names it
    packages: dict[str, str] = field(default_factory=dict)  # import name -> how to install it
    versions: tuple[str, ...] = ()             # distributions whose installed version keys its rows (first found)
    # the line refusing placement ray for one of its members (``refused_in_actor(member)``), or None
    refused_in_actor: Callable[[Any], str | None] = field(default=lambda member: None)
    # the member fields it does not take (``refused(member)``: the first one's line, or None)
    refused: Callable[[Any], str | None] = field(default=lambda member: None)

    def version(self) -> str | None:
        """The installed version of its engine (part of its rows' keys), or None."""
        for name in self.versions:
            try:
                return importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                continue
        return None

    def load(self, **load: Any):
        """One member, loaded by the function ``loader`` names."""
        module, _, function = self.loader.partition(":")
        return getattr(importlib.import_module(module), function)(**load)


DECLARED: dict[str, Backend] = {}
_BUILT_IN = "ensemble_bench.members"
_discovered: set[str] = set()


def register_backend(backend: Backend) -> Backend:
    """Add a backend under its name (a lower-case identifier that no member field uses)."""
    if not backend.name.isidentifier() or not backend.name.islower():
        raise ValueError(f"a backend's name is a lower-case identifier, got {backend.name!r}")
    if DECLARED.get(backend.name, backend) != backend:
        raise ValueError(f"backend '{backend.name}' is already registered")
    DECLARED[backend.name] = backend
    return backend


def discover(package: str) -> None:
    """Import every ``*_backend`` module of ``package``: each registers its backend."""
    _discovered.add(package)
    for module in pkgutil.iter_modules(importlib.import_module(package).__path__):
        if module.name.endswith("_backend"):
            importlib.import_module(f"{package}.{module.name}")


def backends() -> dict[str, Backend]:
    """Every registered backend, this package's discovered on first use."""
    if _BUILT_IN not in _discovered:
        discover(_BUILT_IN)
    return DECLARED


def backend_spec(name: str) -> Backend:
    """A backend's declaration; UserError if none has that name."""
    try:
        return backends()[name]
    except KeyError:
        raise UserError(f"unknown backend '{name}' (known: {', '.join(backends())})") from None


def sections() -> dict[str, Backend]:
    """The backends that take a section of their own, by the section's key (their name)."""
    return {name: backend for name, backend in backends().items() if backend.section is not None}
