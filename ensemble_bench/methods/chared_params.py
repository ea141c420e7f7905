"""The declaration of ``chared`` (character-by-character averaging; its work: chared.py)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, field_validator

from ensemble_bench.decoding.params import MethodSpec, WindowParams, normalised_weights, weights_problem
from ensemble_bench.methods.registry import register_method


class CharEDParams(WindowParams):
    weights: list[float] | None = Field(default=None, description="per-member weights (null or average: equal, "
                                        "the paper's average)")

    @field_validator("weights")
    @classmethod
    def _positive_sum(cls, value):
        if value is not None and (problem := weights_problem(value)) is not None:
            raise ValueError(problem)
        return value


@register_method
class CharEDSpec(MethodSpec):
    name = "chared"
    implementation = "ensemble_bench.methods.chared:CharED"
    family = "token_level"
    Params = CharEDParams
    choice_scoring = "CharED scores an option by the weighted average of its members' sequence probabilities"
    inert_on_choices = frozenset({"window"})
    samples = True
    min_members = 1  # one member alone decodes character-wise (the reference a member with itself equals)

    @classmethod
    def check_members(cls, params: CharEDParams, labels: Sequence[str]) -> None:
        if params.weights is not None:
            normalised_weights(params.weights, len(labels))
