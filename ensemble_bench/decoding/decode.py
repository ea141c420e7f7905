"""The one decoding loop. Every generating method and teacher-forced scoring run through
``decode_batch``; a method supplies only the steps that make it that method (``Steps``), and a
strategy (``Rounds``) decides how a round uses them: every token (``EveryToken``, the default) or
draft and verify (``decoding.speculative.Speculation``, a method's ``speculative: N``). The loop
itself is the same for both:

    prefill every member (prompts cut to fit each request's budget); the strategy begins the batch
    while a request is live:
        round    the strategy's round for the live rows (every token:
                   feed     the method gives the text the rows took last round to the members
                   check    every member's next-token distributions hold no NaN or +inf and some
                            finite log-prob (one reduction per member on its device; else
                            NonFiniteScore)
                   choose   the method's step: one token per row (GaC: mix and choose; UniTE /
                            DeePEn: the lead's step; single: argmax) or one segment per row (span
                            methods: propose, score, choose and commit) -> a ``Round``: one
                            ``Advance`` per live row; a fusion the method consumes passes
                            ``fused.checked_fusion`` (a NaN or infinite one: NonFiniteFusion,
                            named here by its row and step, ``located``)
                   advance  each request takes its advance (``advance_request``); it stops on the
                            method's word (a stop id, a span's final segment), an ``until`` string
                            or its token budget (stopping.py)
                 speculatively: the same feed, check, choose and advance, replayed over a verified
                 draft, one or more tokens per row) -> a ``Tally``: tokens generated, decode steps
        time     first token, then decode steps (a span or speculative round counts its tokens per row)
        keep     finished rows leave every member and the strategy's per-row values

The loop never asks whether a round added a token, a span or a draft. ``RequestState`` is the
state of one request (one batch row while it is live); methods extend it with their own fields.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch

from ensemble_bench.decoding.concurrent import each
from ensemble_bench.decoding.fused import NonFiniteFusion
from ensemble_bench.decoding.method import (
    Generation,
    GenerationRequest,
    Method,
    NonFiniteScore,
    Timing,
    excerpt,
    request_excerpt,
)
from ensemble_bench.decoding.sampling import Sampler
from ensemble_bench.decoding.stopping import StopRule, cut_at_until
from ensemble_bench.members.base import Member, Prompt
from ensemble_bench.members.batching import in_batches


@dataclass(frozen=True)
class Advance:
    """What one live row takes in one round."""

    data: bytes = b""                     # text bytes appended
    ids: tuple[int, ...] | None = ()      # the lead's own ids for them (None: it has none)
    tokens: int = 0                       # tokens counted against the budget
    finish: str | None = None             # the method ends the request: "stop_id", or a span's final reason


STOP = Advance(finish="stop_id")


def own_token(member: Member, token: int) -> Advance:
    """A member's own token as the next piece of its text (a stop id ends the request)."""
    if token in member.stop_ids:
        return STOP
    return Advance(member.vocab.pieces[token] or b"", (token,), 1)


@dataclass(frozen=True)
class Round:
    """The outcome of one ``choose`` for the live rows."""

    advances: list[Advance]
    dists: list[torch.Tensor]  # each member's next-token log-probs of the live rows, after the step's own calls
    by_span: bool = False      # rows advanced by segments (timing counts tokens), else one token each

    @property
    def steps(self) -> float:
        """Decode steps this round counts as: one, or the mean tokens a row advanced."""
        return sum(a.tokens for a in self.advances) / len(self.advances) if self.by_span else 1.0

    @property
    def generated(self) -> int:
        """Tokens generated in this round (a chosen stop id counts as one)."""
        return sum(a.tokens for a in self.advances) if self.by_span else len(self.advances)


@dataclass
class RequestState:
    """One request being decoded: its text (bytes, and the lead's ids while it has them), the
    tokens counted against its budget, and why it stopped."""

    rule: StopRule
    data: bytearray = field(default_factory=bytearray)
    ids: list[int] | None = field(default_factory=list)
    count: int = 0
    finish: str | None = None
    held: dict = field(default_factory=dict)  # member index -> how it holds the text (decoding/feeding.Held)
    sampler: Sampler | None = None  # a request that samples: its settings and generator (decoding/sampling.py)

    @classmethod
    def of(cls, request: GenerationRequest, **fields) -> RequestState:
        """A new state for ``request`` (its stop strings, budget and sampler), with a subclass's ``fields``."""
        sampler = request.sampling.sampler() if request.sampling is not None else None
        return cls(StopRule(request.until, request.max_new_tokens), sampler=sampler, **fields)

    def copy(self) -> RequestState:
        """A copy that can change without changing this state (a subclass copies its own mutable fields)."""
        return replace(self, data=bytearray(self.data), ids=None if self.ids is None else list(self.ids),
                       held={index: replace(held) for index, held in self.held.items()})

    def take(self, advance: Advance) -> None:
        self.data += advance.data
        if advance.ids is None:
            self.ids = None
        elif self.ids is not None:
            self.ids.extend(advance.ids)
        self.count += advance.tokens


