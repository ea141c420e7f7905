"""MBR with chrF, the DeePEn paper's baseline for free-form generation (DeePEn Sec. 4.1, App. B):
each member answers alone; the answer with the highest mean chrF against the other answers wins
(minimum Bayes risk with chrF as the utility); ties go to the main model's answer.

Multiple-choice (log-likelihood) questions have a fixed answer set, where the MBR choice with an
exact-match utility is the vote: they are decided as VOTING decides them.
"""

from __future__ import annotations

from sacrebleu.metrics import CHRF

from ensemble_bench.decoding.method import GenerationRequest
from ensemble_bench.methods.mbr_params import MbrSpec
from ensemble_bench.methods.sample_level import SampleLevel

_CHRF = CHRF()


def mbr_scores(texts: list[str]) -> list[float]:
    """Mean chrF of each text against every other text."""
    scores = []
    for i, hypothesis in enumerate(texts):
        others = [t for j, t in enumerate(texts) if j != i]
        scores.append(sum(_CHRF.sentence_score(hypothesis, [o]).score for o in others) / len(others))
    return scores


class Mbr(MbrSpec, SampleLevel):

    def _choose(self, texts: list[str], request: GenerationRequest) -> int:
        scores = mbr_scores(texts)
        best = max(scores)
        return self.lead if scores[self.lead] == best else scores.index(best)
