"""The declaration of ``adafuse`` (word spans whose length the top-1 margin decides; its work:
adafuse.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ensemble_bench.methods.registry import register_method
from ensemble_bench.methods.span_params import SPAN_CHOICES, SpanParams, SpanSpec


class AdaFuseParams(SpanParams):
    theta_delta: float = Field(default=0.7, ge=0.0, le=1.0, description=(
        "theta_Delta: a word's first token is confident when its top-1 margin p(1) - p(2) is at least this"))
    max_words: int = Field(default=3, ge=1, le=64, description=(
        "M: the most words a confident member commits in one round"))
    beam_size: int = Field(default=3, ge=1, le=32, description=(
        "B: candidate words an uncertain member explores (its B most likely first tokens, each completed "
        "greedily); 1: no exploration"))
    commit_rule: Literal["paper", "code"] = Field(default="paper", description=(
        "paper: the first uncertain word ends the span and is explored (Figure 1); code: the authors' script, "
        "which explores an uncertain first word, takes an uncertain second word greedily, and explores word M "
        "of a span confident at its first two words"))
    word_unit: Literal["boundaries", "whitespace"] = Field(default="boundaries", description=(
        "boundaries: a word ends where every member's tokenizer starts one (punctuation is a word of its own); "
        "whitespace: the authors' script's unit, a word ends where whitespace begins (punctuation stays on its word)"))


@register_method
class AdaFuseSpec(SpanSpec):
    name = "adafuse"
    implementation = "ensemble_bench.methods.adafuse:AdaFuse"
    Params = AdaFuseParams
    choice_scoring = SPAN_CHOICES
    inert_on_choices = frozenset(AdaFuseParams.model_fields)
