"""f-ensembles — "Ensembling Language Models with Sequential Monte Carlo" (Chan et al., arXiv 2603.05432).

The paper composes K members into a distribution over strings by an aggregation f of their string
probabilities, p_f(x) proportional to f(P_1(x), ..., P_K(x)), with f one of: the weighted sum (the
mixture), the product (product of experts), min, max, or a power mean. Members meet on bytes, so
tokenizers need not agree; here on byte_level's covering loop (methods/covering_decoder.py: each
member's exact next-byte distribution M_i(. | x) from its covering tree, plus the end of the text).

ensbench samples the *locally normalised* f-ensemble, one byte at a time:

    q(b | x) = f(M_1(b | x), ..., M_K(b | x)) / sum_b' f(M_1(b' | x), ..., M_K(b' | x))

with, for weights w_i summing to 1 over the members live at x (``operator``):

    sum          sum_i w_i M_i(b)                           (byte_level's average)
    product      prod_i M_i(b)^{w_i}
    min, max     min_i M_i(b), max_i M_i(b)
    power_mean   (sum_i w_i M_i(b)^r)^{1/r},  r = ``exponent`` (1: sum; r -> 0: product; -inf: min; +inf: max)

Each operator gives a member ensembled with itself exactly that member. A request that samples draws
each byte from q (shaped by its settings: decoding/sampling.py); a greedy request takes q's argmax. The
paper's target is the global p_f, which q only approximates (q is biased for every f but the sum, and for
the sum too as soon as the members' prefix probabilities differ): with ``particles`` > 1 a sampling
request runs the paper's sequential Monte Carlo with q as the proposal (f_ensemble_smc.py). A row where
f is zero at every byte (min or product of members with disjoint next bytes, or no live member) ends
with finish reason ``no_continuation``.

Log-likelihoods (multiple choice) are sums of log q over the continuation's bytes, teacher-forced
through the same loop; whole-text log-likelihoods (perplexity) are log f(P_1(x), ..., P_K(x)) of the
members' own whole-text probabilities, the paper's unnormalised global score.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ensemble_bench.decoding.fused import checked_fusion
from ensemble_bench.methods.byte_level import ByteLevel
from ensemble_bench.methods.f_ensemble_params import FEnsembleSpec
from ensemble_bench.methods.f_ensemble_smc import ParticleSampling, log_aggregate


def live_weights(weights: Sequence[float], live: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[K, rows] the weights renormalised over each row's live members (0 for a dead member)."""
    shares = torch.tensor(list(weights), dtype=dtype)[:, None] * live
    total = shares.sum(dim=0, keepdim=True)
    return torch.where(total > 0, shares / total.clamp(min=torch.finfo(dtype).tiny), 0.0)


def aggregate(operator: str, exponent: float | None, dists: torch.Tensor, weights: torch.Tensor,
              live: torch.Tensor) -> torch.Tensor:
    """f over the live members: ``dists`` [K, rows, S] probabilities, ``weights`` [K, rows], ``live`` [K, rows]."""
    alive = live[:, :, None]
    if operator == "sum":
        return (weights[:, :, None] * torch.where(alive, dists, 0.0)).sum(dim=0)
    if operator == "product":
        return torch.where(alive, torch.special.xlogy(weights[:, :, None], dists), 0.0).sum(dim=0).exp()
    if operator == "min":
        return torch.where(alive, dists, math.inf).amin(dim=0).nan_to_num(posinf=0.0)
    if operator == "max":
        return torch.where(alive, dists, 0.0).amax(dim=0)
    powered = torch.where(alive & (weights[:, :, None] > 0), weights[:, :, None] * dists.pow(exponent), 0.0)
    total = powered.sum(dim=0)
    return torch.where(total > 0, total.pow(1 / exponent), 0.0)  # no live member: 0, not 0^(1/r) = inf for r < 0


class FEnsemble(ParticleSampling, FEnsembleSpec, ByteLevel):

    def combine(self, dists: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """q(. | x) = f(M_1, ..., M_K) over the live members, normalised per row (module docstring). An
        f that overflows or turns NaN (a power mean's extreme exponent) stops the row (decoding/fused.py)."""
        stacked = torch.stack(dists)
        live = stacked.sum(dim=2) > 0
        combined = checked_fusion(aggregate(self.params.operator, self.params.exponent, stacked,
                                            live_weights(self.weights, live, stacked.dtype), live))
        total = combined.sum(dim=1, keepdim=True)
        alive = total[:, 0] > 0
        return torch.where(alive[:, None], combined / total.clamp(min=torch.finfo(total.dtype).tiny), 0.0), alive

    def _combine(self, per_member: list[list[float]]) -> list[float]:
        """log f(P_1(x), ..., P_K(x)) of whole texts (perplexity), in log space: the global, unnormalised
        f-ensemble."""
        logs = torch.tensor(per_member, dtype=torch.float64)  # [K, texts]
        return log_aggregate(self.params.operator, self.params.exponent, logs, self.weights).tolist()
