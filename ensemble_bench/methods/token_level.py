"""Token-level ensembles in which one member, the lead, emits: UniTE's primary model, DeePEn's main model.

Each step every member gives its next-token distribution; the method's ``_step`` turns them into
a choice among the emitting member's own token ids. The lead appends its token; every other
member takes the same bytes (decoding/feeding.py). KV caches stay warm throughout. The text is the
lead's own decode, so a member ensembled with itself renders exactly as alone.

Log-likelihood of a continuation (multiple-choice tasks) uses the same step, teacher-forced: the
continuation is tokenised by the lead, and each of its tokens is scored by the ensemble's
probability of emitting it (``Step.target_logprobs``) while every member reads the continuation.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ensemble_bench.decoding.concurrent import each
from ensemble_bench.decoding.decode import Advance, DecodingMethod, RequestState, Round, decode_batch, own_token
from ensemble_bench.decoding.feeding import FeedStats, make_feeders, text_appender, text_lookup
from ensemble_bench.decoding.method import LoglikelihoodRequest, Timing, resolve_member
from ensemble_bench.decoding.sampling import Sampler
from ensemble_bench.decoding.speculative import Speculation, SpeculativeSteps
from ensemble_bench.decoding.stats import MethodStats, spread
from ensemble_bench.decoding.stopping import StopRule
from ensemble_bench.decoding.teacher_forced import Forced, TeacherForced
from ensemble_bench.members.base import Member, Prompt, Score
from ensemble_bench.members.batching import in_batches
from ensemble_bench.methods.token_level_params import EmitterParams, EmitterSpec


@dataclass(frozen=True)
class Step:
    """The outcome of one ensemble step for every live row."""

    choices: list[int]                    # the lead's token id chosen per row
    target_logprobs: list[float] | None   # log P(target) per row when scoring, else None


def log_or_floor(value: float) -> float:
    return math.log(value) if value > 0 else -1e30


@dataclass
class ScoringState(RequestState):
    """A continuation being scored: the lead's ids of it, and the sum and greedy flag so far."""

    targets: tuple[int, ...] = ()
    total: float = 0.0
    greedy: bool = True


@dataclass(frozen=True, kw_only=True)
class EmitterReport(MethodStats):
    """What an emitter method reports: the member that emits, re-tokenisation and speculation counters."""

    lead_index: int
    retokenizing: dict = spread()
    speculation: dict = spread()


class EmitterMethod(EmitterSpec, SpeculativeSteps, DecodingMethod):
    """Base of UniTE and DeePEn: subclasses implement ``_step``; their Params declare ``lead``."""

    def __init__(self, members: Sequence[Member], params: EmitterParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        self.lead = resolve_member(params.lead, [m.name for m in members], params.lead_spelling)
        self.appenders = [text_appender(m, params.window) for m in members]
        self.feed_stats = FeedStats()
        self.feeders = make_feeders(members, params.retokenize, self.feed_stats, params.window,
                                    skip=frozenset({self.lead}))
        self._lead_ids: dict[bytes, int] | None = None
        self.speculation = Speculation.of(self, params)

    @abstractmethod
    def _step(self, logprobs: list[torch.Tensor], targets: list[int] | None,
              samplers: Sequence[Sampler | None] = ()) -> Step:
        """Combine the members' log-probs [rows, V_i]; choose (and score ``targets``) per row: the best,
        or a draw for a row whose ``samplers`` entry samples (decoding/sampling.py)."""

    # --- generation: the loop's steps -------------------------------------------------------------
    def choose(self, dists: list[torch.Tensor], states: list[RequestState]) -> Round:
        lead = self.members[self.lead]
        samplers = [state.sampler for state in states]
        return Round([own_token(lead, t) for t in self._step(dists, None, samplers).choices], dists)

    def feed(self, dists, states, advances: list[Advance]) -> list[torch.Tensor]:
        """The lead appends its tokens; every other member takes their bytes (its feeder's policy)."""
        return each(self.members, lambda member, index: member.extend([list(a.ids) for a in advances])
                    if index == self.lead else self.feeders[index].give(states, [[a.data] for a in advances]),
                    range(len(self.members)))

    def draft_advance(self, state: RequestState, token: int, proposer: int, dist: torch.Tensor) -> Advance | None:
        """The lead's token for the proposer's drafted token (decoding/speculative.py): the token
        itself, or the lead's own token with the same bytes (none: the draft ends)."""
        lead = self.members[self.lead]
        if proposer == self.lead:
            return own_token(lead, token)
        if self._lead_ids is None:
            self._lead_ids = text_lookup(self.members[self.lead])
        own = self._lead_ids.get(self.members[proposer].vocab.pieces[token] or b"")
        return None if own is None else own_token(lead, own)

    # --- scoring --------------------------------------------------------------------------------
    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Score]:
        pairs = [[m.encode_pair(m.render_text(r.prompt), r.continuation) for r in requests] for m in self.members]
        continuations = [cont for _, cont in pairs[self.lead]]
        contexts = [[ctx for ctx, _ in member_pairs] for member_pairs in pairs]
        lengths = [len(contexts[self.lead][i]) + len(continuations[i]) for i in range(len(requests))]
        return in_batches(lengths, self.batch_size, lambda batch: self._score_batch(
            [[c[i] for i in batch] for c in contexts], [continuations[i] for i in batch]))

    def _score_batch(self, contexts: list[list[list[int]]], continuations: list[list[int]]) -> list[Score]:
        """The loop, teacher-forced; rows with an empty continuation score 0 and stay out of it."""
        live = [k for k, c in enumerate(continuations) if c]
        states = [ScoringState(StopRule((), len(continuations[k])), targets=tuple(continuations[k])) for k in live]
        if states:
            decode_batch(TeacherForced(self), [[c[k] for k in live] for c in contexts], states, Timing())
        scores = [Score(0.0, True) for _ in continuations]
        for k, state in zip(live, states):
            scores[k] = Score(state.total, state.greedy)
        return scores

    def forced_step(self, dists: list[torch.Tensor], states: list[ScoringState]) -> list[Forced]:
        """The step with each row's next continuation token as target: log P(target), and whether the
        step would have chosen it (``TeacherForced``)."""
        targets = [state.targets[state.count] for state in states]
        step = self._step(dists, targets)
        pieces = self.members[self.lead].vocab.pieces
        return [Forced(logprob, choice == target, Advance(pieces[target] or b"", (target,), 1))
                for target, choice, logprob in zip(targets, step.choices, step.target_logprobs)]

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        """Perplexity tasks: the whole text as one continuation of an empty context."""
        return [s.logprob for s in self.loglikelihood([LoglikelihoodRequest(Prompt(text=""), t) for t in texts])]

    def statistics(self) -> EmitterReport:
        return EmitterReport(lead_index=self.lead, retokenizing=self.feed_stats.summary(self.params.retokenize),
                             speculation=self.speculation.summary() if self.speculation else {})

