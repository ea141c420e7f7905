"""CoRE's parameters (``core: true`` on a method that fuses aligned distributions), shared by every
method that opts in; the fusion itself: core.py."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from ensemble_bench.decoding.params import MethodParams

# The rbf filter divides by 1 - exp(-beta), computed in float64 (``token_filter``). Doubles below 1 are
# 2**-53 apart, so exp(-beta) ~ 1 - beta rounds to 1.0 once beta <= 2**-54 (half that spacing; the tie
# rounds to even, 1.0): the divisor is then 0 and every s_t is 0/0 = NaN. Just above it the filter is
# finite (a coarse step, s_t in {0, 1}). Refused when the recipe is read (``rbf_beta_problem``).
RBF_BETA_FLOOR = 2.0 ** -54
FILTER_PARAMS = {"rbf": "core_beta", "power": "core_alpha", "reciprocal": "core_gamma", "sigmoid": "core_k"}


class CoreParams(MethodParams):
    """CoRE's parameters, shared by every method that opts in."""

    core: bool = Field(default=False, description=(
        "CoRE (arXiv 2510.13855): token- and model-level consistency on the fusion step"))
    core_token: bool = Field(default=True, description=(
        "CoRE token-level consistency: the low-pass filter s_t = f(|p_i - p*|) on the non-lead members"))
    core_model: bool = Field(default=True, description=(
        "CoRE model-level consistency: member weights ~ sum_v s_t(v) / H(p_i)"))
    core_filter: Literal["rbf", "linear", "power", "reciprocal", "sigmoid"] = Field(default="rbf", description=(
        "CoRE's f(delta): rbf (exp(-beta d) - exp(-beta)) / (1 - exp(-beta)), linear 1 - d, power (1 - d)^alpha, "
        "reciprocal 1 / (1 + gamma d), sigmoid 1 - sigmoid(k (d - 0.5))"))
    core_beta: float = Field(default=2.0, gt=0.0, description="CoRE rbf filter: beta")
    core_alpha: float = Field(default=5.0, gt=0.0, description="CoRE power filter: alpha")
    core_gamma: float = Field(default=1.0, gt=0.0, description="CoRE reciprocal filter: gamma")
    core_k: float = Field(default=5.0, gt=0.0, description="CoRE sigmoid filter: k")
    core_rules: Literal["paper", "official"] = Field(default="paper", description=(
        "official: the authors' code's rules (scores on the member's and the lead's support only, rescaled to "
        "mean 1; lead weight >= the others' sum)"))

    @model_validator(mode="after")
    def _core_fields(self):
        given = [name for name in self.model_fields_set if name.startswith("core_")]
        if given and not self.core:
            raise ValueError(f"'{sorted(given)[0]}' applies only with core: true")
        if self.core and not (self.core_token or self.core_model):
            raise ValueError("core: true needs core_token or core_model (or set core: false)")
        strength = {name for name in FILTER_PARAMS.values() if name in self.model_fields_set}
        if strength - {FILTER_PARAMS.get(self.core_filter)}:
            raise ValueError(f"'{sorted(strength)[0]}' does not apply to core_filter '{self.core_filter}'")
        if self.core and self.core_filter == "rbf" and (problem := rbf_beta_problem(self.core_beta)):
            raise ValueError(problem)
        return self


def rbf_divisor(beta: float) -> float:
    """1 - exp(-beta), the rbf filter's divisor, as ``token_filter`` (core.py) computes it (float64)."""
    return 1 - math.exp(-beta)


def rbf_beta_problem(beta: float) -> str | None:
    """Why ``core_beta`` makes the rbf filter NaN at every token (its divisor rounds to 0), or None."""
    if rbf_divisor(beta) != 0:
        return None
    return (f"core_beta {beta:g} makes the rbf filter 0/0 (NaN) at every token: exp(-core_beta) rounds to 1 in "
            f"float64, so its divisor 1 - exp(-core_beta) is 0; core_beta must be above {RBF_BETA_FLOOR:.3g} (2**-54)")
