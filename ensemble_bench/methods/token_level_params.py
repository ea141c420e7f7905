"""What the emitter methods declare (UniTE, DeePEn, EVA: the lead member emits, the others follow its
text; the work: token_level.py)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from ensemble_bench.decoding.params import (
    MethodSpec,
    Retokenize,
    SpeculativeParams,
    WindowParams,
    resolve_member,
    resolve_proposer,
)


class EmitterParams(WindowParams, SpeculativeParams):
    retokenize: Retokenize = Field(default="canonical", description=(
        "how the other members take the lead's token (docs/retokenize.md): canonical re-encodes the text every "
        "step, as the UniTE and DeePEn reference code do; local encodes the new bytes on their own"))


class EmitterSpec(MethodSpec):
    Params = EmitterParams
    family = "token_level"
    min_members = 2
    samples = True
    lead_param = "lead"
    choice_scoring = "options are scored teacher-forced through the method's own step, with no drafting"
    inert_on_choices = frozenset(SpeculativeParams.model_fields)  # drafting is for generation

    @classmethod
    def check_members(cls, params: EmitterParams, labels: Sequence[str]) -> None:
        resolve_proposer(params, labels, resolve_member(params.lead, labels, params.lead_spelling))
