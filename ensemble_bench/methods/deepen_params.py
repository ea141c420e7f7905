"""The declaration of ``deepen`` (relative representations over the shared tokens, mapped back to the main
model by gradient steps; its work: deepen.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, model_validator

from ensemble_bench.decoding.params import lead_field, normalised_weights
from ensemble_bench.errors import UserError
from ensemble_bench.methods.registry import register_method
from ensemble_bench.methods.token_level_params import EmitterParams, EmitterSpec


class DeepenParams(EmitterParams):
    lead: int | str = lead_field(0, "the member that emits (the paper's main model: the best on the dev set)", "main")
    weights: Literal["adapt"] | list[float] | None = Field(default=None, description=(
        "null or average: equal (the paper's Avg); adapt: from scores (Sec. 3.5); or one value per member"))
    scores: list[float] | None = Field(default=None, description="dev-set accuracy per member, for adapt")
    chance: float = Field(default=0.0, ge=0.0, lt=1.0, description="epsilon of adapt: 0 free-form, 1/K for K choices")
    eta: float = Field(default=0.15, gt=0.0, description="relative ensemble learning rate (Eq. 7)")
    steps: int = Field(default=5, ge=0, le=100, description="relative ensemble learning steps T")
    support: int | None = Field(default=256, ge=1, description="top tokens per member carried; null: every token")

    @model_validator(mode="after")
    def _consistent(self):
        if self.weights == "adapt" and self.scores is None:
            raise ValueError("weights 'adapt' needs 'scores' (dev-set accuracy per member)")
        return self


def resolve_deepen_weights(params: DeepenParams, count: int) -> list[float]:
    """alpha_i: 1/N (Avg), (s_i - eps) / sum_j (s_j - eps) (Adapt), or explicit values."""
    if params.weights is None:
        return [1.0 / count] * count
    if params.weights == "adapt":
        scores = params.scores or []
        if len(scores) != count:
            raise UserError(f"method.scores: expected {count} values (one per member), got {len(scores)}")
        above = [s - params.chance for s in scores]
        if any(a < 0 for a in above) or sum(above) <= 0:
            raise UserError(f"method.scores: every score must be >= chance ({params.chance}) with some above it")
        return normalised_weights(above, count)
    return normalised_weights(params.weights, count)


@register_method
class DeepenSpec(EmitterSpec):
    name = "deepen"
    implementation = "ensemble_bench.methods.deepen:Deepen"
    Params = DeepenParams

    @classmethod
    def check_members(cls, params: DeepenParams, labels: Sequence[str]) -> None:
        super().check_members(params, labels)
        resolve_deepen_weights(params, len(labels))
