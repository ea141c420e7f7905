"""The declaration of ``safe`` (a drafter and verifiers, ensembling only at stable, disputed positions; its
work: safe.py)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from ensemble_bench.decoding.params import (
    MethodSpec,
    WindowParams,
    check_lead_and_weights,
    lead_field,
)
from ensemble_bench.methods.registry import register_method


class SafeParams(WindowParams):
    lead: int | str = lead_field(0, "the drafter (Sec. 4.2: the best model)", "drafter")
    draft_tokens: int = Field(default=5, ge=1, le=64, description="tokens drafted per cycle (Sec. 3.1, 4.2: n = 5)")
    sharpen: float = Field(default=0.5, ge=0.0, le=1.0, description=(
        "sharpen when the ensemble's top probability is below this (0: never), Sec. 3.3"))
    candidate_floor: float = Field(default=0.1, ge=0.0, le=1.0, description=(
        "Sec. 3.3 lambda: a sharpening candidate's average must exceed it"))
    gate_threshold: float | None = Field(default=None, gt=0.0, le=1.0, description=(
        "GaC's gate: ensemble a position only if the drafter's top probability is below it (null: no gate)"))
    weights: list[float] | None = Field(default=None, description="per-member weights of the average "
                                        "(null or average: equal)")


@register_method
class SafeSpec(MethodSpec):
    name = "safe"
    implementation = "ensemble_bench.methods.safe:Safe"
    family = "token_level"
    Params = SafeParams
    min_members = 2
    lead_param = "lead"
    choice_scoring = "SAFE scores an option by the drafter's (lead's) own probability"
    inert_on_choices = frozenset(SafeParams.model_fields) - {"lead"}

    @classmethod
    def check_members(cls, params: SafeParams, labels: Sequence[str]) -> None:
        check_lead_and_weights(params, labels)
