"""SweetSpan — "Hit the Sweet Spot! Span-Level Ensemble for Large Language Models"
(arXiv 2409.18583).

Each round every member proposes a span of ``span_words`` complete words from the shared prefix
(words end at boundaries common to all members' tokenizers, vocab/words.py); every member scores
every span by length-normalised perplexity (Sec. 2.2); for each span, if max/min of its scores
exceeds ``lambda`` its highest and lowest scores are dropped (R_j, C_j); the span with the lowest
mean of the kept scores wins. With two members both scores would go; then both are kept.
"""

from __future__ import annotations

import torch
from pydantic import AliasChoices, Field

from ensemble_bench.methods.span_level import SPAN_CHOICES, SpanMethod, SpanParams


class SweetSpanParams(SpanParams):
    span_words: int = Field(default=4, ge=1, le=256, description="words per span (the paper sweeps 1, 2, 4, 8, "
                            "16, 32)")
    filter_ratio: float = Field(default=10.0, gt=0.0, validation_alias=AliasChoices("lambda", "filter_ratio"),
                                serialization_alias="lambda", description=(
                                    "lambda: a span whose max/min score exceeds it drops both (the paper: 10)"))


def filter_scores(scores: list[float], ratio: float) -> list[bool]:
    """Which of one span's scores are kept: all, or all but the max and min when max/min > ratio."""
    if len(scores) <= 2 or max(scores) <= ratio * min(scores):
        return [True] * len(scores)
    high, low = scores.index(max(scores)), scores.index(min(scores))
    return [k not in (high, low) for k in range(len(scores))]


def choose_span(table: list[list[float]], ratio: float) -> tuple[int, list[list[bool]]]:
    """The span with the lowest mean of its kept scores (ties: the first)."""
    kept = [filter_scores(scores, ratio) for scores in table]
    means = [sum(s for s, k in zip(scores, keep) if k) / sum(keep) for scores, keep in zip(table, kept)]
    return means.index(min(means)), kept


class SweetSpan(SpanMethod):
    name = "sweetspan"
    Params = SweetSpanParams
    choice_scoring = SPAN_CHOICES
    inert_on_choices = frozenset(SweetSpanParams.model_fields)

    def _segment_end(self, proposer: int, text: str, tokens: list[int], picked_from: list[torch.Tensor]) -> int | None:
        return self._word_end(text, self.params.span_words)

    def _choose(self, table: list[list[float]]) -> tuple[int, list[list[bool]]]:
        return choose_span(table, self.params.filter_ratio)
