"""CoRE's parameters (``core: true`` on a method that fuses aligned distributions), shared by every
method that opts in; the fusion itself: core.py."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ensemble_bench.decoding.params import MethodParams

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
        return self
