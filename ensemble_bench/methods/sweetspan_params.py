"""The declaration of ``sweetspan`` (spans of N words, mutual perplexity, the lambda filter; its work:
sweetspan.py)."""

from __future__ import annotations

from pydantic import AliasChoices, Field

from ensemble_bench.methods.registry import register_method
from ensemble_bench.methods.span_params import SPAN_CHOICES, SpanParams, SpanSpec


class SweetSpanParams(SpanParams):
    span_words: int = Field(default=4, ge=1, le=256, description="words per span (the paper sweeps 1, 2, 4, 8, "
                            "16, 32)")
    filter_ratio: float = Field(default=10.0, gt=0.0, validation_alias=AliasChoices("lambda", "filter_ratio"),
                                serialization_alias="lambda", description=(
                                    "lambda: a span whose max/min score exceeds it drops both (the paper: 10)"))


@register_method
class SweetSpanSpec(SpanSpec):
    name = "sweetspan"
    implementation = "ensemble_bench.methods.sweetspan:SweetSpan"
    Params = SweetSpanParams
    choice_scoring = SPAN_CHOICES
    inert_on_choices = frozenset(SweetSpanParams.model_fields)
