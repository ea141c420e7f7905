"""The declaration of ``eva`` (a vocabulary map learned from the shared tokens, unfaithful members filtered
out; its work: eva.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from ensemble_bench.decoding.params import lead_field, resolve_proposer
from ensemble_bench.methods.core_params import CoreParams
from ensemble_bench.methods.registry import register_method
from ensemble_bench.methods.token_level_params import EmitterParams, EmitterSpec


class EvaParams(EmitterParams, CoreParams):
    lead: int | str | None = lead_field(None, (
        "the main (pivot) model: its vocabulary is the common space and it emits; null: the member with the "
        "largest vocabulary (the paper's pivot; the first of equals)"), "main")
    top_k: int = Field(default=320, ge=1, le=1_000_000, description=(
        "each member's distribution keeps its top-k tokens before the softmax (the authors' code: 320)"))
    n: int | None = Field(default=5, ge=1, le=1_000_000, description=(
        "faithfulness filter (Sec. 3.2): a member whose top token is in no other member's top-n is left out of "
        "the step (all are kept when none would be); null: no filter, every member averaged"))
    top_t: int = Field(default=10, ge=1, le=1000, description=(
        "noise reduction (Sec. 3.1): each auxiliary token maps to at most its t most similar lead tokens"))
    threshold: float = Field(default=0.1, allow_inf_nan=False, description=(
        "noise reduction: similarity scores below it are dropped"))
    variance: float = Field(default=0.01, ge=0.0, allow_inf_nan=False, description=(
        "noise reduction: a token keeping more than 5 lead tokens whose scores spread (std) no more than this "
        "maps nowhere"))
    neighborhood: int = Field(default=1, ge=1, le=1000, description=(
        "CSLS neighbourhood: the lead tokens' hubness is their mean similarity to this many nearest auxiliary "
        "tokens (the authors' script: 1)"))
    overlap: Literal["learned", "direct"] = Field(default="learned", description=(
        "learned: shared tokens too map through the learned similarity, as the authors' code; direct: a shared "
        "token maps to itself with weight 1 (a member ensembled with itself is then the member alone)"))


@register_method
class EvaSpec(EmitterSpec):
    name = "eva"
    implementation = "ensemble_bench.methods.eva:Eva"
    Params = EvaParams

    @classmethod
    def check_members(cls, params: EvaParams, labels: Sequence[str]) -> None:
        if params.lead is None:  # the pivot is known once the members' vocabularies are
            resolve_proposer(params, labels, 0)
        else:
            super().check_members(params, labels)
