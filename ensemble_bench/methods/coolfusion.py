"""Cool-Fusion — "Cool-Fusion: Fuse Large Language Models without Training"
(arXiv 2407.19807).

Each round every member generates until its new text ends at a word boundary common to ALL
members' tokenizers (Sec. 2.1-2.2: the segment is a concatenation of a prefix of every member's
word sequence, the last, possibly incomplete, word excluded; word boundaries are defined in
vocab/words.py); every member scores every segment by perplexity (Eq. 2); the lowest average
perplexity wins (Eq. 3); all members append it (methods/span_level.py).

Variants: ``align: false`` ends each member's segment at its own word boundaries (the paper's
Cool-align ablation); ``rerank: true`` is Cool+Rerank: Cool-Fusion's answer and every member's
own complete answer are reranked by average perplexity (the ``rerank`` method's scorer).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from pydantic import Field

from ensemble_bench.decoding.method import Generation, GenerationRequest, MethodParams
from ensemble_bench.members.base import Member
from ensemble_bench.methods.scorers import PerplexityScorer
from ensemble_bench.methods.single import Single
from ensemble_bench.methods.span_level import SPAN_CHOICES, SpanMethod, SpanParams


class CoolFusionParams(SpanParams):
    align: bool = Field(default=True, description=(
        "segments end at word boundaries common to all tokenizers (false: the proposer's own, Cool-align)"))
    rerank: bool = Field(default=False, description=(
        "Cool+Rerank: the fused answer and every member's own answer reranked by perplexity"))


class CoolFusion(SpanMethod):
    name = "coolfusion"
    Params = CoolFusionParams
    choice_scoring = SPAN_CHOICES
    inert_on_choices = frozenset(CoolFusionParams.model_fields)

    def __init__(self, members: Sequence[Member], params: CoolFusionParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        self.reranker = PerplexityScorer(members, batch_size) if params.rerank else None

    def _segment_end(self, proposer: int, text: str, tokens: list[int], picked_from: list[torch.Tensor]) -> int | None:
        ends = self._common_ends(text) if self.params.align else self.members[proposer].word_starts(text)
        return ends[-1] if ends else None

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        fused = super().generate(requests)
        if self.reranker is None:
            return fused
        alone = [Single([m], MethodParams(), self.batch_size).generate(requests) for m in self.members]
        results = []
        for i, request in enumerate(requests):
            candidates = [fused[i]] + [a[i] for a in alone]
            # the fused answer first: it wins ties
            results.append(candidates[self.reranker.choose(request.prompt, [c.text for c in candidates], 0)])
        return results
