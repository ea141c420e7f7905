"""``rerank``: every member answers alone; the complete answers are reranked by a scorer.

Scorer ``perplexity`` (Cool-Fusion's "Rerank" baseline, arXiv 2407.19807 Sec. 3; the
sample-level baseline of GaC Table 3): every member scores every candidate answer given the
prompt, with its own tokenisation and chat template, as the perplexity of the answer's tokens
(Eq. 1-2: exp of the mean negative log-probability; the paper calls perplexity "an average
value", its printed formula lost the 1/n); the answer with the lowest average perplexity over
the members wins (Eq. 3). An empty answer is never chosen unless all are.

Scorers ``reward`` and ``pairwise`` (GaC Table 3's OAssistRM / UltraRM and PairRanker rows) use a
sequence-classification model (``scorer_model``: hub id or local path), or with ``scorer_backend:
llm-blender`` a ranker loaded by the llm-blender package (PairRanker, PairRM, UltraRM); see ``scorers.py``. The
scorer runs once per request; its time is part of the method's decode time, so ms/token covers
the whole pipeline (members' generation one after another, then scoring).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from ensemble_bench.decoding.method import GenerationRequest
from ensemble_bench.members.base import Member
from ensemble_bench.methods.sample_level import SampleLevel, SampleLevelParams, SampleReport
from ensemble_bench.methods.scorers import (
    DEFAULT_PAIR_TEMPLATE,
    BlenderRanker,
    Classifier,
    ClassifierComparator,
    ClassifierReward,
    PairwiseScorer,
    PerplexityScorer,
    RewardScorer,
)


class RerankParams(SampleLevelParams):
    scorer: Literal["perplexity", "reward", "pairwise"] = Field(default="perplexity", description=(
        "perplexity: the members' mean perplexity (Cool-Fusion's Rerank); reward or pairwise: a classifier"))
    scorer_model: str | None = Field(default=None, description=(
        "reward / pairwise: a sequence-classification model (hub id or local path)"))
    scorer_template: str | None = Field(default=None, description=(
        'reward: "{prompt}...{response}"; pairwise: "{prompt}...{a}...{b}"'))
    scorer_backend: Literal["transformers", "llm-blender"] = Field(default="transformers", description=(
        "llm-blender: its loadranker"))
    scorer_device: str = Field(default="cpu", description="the scorer model's device")
    scorer_dtype: Literal["float32", "bfloat16", "float16"] = Field(default="float32", description=(
        "the scorer model's dtype"))

    @model_validator(mode="after")
    def _model_when_needed(self):
        if (self.scorer == "perplexity") != (self.scorer_model is None):
            raise ValueError("scorer_model is required by the reward and pairwise scorers and "
                             "not taken by the perplexity scorer")
        fields = {"reward": ("{prompt}", "{response}"), "pairwise": ("{prompt}", "{a}", "{b}")}.get(self.scorer, ())
        if self.scorer_backend == "llm-blender" and (self.scorer == "perplexity" or self.scorer_template):
            raise ValueError("scorer_backend llm-blender takes a reward or pairwise scorer and formats inputs itself")
        if self.scorer_template is not None and not all(f in self.scorer_template for f in fields):
            raise ValueError(f"scorer_template of the {self.scorer} scorer must contain {' '.join(fields)}")
        return self


@dataclass(frozen=True, kw_only=True)
class RerankReport(SampleReport):
    scorer: str


class Rerank(SampleLevel):
    name = "rerank"
    Params = RerankParams
    inert_on_choices = frozenset(RerankParams.model_fields) - {"lead"}

    @classmethod
    def packages(cls, params: RerankParams) -> dict[str, str]:
        return {"llm_blender": "llm-blender"} if params.scorer_backend == "llm-blender" else {}

    @classmethod
    def models(cls, params: RerankParams) -> tuple[str, ...]:
        return (params.scorer_model,) if params.scorer_model and params.scorer_backend == "transformers" else ()

    def __init__(self, members: Sequence[Member], params: RerankParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        if params.scorer == "perplexity":
            self.scorer = PerplexityScorer(members, batch_size)
            return
        if params.scorer_backend == "llm-blender":
            ranker = BlenderRanker(params.scorer_model, params.scorer_device)
            self.scorer = RewardScorer(ranker) if params.scorer == "reward" else PairwiseScorer(ranker)
            return
        classifier = Classifier(params.scorer_model, params.scorer_device, params.scorer_dtype)
        if params.scorer == "reward":
            self.scorer = RewardScorer(ClassifierReward(classifier, params.scorer_template))
        else:
            template = params.scorer_template or DEFAULT_PAIR_TEMPLATE
            self.scorer = PairwiseScorer(ClassifierComparator(classifier, template))

    def _choose(self, texts: list[str], request: GenerationRequest) -> int:
        start = time.perf_counter()
        choice = self.scorer.choose(request.prompt, texts, self.lead)
        self.stats.scoring_seconds += time.perf_counter() - start
        return choice

    def statistics(self) -> RerankReport:
        return RerankReport(**vars(super().statistics()), scorer=self.params.scorer)
