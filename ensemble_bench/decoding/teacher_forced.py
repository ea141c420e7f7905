"""Scoring a continuation through the decode loop (log-likelihood tasks): ``TeacherForced`` runs a
decoding method's rounds with the continuation's next unit as the choice (a token of the lead for the
emitter methods, a byte or a symbol for the covering decoders). Each round adds

    log q(y_t | y_<t)

to the row's total, q the ensemble's distribution and y_t the forced unit, and keeps whether every
y_t was q's argmax (lm-eval's ``is_greedy``); every member then reads y_t through the method's
``feed``, so the caches stay warm as in generation. The method says what q gives the forced unit
(``forced_step``); this class keeps the score."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from ensemble_bench.decoding.decode import Advance, RequestState, Round, Steps
from ensemble_bench.members.base import Member


class Forced(NamedTuple):
    """One row's forced unit, as the method scored it."""

    logprob: float   # log q of the forced unit
    greedy: bool     # whether it is q's argmax
    advance: Advance  # what the members read (one unit of the row's budget)


class Forcing(Protocol):
    """The side of a decoding method that teacher forcing calls."""

    members: list[Member]
    lead: int

    def forced_step(self, dists: list[torch.Tensor], states: list) -> list[Forced]:
        """Each live row's forced unit scored by the ensemble's distribution."""

    def feed(self, dists: list[torch.Tensor], states: list, advances: list[Advance]) -> list[torch.Tensor]:
        """As ``Steps.feed``."""


class TeacherForced(Steps):
    """The loop's step with the continuation's next unit as the choice: it adds the method's log q of
    that unit to each row's total and keeps whether it was the argmax; the budget is the continuation's
    units, one per round."""

    def __init__(self, method: Forcing):
        self.method = method
        self.members = method.members

    @property
    def lead(self) -> int:
        return self.method.lead

    def choose(self, dists: list[torch.Tensor], states: list[RequestState]) -> Round:
        forced = self.method.forced_step(dists, states)
        for state, unit in zip(states, forced):
            state.total += unit.logprob
            state.greedy = state.greedy and unit.greedy
        return Round([unit.advance for unit in forced], dists)

    def feed(self, dists: list[torch.Tensor], states: list[RequestState],
             advances: list[Advance]) -> list[torch.Tensor]:
        return self.method.feed(dists, states, advances)