def text_of(lead: Member, state: RequestState) -> str:
    """The lead member's own decode of the text when every piece is one of its tokens (so a member
    ensembled with itself renders exactly as alone), else UTF-8 of the bytes."""
    if state.ids is not None:
        return lead.decode(state.ids)
    text = bytes(state.data).decode("utf-8", errors="replace")
    if lead.vocab.strips_leading_space and text.startswith(" "):
        text = text[1:]  # the SentencePiece dummy-prefix convention
    return text


class Steps(ABC):
    """The step(s) a method plugs into the loop."""

    members: list[Member]
    lead: int  # the member whose decode renders the text

    @abstractmethod
    def choose(self, dists: list[torch.Tensor], states: list[RequestState]) -> Round:
        """One round for the live rows (``dists``: each member's log-probs of them)."""

    @abstractmethod
    def feed(self, dists: list[torch.Tensor], states: list[RequestState],
             advances: list[Advance]) -> list[torch.Tensor]:
        """Give the members what the live rows took; their next log-probs."""


def fit_prompt(member: Member, ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """The prompt as it fits the member's window with the new tokens: whole, or cut from the left
    by the member (``Tokenizing.fit_prompt``, which counts the cut)."""
    if len(ids) + max_new_tokens <= member.max_length:
        return list(ids)
    return member.fit_prompt(ids, max_new_tokens)


def prefill(members: Sequence[Member], prompts: list[list[list[int]]], budgets: list[int]) -> list[torch.Tensor]:
    """Start a batch in every member (``prompts[member][row]``, cut to fit each row's budget)."""
    return each(members, lambda m, rows: m.prefill([fit_prompt(m, p, b) for p, b in zip(rows, budgets)]), prompts)


def drop_rows(members: Sequence[Member], still: list[int], dists: list[torch.Tensor]) -> list[torch.Tensor]:
    """Finished rows leave every member and its log-probs: rows ``still`` stay, in order."""
    for member in members:
        member.keep(still)
    return [dist[still] for dist in dists]


def check_distributions(members: Sequence[Member], dists: list[torch.Tensor], live: list[int],
                        prompts: list[list[list[int]]], states: list[RequestState]) -> None:
    """NonFiniteScore (naming the member, the request's row and the step) when a live row's
    next-token log-probs hold a NaN or +inf or no finite value at all: its largest log-prob is
    then not finite. One reduction and one ``isfinite(...).all()`` per member, on its device."""
    for index, (member, dist) in enumerate(zip(members, dists)):
        top = dist.amax(dim=-1)
        if bool(torch.isfinite(top).all()):
            continue
        k = int((~torch.isfinite(top)).nonzero()[0, 0])
        row = live[k]
        raise NonFiniteScore(f"member '{member.name}'", float(top[k]), f"at decoding step {states[row].count}",
                             row_context(member, prompts[index][row]), row=row)


def row_context(member: Member, ids: Sequence[int]) -> str:
    """How a fault quotes a batch row: the end of its prompt as ``member`` reads it."""
    return f"context {excerpt(member.decode([t for t in ids if t >= 0][-16:]), end=True)}"  # seq2seq: a -1 mark


def located(err: NonFiniteFusion, steps: Steps, live: list[int], prompts: list[list[list[int]]],
            states: list[RequestState]) -> NonFiniteFusion:
    """A fusion fault of ``choose`` row ``err.row`` (one of the ``live`` rows) naming its batch row, its
    decoding step and its context (decoding/fused.py)."""
    if err.row is None:
        return err
    row = live[err.row]
    return err.with_(row=row, step=f"at decoding step {states[row].count}",
                     excerpt=row_context(steps.members[steps.lead], prompts[steps.lead][row]))


class Tally(NamedTuple):
    """What a round counts for timing: tokens generated, and the decode steps it stands for."""

    generated: int
    steps: float


class Rounds(ABC):
    """How the loop's rounds are decided, for one batch at a time: every token (``EveryToken``) or
    draft and verify (``decoding.speculative.Speculation``). The loop owns prefill, the live rows,
    stopping, keeping and timing; a strategy owns what happens to the live rows inside a round."""

    @abstractmethod
    def begin(self, dists: list[torch.Tensor], prompts: list[list[list[int]]], states: list[RequestState]) -> None:
        """A new batch: each member's log-probs after prefill, the prompts, every row's state."""

    @abstractmethod
    def round(self, live: list[int]) -> Tally:
        """One round for rows ``live`` (indices into the batch): the members take what the rows took
        last round, then each row advances (``advance_request``) by one token or more."""

    @abstractmethod
    def keep(self, still: list[int]) -> None:
        """Finished rows leave: positions ``still`` of the last round's live rows stay, in order."""

    @abstractmethod
    def end(self) -> None:
        """The batch is done."""


class EveryToken(Rounds):
    """One decision per round, the method's ``choose``; the members are fed what it chose at the start
    of the next round."""

    def __init__(self, steps: Steps):
        self.steps = steps

    def begin(self, dists, prompts, states) -> None:
        self.dists, self.prompts, self.states = dists, prompts, states
        self.advances: list[Advance] | None = None  # what the live rows took, not yet given to the members

    def round(self, live: list[int]) -> Tally:
        steps, states = self.steps, [self.states[i] for i in live]
        if self.advances is not None:
            self.dists = steps.feed(self.dists, states, self.advances)
        check_distributions(steps.members, self.dists, live, self.prompts, self.states)
        try:
            done = steps.choose(self.dists, states)
        except NonFiniteFusion as err:
            raise located(err, steps, live, self.prompts, self.states) from None
        lead = steps.members[steps.lead]
        for state, advance in zip(states, done.advances):
            advance_request(lead, state, advance)
        self.dists, self.advances = done.dists, done.advances
        return Tally(done.generated, done.steps)

    def keep(self, still: list[int]) -> None:
        self.dists = drop_rows(self.steps.members, still, self.dists)
        self.advances = [self.advances[k] for k in still]

    def end(self) -> None:
        """Nothing to record: the loop's timing is all an every-token batch counts."""


def decode_batch(steps: Steps, prompts: list[list[list[int]]], states: list[RequestState], timing: Timing,
                 rounds: Rounds | None = None) -> None:
    """Decode one batch to the end, every token or by ``rounds``; ``states`` are updated in place (see
    the module docstring)."""
    rounds = EveryToken(steps) if rounds is None else rounds
    timing.start_batch()
    rounds.begin(prefill(steps.members, prompts, [s.rule.max_new_tokens for s in states]), prompts, states)
    live = list(range(len(states)))
    first = True
    while live:
        tally = rounds.round(live)
        timing.tokens_generated += tally.generated
        timing.first_token(tally.steps) if first else timing.step(tally.steps)
        first = False
        still = [k for k, i in enumerate(live) if states[i].finish is None]
        if len(still) < len(live):
            rounds.keep(still)
            live = [live[k] for k in still]
    rounds.end()


def advance_request(lead: Member, state: RequestState, advance: Advance) -> None:
    """The row takes the advance; it finishes on the method's word, an ``until`` string or its budget."""
    state.take(advance)
    state.finish = advance.finish or state.rule.finish(lambda: text_of(lead, state), state.count)


class DecodingMethod(Method, Steps):
    """A method that generates through the loop: it supplies ``choose``, ``feed`` and ``lead``,
    and may extend ``start`` (its own per-request state) and ``result``."""

    speculation: Rounds | None = None  # draft and verify (decoding/speculative.py), for the methods that offer it

    def start(self, request: GenerationRequest) -> RequestState:
        return RequestState.of(request)

    def decode(self, prompts: list[list[list[int]]], states: list[RequestState]) -> None:
        """Decode one batch: every token, or speculatively (the same outputs) when the method was asked to."""
        decode_batch(self, prompts, states, self.timing, self.speculation)

    def result(self, state: RequestState, request: GenerationRequest) -> Generation:
        text = text_of(self.members[self.lead], state)
        return Generation(cut_at_until(text, request.until), state.count, state.finish or "length")

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Each request rendered by each member's own template; batches longest prompts first."""
        self.refuse_sampling(requests)
        prompts = [[self.render(i, r.prompt) for r in requests] for i in range(len(self.members))]
        lengths = [max(len(p[i]) for p in prompts) for i in range(len(requests))]
        return in_batches(lengths, self.batch_size, lambda batch: self._generate_batch(
            [[p[i] for i in batch] for p in prompts], [requests[i] for i in batch]))

    def render(self, index: int, prompt: Prompt) -> list[int]:
        """Member ``index``'s ids of a prompt: its own template (a method may read prompts otherwise)."""
        return self.members[index].render(prompt)

    def _generate_batch(self, prompts: list[list[list[int]]], requests: list[GenerationRequest]) -> list[Generation]:
        states = [self.start(r) for r in requests]
        try:
            self.decode(prompts, states)
        except NonFiniteScore as err:
            if err.row is None:
                raise
            request = requests[err.row]  # the loop names a row; its request names the fault better
            raise err.with_(excerpt=request_excerpt(request.prompt), prompt=request.prompt) from None
        return [self.result(s, r) for s, r in zip(states, requests)]
