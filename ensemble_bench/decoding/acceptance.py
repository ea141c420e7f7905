"""The acceptance rules of speculative decoding's replay (decoding/speculative.py), in one place: whether
a drafted advance is taken at a position. A greedy row takes it when the method's own choice there is that
advance (``GreedyAcceptance``); a row that samples accepts or resamples against its draft
(``SamplingAcceptance``, used by decoding/speculative_sampling.py)."""

from __future__ import annotations

import torch

from ensemble_bench.decoding.decode import Advance
from ensemble_bench.decoding.sampling import bernoulli, inverse_cdf

NONE = -1  # the drafted unit when the proposer's token maps to no entry (or stops)


class GreedyAcceptance:
    """The drafted advance at a position is taken when the method's own choice there is that advance,
    so the output is the every-token output. (For a row that samples the choice is already
    ``SamplingAcceptance``'s: the drafted advance when accepted, a residual draw, never the draft, when not.)"""

    def accepts(self, chosen: Advance, drafted: Advance) -> bool:
        return chosen == drafted


class SamplingAcceptance:
    """Speculative sampling's rule at one position of one row (Leviathan et al. 2023, Chen et al. 2023), on
    the ensemble's units, with p the ensemble's shaped distribution, q the proposal and u the drafted unit:

        accept u          with probability min(1, p(u) / q(u))     (never when u is "none")
        else draw from    r(x) = max(0, p(x) - q(x)) / sum_y max(0, p(y) - q(y))

    so the position's draw has distribution p (decoding/speculative_sampling.py gives the proof sketch).
    ``acceptance`` and ``residual`` are the rule's two probabilities; ``verify`` draws with them
    (tests/decoding/test_speculative_exact.py enumerates every draw through the same two)."""

    @staticmethod
    def acceptance(p: torch.Tensor, q: torch.Tensor, drafted: int) -> float:
        """The probability of taking the drafted unit, min(1, p(u) / q(u)); 0 for "none"."""
        if drafted == NONE or not bool(p[drafted] > 0):
            return 0.0
        return min(1.0, float(p[drafted] / q[drafted])) if bool(q[drafted] > 0) else 1.0

    @staticmethod
    def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """r = max(0, p - q) normalised (p itself where p == q up to rounding: rejection had probability 0)."""
        residual = (p - q).clamp(min=0)
        total = residual.sum()
        return residual / total if bool(total > 0) else p

    @staticmethod
    def verify(p: torch.Tensor, q: torch.Tensor, drafted: int, generator: torch.Generator) -> int:
        """The drafted unit (an index, or NONE) if accepted, else a draw from the residual. ``p`` and ``q``
        [units] are probabilities (float64; q without "none"); the uniforms come from the row's generator."""
        if drafted != NONE and bernoulli(SamplingAcceptance.acceptance(p, q, drafted), generator):
            return drafted
        return int(inverse_cdf(SamplingAcceptance.residual(p, q)[None], [generator])[0])
