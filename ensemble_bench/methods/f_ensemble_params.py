"""The declaration of ``f_ensemble`` (f-ensembles: the members' next-byte probabilities combined by an
operator f on byte_level's covering loop; its work: f_ensemble.py)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from ensemble_bench.methods.byte_level_params import ByteLevelParams, ByteLevelSpec
from ensemble_bench.methods.registry import register_method

Operator = Literal["sum", "product", "min", "max", "power_mean"]


class FEnsembleParams(ByteLevelParams):
    operator: Operator = Field(default="product", description=(
        "f, combining the members' next-byte probabilities: sum, product, min, max or power_mean"))
    exponent: float | None = Field(default=None, description="r of power_mean (finite, not 0); only with it")
    particles: int = Field(default=1, ge=1, le=4096, description=(
        "N, sequential Monte Carlo particles per request that samples (arXiv 2603.05432 Sec. 4; each a row "
        "of the batch); 1: no SMC, each byte drawn from the locally normalised q"))
    ess_threshold: float = Field(default=0.5, ge=0.0, le=1.0, description=(
        "resample a request's live particles when their effective sample size falls below this fraction "
        "of their number (0: never, 1: every byte); only with particles > 1"))

    @model_validator(mode="after")
    def _exponent_with_power_mean(self):
        if self.operator == "power_mean":
            if self.exponent is None or not math.isfinite(self.exponent) or self.exponent == 0:
                raise ValueError("operator power_mean needs a finite exponent other than 0 (0 is product)")
        elif self.exponent is not None:
            raise ValueError(f"exponent applies to operator power_mean only, not {self.operator}")
        return self


@register_method
class FEnsembleSpec(ByteLevelSpec):
    name = "f_ensemble"
    implementation = "ensemble_bench.methods.f_ensemble:FEnsemble"
    family = "sampling_ensembles"
    Params = FEnsembleParams
    version = 1
    samples = True
