"""The declaration of ``rerank`` (the members' answers reranked by a scorer; its work: rerank.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ensemble_bench.methods.registry import register_method
from ensemble_bench.methods.sample_level_params import SampleLevelParams, SampleLevelSpec


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


@register_method
class RerankSpec(SampleLevelSpec):
    name = "rerank"
    implementation = "ensemble_bench.methods.rerank:Rerank"
    Params = RerankParams
    inert_on_choices = frozenset(RerankParams.model_fields) - {"lead"}

    @classmethod
    def packages(cls, params: RerankParams) -> dict[str, str]:
        return {"llm_blender": "llm-blender"} if params.scorer_backend == "llm-blender" else {}

    @classmethod
    def models(cls, params: RerankParams) -> tuple[str, ...]:
        return (params.scorer_model,) if params.scorer_model and params.scorer_backend == "transformers" else ()
