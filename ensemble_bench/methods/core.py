"""CoRE — "Harnessing Consistency for Robust Test-Time LLM Ensemble" (Zeng et al., EACL 2026,
arXiv 2510.13855): a plug-in on the fusion step of a token-level method (docs/methods_token_level.md).

A method that fuses its members' aligned next-token distributions p_i (each row of a common space:
GaC's union, UniTE's V^u, PackLLM's expert vocabulary, EVA's projection) hands them to
``CoreFusion.fuse`` instead of averaging them itself:

    p*       = (1/N) sum_i p_i                           the reference (barycentre) distribution
    delta_i  = |p_i - p*|                                each token's disparity
    s_t_i    = f(delta_i)                                token-level consistency, a low-pass filter
                                                         (f(0) = 1, falling to 0 as delta -> 1)
    s_m_i    = sum_v s_t_i(v) / H(p_i)                   model-level consistency: agreement over
                                                         the space divided by the member's entropy
    w_i      = base_i s_m_i / sum_j base_j s_m_j
    q        = sum_i w_i (s_t_i * p_i)                   only the non-lead members are filtered

These are the equations of the overview figure in the authors' README (zhichenz98/CoRE-EACL26,
assets/overview.png; the paper's equation numbers could not be read here): p* = (p_main + sum_i
p~_i) / (N + 1), delta_i = |p~_i - p*|, s_t_i = f(delta_i), s_m_i = sum_v s_t_i(v) / H(p~_i),
p_ens = s_m_main p_main + sum_i s_m_i (p~_i * s_t_i). The figure leaves p_ens unnormalised; w is
normalised here (the method's base weights times s_m), which changes no argmax.

``core_token`` / ``core_model`` switch either level off (the paper's ablation): without the token
level the p_i enter unfiltered, without the model level w is the method's own weights.

``core_rules: official`` takes the authors' code's rules where it states them differently
(zhichenz98/CoRE-EACL26, src/logits_processor.py): scores only on tokens the member or the lead
gives mass (the rest 0), each member's scores rescaled to mean 1 over those tokens, and the
lead's weight raised to at least the others' sum.

A method opts in with a few lines (docs/adding_a_method.md, section 6): its Params inherit
``CoreParams``; its fusion calls ``self.core.fuse(probs, base_weights, lead)`` when
``self.core = CoreFusion.of(params, len(members))`` is not None; ``counters()`` and ``carried()`` add
the fusion's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import Field, model_validator

from ensemble_bench.decoding.method import MethodParams

EPS = 1e-12  # as the official code: an entropy floor, and "no mass" below it
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
    """1 - exp(-beta), the rbf filter's divisor, as ``token_filter`` computes it (float64)."""
    return 1 - math.exp(-beta)


def rbf_beta_problem(beta: float) -> str | None:
    """Why ``core_beta`` makes the rbf filter NaN at every token (its divisor rounds to 0), or None."""
    if rbf_divisor(beta) != 0:
        return None
    return (f"core_beta {beta:g} makes the rbf filter 0/0 (NaN) at every token: exp(-core_beta) rounds to 1 in "
            f"float64, so its divisor 1 - exp(-core_beta) is 0; core_beta must be above {RBF_BETA_FLOOR:.3g} (2**-54)")


def token_filter(params: CoreParams) -> Callable[[torch.Tensor], torch.Tensor]:
    """f(delta) for delta in [0, 1], elementwise (float64)."""
    kind = params.core_filter
    if kind == "rbf":
        floor, divisor = math.exp(-params.core_beta), rbf_divisor(params.core_beta)
        return lambda d: (torch.exp(-params.core_beta * d) - floor) / divisor
    if kind == "linear":
        return lambda d: 1 - d
    if kind == "power":
        return lambda d: (1 - d).clamp(min=0) ** params.core_alpha
    if kind == "reciprocal":
        return lambda d: 1 / (1 + params.core_gamma * d)
    return lambda d: 1 - torch.sigmoid(params.core_k * (d - 0.5))


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """H of each row [..., C] after normalising it to sum 1 (zero entries add nothing)."""
    p = probs / probs.sum(dim=-1, keepdim=True).clamp(min=EPS)
    return -torch.where(p > 0, p * p.clamp(min=EPS).log(), 0.0).sum(dim=-1)


