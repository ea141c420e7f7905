"""The declaration of ``coolfusion`` (segments to word boundaries common to all tokenizers, chosen by
mutual perplexity; its work: coolfusion.py)."""

from __future__ import annotations

from pydantic import Field

from ensemble_bench.methods.registry import register_method
from ensemble_bench.methods.span_params import SPAN_CHOICES, SpanParams, SpanSpec


class CoolFusionParams(SpanParams):
    align: bool = Field(default=True, description=(
        "segments end at word boundaries common to all tokenizers (false: the proposer's own, Cool-align)"))
    rerank: bool = Field(default=False, description=(
        "Cool+Rerank: the fused answer and every member's own answer reranked by perplexity"))


@register_method
class CoolFusionSpec(SpanSpec):
    name = "coolfusion"
    implementation = "ensemble_bench.methods.coolfusion:CoolFusion"
    Params = CoolFusionParams
    choice_scoring = SPAN_CHOICES
    inert_on_choices = frozenset(CoolFusionParams.model_fields)
