"""The declaration of ``voting`` (the most frequent answer wins; its work: voting.py)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from ensemble_bench.methods.registry import register_method
from ensemble_bench.methods.sample_level_params import SampleLevelParams, SampleLevelSpec


class VotingParams(SampleLevelParams):
    answer: str = Field(default="auto", description=(
        "how answers are compared: auto (a final number, a letter, the first line), text, or a regular expression"))

    @field_validator("answer")
    @classmethod
    def _compiles(cls, value: str) -> str:
        if value not in ("auto", "text"):
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"not a valid regular expression: {err}") from None
        return value


@register_method
class VotingSpec(SampleLevelSpec):
    name = "voting"
    implementation = "ensemble_bench.methods.voting:Voting"
    Params = VotingParams
    inert_on_choices = frozenset({"answer"})
