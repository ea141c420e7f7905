"""Registry of methods: name -> declaration (``MethodSpec``: its Params and facts, no torch) and, on
first use, the class that does the work. A method is a declaration module, ``<name>_params.py`` in this
package, whose declaration registers itself (``@register_method``), and the module its
``implementation`` names; every ``*_params`` module here is imported when the registry is (nothing
lists the methods by hand). Validating a recipe reads only declarations (``method_spec``), so it
imports no torch; building a row imports the implementation (``get_method``), as lm-eval resolves
its "module:Class" model targets. Its lm-eval model (``ensemble_bench.run.lm``), its row in
``ensbench list`` and its docs table follow from the declaration."""

from __future__ import annotations

import importlib

from ensemble_bench.decoding.params import MethodParams, MethodSpec
from ensemble_bench.decoding.stats import RunStats
from ensemble_bench.methods.registry import (
    ALONE,
    DECLARED,
    METHODS,
    ParamDoc,
    current_params,
    describe_params,
    discover,
    get_method,
    is_alone,
    method_spec,
    read_stats,
    register_method,
    when_registered,
)

ENGINE = ("Generation", "GenerationRequest", "LoglikelihoodRequest", "Method")  # decoding/method.py's, on first use

__all__ = ["ALONE", "BUILT_IN", "DECLARED", "METHODS", "Generation", "GenerationRequest", "LoglikelihoodRequest",
           "Method", "MethodParams", "MethodSpec", "ParamDoc", "RunStats", "current_params", "describe_params",
           "get_method", "is_alone", "method_spec", "read_stats", "register_method", "when_registered"]


def __getattr__(name: str):
    """The engine's request and method types on first use: importing the registry loads no torch."""
    if name in ENGINE:
        return getattr(importlib.import_module("ensemble_bench.decoding.method"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


discover(__name__)
BUILT_IN = tuple(DECLARED.values())  # this package's methods, as discovered (one registered later is not one)
