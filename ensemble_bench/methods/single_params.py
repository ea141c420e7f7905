"""The declaration of ``single`` (one member alone; its work: single.py)."""

from __future__ import annotations

from ensemble_bench.decoding.params import MethodSpec
from ensemble_bench.methods.registry import register_method


@register_method
class SingleSpec(MethodSpec):
    name = "single"
    implementation = "ensemble_bench.methods.single:Single"
    family = "sample_level"
    alone = True
    max_members = 1
    samples = True
