"""What every span-level method declares (members propose segments of words, every member scores
each; the work: span_level.py)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from ensemble_bench.decoding.params import MethodParams, MethodSpec, Retokenize, lead_field, resolve_member

SPAN_CHOICES = "span-level methods score an option by their members' mean log-likelihood (no spans, no lead)"


class SpanParams(MethodParams):
    lead: int | str = lead_field(0, "renders the text, counts the token budget, wins ties", "main")
    retokenize: Retokenize = Field(default="canonical", description=(
        "how members take a winner they did not propose (docs/retokenize.md): local, the segment encoded on its "
        "own; canonical, the text re-encoded back to the last hard boundary (the papers: each model encodes the "
        "committed text with its own tokenizer)"))


class SpanSpec(MethodSpec):
    Params = SpanParams
    family = "span_level"
    min_members = 2
    lead_param = "lead"
    version = 2  # 2: a segment cut by ``until`` or the budget is not scored with a stop at its end

    @classmethod
    def check_members(cls, params: SpanParams, labels: Sequence[str]) -> None:
        resolve_member(params.lead, labels, params.lead_spelling)
