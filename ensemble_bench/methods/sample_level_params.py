"""What every sample-level method declares (each member answers alone, one answer is chosen; the work:
sample_level.py)."""

from __future__ import annotations

from collections.abc import Sequence

from ensemble_bench.decoding.params import MethodParams, MethodSpec, lead_field, resolve_member


class SampleLevelParams(MethodParams):
    lead: int | str = lead_field(0, "whose answer wins ties (the paper's main model)", "main")


class SampleLevelSpec(MethodSpec):
    Params = SampleLevelParams
    family = "sample_level"
    min_members = 2
    samples = True  # each member samples its own answer (``own_draws``)
    lead_param = "lead"
    choice_scoring = "each member picks its most likely option and the most picked wins (ties: the lead's)"

    @classmethod
    def check_members(cls, params: SampleLevelParams, labels: Sequence[str]) -> None:
        resolve_member(params.lead, labels, params.lead_spelling)
