"""Registry of methods: name -> class. One file per method."""

from __future__ import annotations

from ensemble_bench.errors import UserError
from ensemble_bench.methods.base import (Generation, GenerationRequest, LoglikelihoodRequest, Method,
                                         MethodParams)
from ensemble_bench.methods.gac import Gac
from ensemble_bench.methods.single import Single

METHODS: dict[str, type[Method]] = {cls.name: cls for cls in (Single, Gac)}

__all__ = ["METHODS", "Generation", "GenerationRequest", "LoglikelihoodRequest", "Method", "MethodParams",
           "get_method"]


def get_method(name: str) -> type[Method]:
    try:
        return METHODS[name]
    except KeyError:
        raise UserError(f"unknown method '{name}' (known: {', '.join(sorted(METHODS))})") from None
