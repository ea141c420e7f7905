"""The declaration of ``mbr`` (minimum Bayes risk with chrF over the members' answers; its work: mbr.py)."""

from __future__ import annotations

from ensemble_bench.methods.registry import register_method
from ensemble_bench.methods.sample_level_params import SampleLevelSpec


@register_method
class MbrSpec(SampleLevelSpec):
    name = "mbr"
    implementation = "ensemble_bench.methods.mbr:Mbr"