@dataclass
class CoreStats:
    """Summed over the fused rows: each member's weight w_i, and the share of its mass the filter kept."""

    rows: int = 0
    weight_sums: list[float] = field(default_factory=list)
    kept_sums: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, members: int) -> CoreStats:
        return cls(0, [0.0] * members, [0.0] * members)

    def add(self, weights: torch.Tensor, kept: torch.Tensor) -> None:
        self.rows += weights.shape[0]
        self.weight_sums = [a + b for a, b in zip(self.weight_sums, weights.sum(dim=0).tolist())]
        self.kept_sums = [a + b for a, b in zip(self.kept_sums, kept.sum(dim=0).tolist())]

    def summary(self) -> dict:
        def mean(sums: list[float]) -> list[float] | None:
            return [s / self.rows for s in sums] if self.rows else None

        return {"core_rows": self.rows, "core_weights_mean": mean(self.weight_sums),
                "core_mass_kept_mean": mean(self.kept_sums)}


class CoreFusion:
    """CoRE's fusion for one method's parameters (see the module docstring)."""

    def __init__(self, params: CoreParams, members: int):
        self.params = params
        self.filter = token_filter(params)
        self.official = params.core_rules == "official"
        self.stats = CoreStats.of(members)

    @classmethod
    def of(cls, params: CoreParams, members: int) -> CoreFusion | None:
        """The fusion when ``core: true``, else None (the method fuses as it did)."""
        return cls(params, members) if params.core else None

    def fuse(self, probs: torch.Tensor, base_weights: torch.Tensor, lead: int) -> torch.Tensor:
        """q [rows, C] (float64) from the members' aligned probabilities ``probs`` [N, rows, C] and
        the method's weights ``base_weights`` [rows, N] or [N]; ``lead`` is not filtered."""
        probs = probs.double()
        count, rows = probs.shape[0], probs.shape[1]
        base = base_weights.double().to(probs.device).expand(rows, count)
        scores, agreement = self._token_scores(probs, lead)
        weights = self._model_weights(probs, agreement, base, lead)  # [rows, N]
        filtered = probs
        if self.params.core_token:
            keep = torch.ones(count, dtype=torch.bool, device=probs.device)
            keep[lead] = False
            filtered = torch.where(keep[:, None, None], scores * probs, probs)
        fused = weights[:, 0:1] * filtered[0]
        for i in range(1, count):
            fused = fused + weights[:, i:i + 1] * filtered[i]
        mass = probs.sum(dim=-1).T  # [rows, N]
        self.stats.add(weights.cpu(), torch.where(mass > 0, filtered.sum(dim=-1).T / mass.clamp(min=EPS), 0.0).cpu())
        return fused

    def _token_scores(self, probs: torch.Tensor, lead: int) -> tuple[torch.Tensor, torch.Tensor]:
        """s_t [N, rows, C] = f(|p_i - p*|), and each member's agreement sum_v s_t(v) [rows, N].
        Official: 0 off the member's and the lead's support, the sum taken there, and s_t then
        rescaled to mean 1 over the tokens it is not 0 on."""
        reference = probs.mean(dim=0, keepdim=True)
        scores = self.filter((probs - reference).abs())
        if self.official:
            scores = torch.where((probs + probs[lead:lead + 1]) > EPS, scores, 0.0)
        total = scores.sum(dim=-1, keepdim=True)
        if self.official:
            nonzero = (scores != 0).sum(dim=-1, keepdim=True)
            scores = torch.where(total > 0, scores / total.clamp(min=EPS) * nonzero, 0.0)
        return scores, total.squeeze(-1).T

    def _model_weights(self, probs: torch.Tensor, agreement: torch.Tensor, base: torch.Tensor,
                       lead: int) -> torch.Tensor:
        """w [rows, N]: base_i s_m_i normalised (the base weights alone without the model level);
        a member with no mass in a row gets weight 0 there. Official: then the lead's weight is
        raised to the others' sum."""
        weights = torch.where((probs.sum(dim=-1) > 0).T, base, 0.0)
        if self.params.core_model:
            weights = weights * agreement / (entropy(probs).T + EPS)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.official:
            others = weights.sum(dim=-1) - weights[:, lead]
            weights = weights.clone()
            weights[:, lead] = torch.maximum(weights[:, lead], others)
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights

    def counters(self) -> dict:
        return self.stats.summary()

    def carried(self) -> dict[str, object]:
        return {"core": self.stats}
