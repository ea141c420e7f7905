"""The declaration of ``gac`` (the weighted average over a union vocabulary keyed by bytes, with an optional
gate and threshold; its work: gac.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ensemble_bench.decoding.params import (
    AUTO,
    MethodSpec,
    Retokenize,
    SpeculativeParams,
    WindowParams,
    lead_field,
    resolve_member,
    resolve_proposer,
    weights_problem,
)
from ensemble_bench.errors import UserError
from ensemble_bench.methods.core_params import CoreParams
from ensemble_bench.methods.registry import register_method

RETIRED = {"temperature": 0.0, "seed": 0}  # GaC's own sampling parameters before decoding/sampling.py, greedy


class GacParams(WindowParams, SpeculativeParams, CoreParams):
    weights: Literal["score", "score_minus_ece"] | list[float] | None = Field(default=None, description=(
        "null or average: equal; score or score_minus_ece: from scores (and ece), Sec. 4.3; or one value per "
        "member (a zero weight keeps a member for the gate only, GaC Table 5)"))
    scores: list[float] | None = Field(default=None, description="per-member benchmark score, for weights: score "
                                       "or score_minus_ece")
    ece: list[float] | None = Field(default=None, description="per-member expected calibration error, for "
                                    "score_minus_ece")
    lead: int | str = lead_field(0, "the member whose decode renders the text; with threshold, the gate of Eq. 5",
                                 "gate")
    threshold: float | None = Field(default=None, ge=0.0, le=1.0, description=(
        "Eq. 5: steps where the lead's top probability exceeds it take the lead's own token; null: every step "
        "is ensembled"))
    retokenize: Retokenize = Field(default="local", description=(
        "how members take the chosen token (docs/retokenize.md): local, as Eq. 4 and the official code"))

    @model_validator(mode="before")
    @classmethod
    def _sampling_moved(cls, data):
        """GaC's own temperature and seed became every method's sampling (docs/sampling.md)."""
        if isinstance(data, dict) and (moved := [key for key in RETIRED if key in data]):
            raise ValueError(f"'{moved[0]}' is no longer a GaC parameter: a row samples when its tasks ask "
                             "(do_sample, temperature) or its entry says so (sampling: {temperature: 0.7}); the "
                             "seed is the recipe's seed (docs/sampling.md)")
        return data

    @model_validator(mode="before")
    @classmethod
    def _gate_needs_a_threshold(cls, data):
        """The paper's ``gate`` names the lead as Eq. 5's gate: it needs a threshold (a stored null is no gate)."""
        if isinstance(data, dict) and "gate" in data:
            if data["gate"] is None:
                return {k: v for k, v in data.items() if k != "gate"}
            if data.get("threshold") is None:
                raise ValueError("a gate needs a threshold (0..1)")
        return data

    @field_validator("weights")
    @classmethod
    def _positive_sum(cls, value):
        if isinstance(value, list) and (problem := weights_problem(value)) is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _consistent(self):
        if self.weights in ("score", "score_minus_ece") and self.scores is None:
            raise ValueError(f"weights '{self.weights}' needs 'scores' (one per member)")
        if self.weights == "score_minus_ece" and self.ece is None:
            raise ValueError("weights 'score_minus_ece' needs 'ece' (one per member)")
        return self


def resolve_weights(params: GacParams, count: int) -> list[float]:
    if isinstance(params.weights, list):
        weights = params.weights
    elif params.weights is None:
        weights = [1.0] * count
    elif params.weights == "score":
        weights = list(params.scores or [])
    else:
        weights = [s - e for s, e in zip(params.scores or [], params.ece or [])]
    lists = [("weights", weights), ("scores", params.scores), ("ece", params.ece)]
    for name, values in lists:
        if values is not None and len(values) != count:
            raise UserError(f"method.{name}: expected {count} values (one per member), got {len(values)}")
    if (problem := weights_problem(weights)) is not None:
        raise UserError(f"method.weights: resolved {problem}, got {weights}")
    return weights


def resolve_lead(params: GacParams, labels: Sequence[str]) -> int:
    return resolve_member(params.lead, labels, params.lead_spelling)


@register_method
class GacSpec(MethodSpec):
    name = "gac"
    implementation = "ensemble_bench.methods.gac:Gac"
    family = "token_level"
    Params = GacParams
    choice_scoring = "GaC scores an option by the weighted average of its members' sequence probabilities"
    inert_on_choices = frozenset({*CoreParams.model_fields, *SpeculativeParams.model_fields, *WindowParams.model_fields,
                                  "lead", "threshold", "retokenize"})
    min_members = 2
    samples = True
    retired = RETIRED
    lead_param = "lead"

    @classmethod
    def check_members(cls, params: GacParams, labels: Sequence[str]) -> None:
        resolve_weights(params, len(labels))
        resolve_proposer(params, labels, resolve_lead(params, labels))

    @classmethod
    def speculative_sampling_problem(cls, params: GacParams) -> str | None:
        """Sampled speculation verifies drafts as union entries (decoding/speculative_sampling.py): not with
        a gate (a gated step's unit is the gate's token), CoRE (another fusion) or proposer: auto (chosen by
        measured speed: the draws would depend on the clock)."""
        if params.threshold is not None or params.core:
            return "with speculative and a threshold or CoRE decodes greedily only"
        if params.proposer == AUTO:
            return "with speculative and proposer: auto decodes greedily only (name the proposer)"
        return None
