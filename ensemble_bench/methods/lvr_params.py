"""The declaration of ``lvr`` (each member reduced exactly to the maximal common vocabulary, averaged; its
work: lvr.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ensemble_bench.methods.byte_level_params import ByteLevelSpec, CoveringParams
from ensemble_bench.methods.registry import register_method


class LvrParams(CoveringParams):
    vocabulary: Literal["merges", "intersection"] = Field(default="merges", description=(
        "merges: the maximal common vocabulary, shared tokens closed under the members' BPE merges, each token "
        "re-tokenised by its member's BPE restricted to it; intersection: every shared token, each token spelled "
        "by longest common token first"))


@register_method
class LvrSpec(ByteLevelSpec):
    name = "lvr"
    implementation = "ensemble_bench.methods.lvr:Lvr"
    Params = LvrParams
    version = 2
