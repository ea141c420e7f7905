"""Registry of methods: name -> class. One file per method."""

from __future__ import annotations

from ensemble_bench.errors import UserError
from ensemble_bench.methods.base import (Generation, GenerationRequest, LoglikelihoodRequest, Method,
                                         MethodParams)
from ensemble_bench.methods.byte_level import ByteLevel
from ensemble_bench.methods.chared import CharED
from ensemble_bench.methods.coolfusion import CoolFusion
from ensemble_bench.methods.deepen import Deepen
from ensemble_bench.methods.gac import Gac
from ensemble_bench.methods.mbr import Mbr
from ensemble_bench.methods.packllm import PackLLM
from ensemble_bench.methods.rerank import Rerank
from ensemble_bench.methods.safe import Safe
from ensemble_bench.methods.single import Single
from ensemble_bench.methods.sweetspan import SweetSpan
from ensemble_bench.methods.unite import Unite
from ensemble_bench.methods.voting import Voting

METHODS: dict[str, type[Method]] = {cls.name: cls for cls in (Single, Gac, Unite, Deepen, Voting, Mbr, Rerank, CoolFusion, SweetSpan,
                                                          PackLLM, CharED, Safe, ByteLevel)}

ALONE = Single.name  # the method that evaluates one member by itself

__all__ = ["ALONE", "METHODS", "Generation", "GenerationRequest", "LoglikelihoodRequest", "Method", "MethodParams",
           "get_method", "is_alone"]


def get_method(name: str) -> type[Method]:
    try:
        return METHODS[name]
    except KeyError:
        raise UserError(f"unknown method '{name}' (known: {', '.join(sorted(METHODS))})") from None


def is_alone(name: str) -> bool:
    """Whether a method name (e.g. a stored row's) evaluates a member alone."""
    return name in METHODS and METHODS[name].alone
