"""The declaration of ``unite`` (the union of the members' top-k, the primary model emits; its work:
unite.py)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from ensemble_bench.decoding.params import lead_field, normalised_weights
from ensemble_bench.methods.core_params import CoreParams
from ensemble_bench.methods.registry import register_method
from ensemble_bench.methods.token_level_params import EmitterParams, EmitterSpec


class UniteParams(EmitterParams, CoreParams):
    lead: int | str = lead_field(0, "the member that emits (the paper's primary: the best-performing one)",
                                 "primary")
    k: int = Field(default=10, ge=1, le=1000, description="top-k tokens per member (the paper: 10)")
    weights: list[float] | None = Field(default=None, description="per-member weights of the average "
                                        "(null or average: equal)")


@register_method
class UniteSpec(EmitterSpec):
    name = "unite"
    implementation = "ensemble_bench.methods.unite:Unite"
    Params = UniteParams

    @classmethod
    def check_members(cls, params: UniteParams, labels: Sequence[str]) -> None:
        super().check_members(params, labels)
        if params.weights is not None:
            normalised_weights(params.weights, len(labels))
