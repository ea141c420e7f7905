"""Speculative sampling across tokenizers: draft and verify (decoding/speculative.py) for a request that
samples, with the output distribution exactly the ensemble's every-token distribution p.

The proposer draws each drafted token from its own shaped distribution (the request's settings over
its vocabulary). A drafted token stands for one unit of the ensemble's space, the entry of its bytes
(GaC's union), so the proposal is a distribution q over the same units: the proposer's probabilities
projected there (ids with equal bytes add), plus a "none" unit for the proposer's ids that map to no
entry or stop it (the draft ends there; p gives "none" nothing). At each drafted position, in the
text verified so far, with p the ensemble's shaped distribution there (what every-token sampling
draws from) and u the drafted unit (Leviathan et al. 2023, Chen et al. 2023, on units; the rule is
decoding/acceptance.py's ``SamplingAcceptance``, beside the greedy one):

    accept u              with probability min(1, p(u) / q(u))     (never when u is "none")
    else draw from        r(x) = max(0, p(x) - q(x)) / sum_y max(0, p(y) - q(y))

and the round ends at the first rejection; past the draft the row draws from p, as every token does.
Then P(x) = min(p(x), q(x)) + (sum_y max(0, q(y) - p(y))) r(x) = min(p(x), q(x)) + max(0, p(x) - q(x))
= p(x), since sum_y max(0, q(y) - p(y)) = sum_y max(0, p(y) - q(y)) over units with "none" counted
(q(none) - 0 on the left). Every uniform number comes from the request's own generator, in an order
fixed by the request alone: its draft length is the method's ``speculative`` N (not adapted to the
measured costs, which would make the draws depend on the clock) and its proposer is fixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ensemble_bench.decoding.acceptance import NONE, SamplingAcceptance
from ensemble_bench.decoding.decode import Advance, RequestState, Round
from ensemble_bench.decoding.sampling import Sampler, SamplingParams, decide, draw_rows, inverse_cdf, rows_of, shape
from ensemble_bench.vocab.fast_topk import block_argmax


@dataclass(frozen=True)
class Drafted:
    """What the proposer drafted at one position of a row: the advance (None: the "none" unit), its
    index and its log-probabilities there (over its own vocabulary, unshaped)."""

    advance: Advance | None
    proposer: int
    logprobs: torch.Tensor


def samples(state: RequestState) -> bool:
    return state.sampler is not None and not state.sampler.params.greedy


def draft_tokens(dists: torch.Tensor, states: list[RequestState]) -> list[int]:
    """The proposer's token per row ([rows, V] log-probs): its argmax, or for a row that samples a draw
    from its own distribution shaped by the row's settings."""
    tokens = block_argmax(dists).tolist()
    for index, state in enumerate(states):
        if samples(state):
            tokens[index] = draw_rows(dists[index:index + 1], [state.sampler])[0]
    return tokens


def replay_choice(method, dists: list[torch.Tensor], states: list, drafts: list[Drafted | None]) -> list[Advance]:
    """The method's choice at one replayed position: its own ``choose``, or where a row samples its
    ``speculative_choice`` (accept the draft or draw from the residual)."""
    if any(samples(state) for state in states):
        return method.speculative_choice(dists, states, drafts).advances
    return method.choose(dists, states).advances


class UnionSpeculativeSampling:
    """``speculative_choice`` for a method whose every-token step draws from a distribution over GaC's
    union (``mixture.log_blocks``) and whose advance for an entry is ``_advance``: GaC without gate or CoRE."""

    def speculative_choice(self, dists: list[torch.Tensor], states: list[RequestState],
                           drafts: Sequence[Drafted | None]) -> Round:
        """Each row's advance at one position of a replay: greedy rows as every token; sampling rows accept
        or resample against their draft (``SamplingAcceptance``), or draw from p past it."""
        samplers = [state.sampler for state in states]

        def sample(rows: list[int], drawing: list[Sampler]) -> list[int]:
            blocks = self.mixture.log_blocks([rows_of(lp, rows) for lp in dists])
            logq = torch.cat([block for _, block in blocks])
            chosen = []
            for row, sampler, log_weights in zip(rows, drawing, logq):
                p = self._shaped(log_weights, sampler.params)
                draft = drafts[row]
                if draft is None:
                    chosen.append(int(inverse_cdf(p[None], [sampler.generator])[0]))
                    continue
                unit = NONE if draft.advance is None else draft.advance.chosen
                q = self._proposal(draft, sampler.params)
                chosen.append(SamplingAcceptance.verify(p, q, unit, sampler.generator))
            return chosen

        entries = decide(samplers, lambda kept: self.mixture.greedy([rows_of(lp, kept) for lp in dists]), sample)
        return Round([self._advance(state, False, (entry, None if entry in self.stop_entries else
                                                   self.union.entries[entry]))
                      for state, entry in zip(states, entries)], dists)

    @staticmethod
    def _shaped(log_weights: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        shaped = shape(params, log_weights[None].double())[0]
        return torch.softmax(shaped, dim=-1)

    def _proposal(self, draft: Drafted, params: SamplingParams) -> torch.Tensor:
        """q over the union: the proposer's shaped probabilities, its stop ids left out (they are "none")."""
        probs = self._shaped(draft.logprobs.float(), params)
        stops = sorted(self.members[draft.proposer].stop_ids)
        if stops:
            probs = probs.index_fill(0, torch.tensor(stops, device=probs.device), 0.0)
        return self.union.maps[draft.proposer].project(probs[None], self.union.size)[0]
