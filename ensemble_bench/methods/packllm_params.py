"""The declaration of ``packllm`` (per-prompt weights from perplexity, logits fused on the top-1 expert's
vocabulary; its work: packllm.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, model_validator

from ensemble_bench.decoding.params import MethodSpec, SpeculativeParams, WindowParams, resolve_proposer
from ensemble_bench.methods.core_params import CoreParams
from ensemble_bench.methods.registry import register_method

SIM_ONLY, OPT_ONLY = ("tau",), ("grid",)
LEAD = 0  # whose decode renders the text (the method has no parameter naming it)


class PackLLMParams(WindowParams, SpeculativeParams, CoreParams):
    variant: Literal["sim", "opt"] = Field(default="sim", description="PackLLM-sim or PackLLM-opt (Sec. 3)")
    tau: float = Field(default=1.0, gt=0.0, description="PackLLM-sim temperature (paper: 1)")
    grid: int = Field(default=20, ge=1, le=1000, description="PackLLM-opt: a in steps of 1/grid (paper: 0.05)")
    ppl_unit: Literal["token", "byte"] = Field(default="token", description=(
        "log perplexity per member token (paper) or per prompt byte"))
    alignment: Literal["union", "mined"] = Field(default="mined", description=(
        "fusion space: mined, the row's top-1 expert's vocabulary (paper); union, bytes"))
    score_from: Literal["prefix", "second_token"] = Field(default="prefix", description=(
        "the prompt's perplexity: prefix, every prompt token scored, the first after the member's prefix "
        "token (BOS); second_token, the paper's code: no prefix token, scoring starts at the second token"))
    ppl_reading: Literal["own", "expert_tokens"] = Field(default="own", description=(
        "whose tokens each member's prompt perplexity is read on: own, its own tokenisation; expert_tokens, "
        "the paper's code: the top-1 expert's tokens, MinED-mapped (mined alignment only)"))

    @model_validator(mode="after")
    def _expert_reading_needs_mined(self):
        if self.ppl_reading == "expert_tokens" and (self.alignment != "mined" or self.ppl_unit != "token"):
            raise ValueError("ppl_reading 'expert_tokens' needs alignment 'mined' and ppl_unit 'token'")
        return self

    @model_validator(mode="after")
    def _variant_fields(self):
        unused = OPT_ONLY if self.variant == "sim" else SIM_ONLY
        given = [name for name in unused if name in self.model_fields_set]
        if given:
            raise ValueError(f"'{given[0]}' does not apply to variant '{self.variant}'")
        return self


@register_method
class PackLLMSpec(MethodSpec):
    name = "packllm"
    implementation = "ensemble_bench.methods.packllm:PackLLM"
    family = "token_level"
    Params = PackLLMParams
    choice_scoring = ("PackLLM scores an option by its members' sequence probabilities mixed with the prompt's "
                      "perplexity weights")
    inert_on_choices = frozenset({*CoreParams.model_fields, *SpeculativeParams.model_fields,
                                  *WindowParams.model_fields})
    min_members = 2
    samples = True

    @classmethod
    def packages(cls, params: PackLLMParams) -> dict[str, str]:
        return {"rapidfuzz": "rapidfuzz"} if params.alignment == "mined" else {}  # MinED's edit distances

    @classmethod
    def check_members(cls, params: PackLLMParams, labels: Sequence[str]) -> None:
        resolve_proposer(params, labels, LEAD)
