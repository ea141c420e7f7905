"""The declaration of ``me`` (the Mixture-model-like Ensemble: pick a member by lambda, draw from it
alone; its work: me.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import AfterValidator, Field

from ensemble_bench.decoding.params import (
    MethodSpec,
    Retokenize,
    WindowParams,
    checked_weights,
    lead_field,
    resolve_member,
)
from ensemble_bench.errors import UserError
from ensemble_bench.methods.registry import register_method


class MeParams(WindowParams):
    weights: Annotated[list[float] | None, AfterValidator(checked_weights)] = Field(default=None, description=(
        "lambda_i, the probability of picking each member at a step (Sec. 2.2; scaled to sum to 1); null: equal"))
    lead: int | str = lead_field(0, "the member whose decode renders the text")
    retokenize: Retokenize = Field(default="local", description=(
        "how members take bytes another member drew (docs/retokenize.md): local, as GaC's code"))


def resolve_weights(params: MeParams, count: int) -> list[float]:
    """lambda, scaled to sum to 1 (equal when not given)."""
    weights = params.weights if params.weights is not None else [1.0] * count
    if len(weights) != count:
        raise UserError(f"method.weights: expected {count} values (one per member), got {len(weights)}")
    return [w / sum(weights) for w in weights]


@register_method
class MeSpec(MethodSpec):
    name = "me"
    implementation = "ensemble_bench.methods.me:Me"
    family = "sampling_ensembles"
    Params = MeParams
    choice_scoring = "ME scores an option by the weighted average of its members' sequence probabilities"
    inert_on_choices = frozenset({*WindowParams.model_fields, "lead", "retokenize"})
    min_members = 2
    samples = True
    lead_param = "lead"

    @classmethod
    def check_members(cls, params: MeParams, labels: Sequence[str]) -> None:
        resolve_weights(params, len(labels))
        resolve_member(params.lead, labels, params.lead_spelling)
