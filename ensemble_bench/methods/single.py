"""``single``: one member alone, greedy or drawing from its own distribution (a request that samples:
decoding/sampling.py). The baseline every ensemble is compared with, and the reference for parity with
lm-eval's own HFLM."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ensemble_bench.decoding.decode import DecodingMethod, RequestState, Round, own_token
from ensemble_bench.decoding.method import LoglikelihoodRequest, rolling_with_members, score_with_members
from ensemble_bench.decoding.sampling import decide_on
from ensemble_bench.members.base import Member, Score
from ensemble_bench.vocab.fast_topk import block_argmax


class Single(DecodingMethod):
    name = "single"
    alone = True
    max_members = 1
    samples = True

    @property
    def member(self) -> Member:
        return self.members[0]

    def choose(self, dists: list[torch.Tensor], states: list[RequestState]) -> Round:
        chosen = decide_on(dists[0], [state.sampler for state in states], lambda lp: block_argmax(lp).tolist())
        return Round([own_token(self.member, t) for t in chosen], dists)

    def feed(self, dists, states, advances) -> list[torch.Tensor]:
        return [self.member.extend([list(a.ids) for a in advances])]

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Score]:
        return score_with_members(self.members, requests, self.batch_size)[0]

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        return rolling_with_members(self.members, texts, self.batch_size)[0]
