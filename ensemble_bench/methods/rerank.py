"""``rerank``: every member answers alone; the complete answers are reranked by a scorer.

Scorer ``perplexity`` (Cool-Fusion's "Rerank" baseline, shared/papers/002_*.txt Sec. 3; the
sample-level baseline of GaC Table 3): every member scores every candidate answer given the
prompt, with its own tokenisation and chat template, as the perplexity of the answer's tokens
(Eq. 1-2: exp of the mean negative log-probability; the paper calls perplexity "an average
value", its printed formula lost the 1/n); the answer with the lowest average perplexity over
the members wins (Eq. 3), ties to the main model. An empty answer is never chosen unless all are.
"""

from __future__ import annotations

import math
from typing import Literal

from ensemble_bench.methods.base import GenerationRequest
from ensemble_bench.methods.sample_level import SampleLevel, SampleLevelParams


class RerankParams(SampleLevelParams):
    scorer: Literal["perplexity"] = "perplexity"


def perplexity(logprob: float, tokens: int) -> float:
    """Eq. 2: exp(-(1/n) sum log p); an empty answer has no perplexity (inf, never chosen)."""
    return math.exp(-logprob / tokens) if tokens else math.inf


class Rerank(SampleLevel):
    name = "rerank"
    Params = RerankParams

    def _choose(self, texts: list[str], request: GenerationRequest) -> int:
        averages = self.average_perplexities(texts, request)
        best = min(averages)
        return self.main if averages[self.main] == best else averages.index(best)

    def average_perplexities(self, texts: list[str], request: GenerationRequest) -> list[float]:
        """Eq. 3's objective for each candidate: the mean over members of its perplexity."""
        totals = [0.0] * len(texts)
        scored = [k for k, text in enumerate(texts) if text]
        for member in self.members:
            context = member.render_text(request.prompt)
            pairs = [member.encode_pair(context, texts[k]) for k in scored]
            scores = member.score(pairs, batch_size=self.batch_size) if pairs else []
            for k, (_, continuation), score in zip(scored, pairs, scores):
                totals[k] += perplexity(score.logprob, len(continuation)) / len(self.members)
        return [total if k in scored else math.inf for k, total in enumerate(totals)]
