"""Draft and verify across tokenizers: a token-level method decodes speculatively and every output
equals its every-token mode (method parameter ``speculative: N``, docs/speculative.md).

A method opts in by declaring ``Speculable`` (its steps, ``draft_advance``, ``rehearse``,
``speaking_to``, ``copy_states``; ``SpeculativeSteps`` gives the last three to a method with feeders).
The engine never patches the method: stand-in members reach it through ``speaking_to``, a view that
leaves the method as it is, and the rehearsal works on ``copy_states`` copies with its feeding
uncounted. Each round, for the live rows of a batch:

    rehearse  the method's own ``feed`` runs on copies of the rows' states against ``Rehearsal``
              members (token ids only, no model): first the advance the previous round chose, then,
              one draft position at a time, the advance the method would take if it chose the
              proposer's greedy token there (``draft_advance``). The proposer drafts meanwhile, up
              to each row's draft length, with its own forward passes. What every member would hold
              at every position is now known.
    fetch     every member reads what it would hold in ONE ``read_block`` (crop to the common
              prefix, then the block; its log-probs at every position a decision needs).
    replay    the method's own ``choose`` and ``feed`` run as in every-token mode, against
              ``StandIn`` members that answer from the fetched distributions. A row goes on while
              its choice is the draft's; its first other choice ends its round (it is fed at the
              start of the next one, inside the next block). A position the rehearsal did not
              foresee costs a real forward pass: never a different output.

Every decision is therefore the method's own, taken on the distributions of the text it chose: the
outputs are the every-token outputs up to the float differences between a block forward and
one-token steps (docs/speculative.md lists the near-ties measured). Sampling stays every-token.

The draft length adapts per row: the length d <= N with the most tokens per second expected from
the row's recent acceptance rate and the measured cost of a proposer step and of the verifiers'
block (``_next_length``; 0: no draft, a plain every-token round, until the proposer is right again).
``proposer: auto`` picks, each round, the member whose measured agreement with the ensemble and
measured forward cost promise the most tokens per second.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

import torch
from pydantic import Field

from ensemble_bench.decoding.concurrent import each
from ensemble_bench.decoding.decode import (
    Advance,
    RequestState,
    Round,
    advance_request,
    check_distributions,
    prefill,
)
from ensemble_bench.decoding.feeding import Feeder, FeedStats
from ensemble_bench.members.base import Member
from ensemble_bench.methods.base import MethodParams, Timing, resolve_member
from ensemble_bench.vocab.fast_topk import block_argmax

AUTO = "auto"
DECAY = 0.8  # weight of the past in a row's acceptance rate and in the measured costs
BLOCK_SLOPE = 0.1  # a block's extra cost per token over one token, until two widths are measured (CPU: 0.05-0.2)


class SpeculativeParams(MethodParams):
    """The parameters of draft-and-verify decoding, shared by every method that supports it."""

    speculative: int = Field(default=0, ge=0, le=64, description=(
        "0: every-token decoding; N: a proposer drafts up to N tokens and the ensemble verifies them in one "
        "forward pass per member, with the same greedy output (docs/speculative.md)"))
    proposer: int | str | None = Field(default=None, description=(
        "the member that drafts: an index or name, auto (the best agreement per cost, learned while decoding), "
        "or null (the lead member)"))


def resolve_proposer(params: SpeculativeParams, labels: Sequence[str], lead: int) -> int | None:
    """The proposer's index (None: auto)."""
    if params.proposer == AUTO:
        return None
    return lead if params.proposer is None else resolve_member(params.proposer, labels, "proposer")


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    k = 0
    while a[k] == b[k]:
        k += 1
    return k


class Focused:
    """Rows of a member as a method sees them: ``focus`` names the rows (of the whole batch) that
    the method's next calls mean, in order; tokenizer attributes come from the member itself."""

    def __init__(self, member: Member, rows: list[list[int]]):
        self.member = member
        self.virtual = rows
        self.focus = list(range(len(rows)))

    def __getattr__(self, name: str):
        return getattr(self.member, name)

    def row_ids(self) -> list[list[int]]:
        return [list(self.virtual[r]) for r in self.focus]

    def crop(self, lengths: Sequence[int]) -> None:
        for r, length in zip(self.focus, lengths):
            self._cropped(r, int(length))
            del self.virtual[r][int(length):]

    def extend(self, tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        for r, row in zip(self.focus, tokens):
            self.virtual[r].extend(int(t) for t in row)
        return self._after_extend([r for r, row in zip(self.focus, tokens) if row])

    def _cropped(self, row: int, length: int) -> None:
        """A hook: row ``row`` is about to be cut to ``length`` tokens."""

    def _after_extend(self, rows: list[int]) -> torch.Tensor:
        raise NotImplementedError


class Rehearsal(Focused):
    """A member without its model: it records what it is given (ids) and the lengths at which the
    method will ask for its distribution; the distributions it returns are empty placeholders."""

    def __init__(self, member: Member, rows: list[list[int]]):
        super().__init__(member, [list(r) for r in rows])
        self.needed: list[list[int]] = [[len(r)] for r in rows]

    def _cropped(self, row: int, length: int) -> None:
        self.needed[row] = [n for n in self.needed[row] if n <= length]  # the block cannot serve them

    def _after_extend(self, rows: list[int]) -> torch.Tensor:
        for r in rows:
            self.needed[r].append(len(self.virtual[r]))
        return torch.empty((len(self.focus), 0))


class StandIn(Focused):
    """A member during decoding: ``virtual`` is what the method gave each row, ``real`` what the
    member's KV cache holds, ``known[r]`` the fetched distributions of row r by length (valid while
    ``real[r]`` keeps that prefix). A distribution asked for and not known is fetched at once."""

    def __init__(self, member: Member, dists: torch.Tensor):
        real = member.row_ids()
        super().__init__(member, [list(r) for r in real])
        self.real = real
        self.known: list[dict[int, torch.Tensor]] = [{len(r): dists[k]} for k, r in enumerate(real)]
        self.forwards = [0] * len(real)  # forward passes each row took part in
        self.calls = 0
        self.width = 0  # the widest row of the last block read, in tokens

    def _after_extend(self, rows: list[int]) -> torch.Tensor:
        return self.current()

    def served(self, row: int) -> torch.Tensor | None:
        length = len(self.virtual[row])
        dist = self.known[row].get(length)
        if dist is None or self.real[row][:length] != self.virtual[row]:
            return None
        return dist

    def current(self) -> torch.Tensor:
        """The focused rows' distributions [rows, V] (those not known fetched first, in one forward)."""
        missing = {r: (self.virtual[r], [len(self.virtual[r])]) for r in self.focus if self.served(r) is None}
        if missing:
            self.fetch(missing)
        return torch.stack([self.served(r) for r in self.focus])

    def fetch(self, plans: dict[int, tuple[list[int], list[int]]]) -> None:
        """For each row r in ``plans`` = (target ids, lengths needed): hold ``target`` and know its
        distributions at the needed lengths. One crop and one ``read_block`` for all rows."""
        lengths = [len(r) for r in self.real]
        blocks: list[list[int]] = [[] for _ in self.real]
        wanted: list[list[int]] = [[] for _ in self.real]
        for r, (target, needed) in plans.items():
            keep = common_length(self.real[r], target)
            missing = sorted({n for n in needed if n > keep or n not in self.known[r]})
            if not missing:
                continue
            keep = min(keep, missing[0] - 1)
            lengths[r], blocks[r], wanted[r] = keep, list(target[keep:]), missing
        if not any(blocks):
            return
        if any(n < len(r) for n, r in zip(lengths, self.real)):
            self.member.crop(lengths)
            for r, n in enumerate(lengths):
                del self.real[r][n:]
                self.known[r] = {m: d for m, d in self.known[r].items() if m <= n}
        dists = self.member.read_block(blocks, [[n - lengths[r] - 1 for n in wanted[r]] for r in range(len(blocks))])
        self.calls += 1
        self.width = max(len(block) for block in blocks)
        for r, block in enumerate(blocks):
            if block:
                self.real[r].extend(block)
                self.forwards[r] += 1
                self.known[r].update(zip(wanted[r], dists[r]))

    def keep(self, rows: Sequence[int]) -> None:
        """Only these rows stay (finished rows leave), in the member too."""
        self.member.keep(rows)
        for name in ("virtual", "real", "known", "forwards"):
            values = getattr(self, name)
            setattr(self, name, [values[r] for r in rows])
        self.focus = list(range(len(rows)))

    def prune(self) -> None:
        """Forget distributions no later decision can ask for (shorter than what the row holds now)."""
        for r, row in enumerate(self.virtual):
            self.known[r] = {n: d for n, d in self.known[r].items() if n >= len(row)}


@runtime_checkable
class Speculable(Protocol):
    """What a method provides to be decoded draft-and-verify (``speculative: N``). The engine never
    patches a method: it asks it for these, and talks to stand-in members through ``speaking_to``.

    - ``members``, ``lead``, ``choose``, ``feed``: the method's own steps (decoding.decode.Steps);
    - ``draft_advance(state, token, proposer, dist)``: the advance a step would take if it chose the
      proposer's greedy ``token`` (None: the draft ends there);
    - ``rehearse(states, advances)``: what a step that took ``advances`` gives the members (its catch-up
      and feeding), played against members that record ids and compute nothing;
    - ``speaking_to(members, counted)``: the method with every call to a member going to ``members``
      (the original is left as it is); its feeding counted in its statistics or, for a rehearsal, not;
    - ``copy_states(states)``: copies of request states that the rehearsal may change.
    ``SpeculativeSteps`` gives the last three to a method whose members take text through feeders.
    """

    members: list[Member]
    lead: int

    def choose(self, dists: list[torch.Tensor], states: list) -> Round: ...

    def feed(self, dists: list, states: list, advances: list[Advance]) -> list[torch.Tensor]: ...

    def draft_advance(self, state, token: int, proposer: int, dist: torch.Tensor) -> Advance | None: ...

    def rehearse(self, states: list, advances: list[Advance]) -> None: ...

    def speaking_to(self, members: Sequence[Member], counted: bool = True) -> Speculable: ...

    def copy_states(self, states: Sequence[RequestState]) -> list: ...


class SpeculativeSteps:
    """``Speculable``'s defaults for a method whose members take chosen text through ``feeders``
    (decoding/feeding.py) counted in ``feed_stats``: a view of the method over other members, a
    rehearsal that feeds as a step would, and the states' own copies. Statistics a step counts must
    live in objects the view shares (``self.stats.x += 1``, never ``self.x += 1``)."""

    members: list[Member]
    feeders: list[Feeder | None]
    feed_stats: FeedStats

    def speaking_to(self, members: Sequence[Member], counted: bool = True):
        view = copy.copy(self)  # a shallow view: tables, caches and statistics objects are shared
        view.members = list(members)
        view.feed_stats = self.feed_stats if counted else FeedStats()
        view.feeders = [None if f is None else f.speaking_to(members[f.index], view.feed_stats) for f in self.feeders]
        return view

    def rehearse(self, states: list, advances: list[Advance]) -> None:
        self.feed([None] * len(self.members), states, advances)

    def copy_states(self, states: Sequence[RequestState]) -> list:
        return [state.copy() for state in states]


def focus(members: Sequence[Focused], rows: list[int]) -> None:
    for member in members:
        member.focus = list(rows)


@dataclass
class Rate:
    """A row's recent rate of drafted tokens taken (each round's observations weigh DECAY times the last's)."""

    taken: float = 0.0
    trials: float = 0.0

    def observe(self, accepted: int, drafted: int, agreed_after: bool) -> None:
        """Drafted tokens taken, the first one refused, and the proposer's agreement at the next position."""
        self.taken = DECAY * self.taken + accepted + (accepted == drafted and agreed_after)
        self.trials = DECAY * self.trials + accepted + 1

    @property
    def value(self) -> float:
        return (self.taken + 1) / (self.trials + 2)


@dataclass
class Costs:
    """Forward seconds (the members' clocks) of one proposer step, and of one round's verifier
    blocks by their width in tokens, each averaged with the same decay; None / empty until measured."""

    step: float | None = None
    blocks: dict[int, float] = field(default_factory=dict)

    @contextmanager
    def timing(self, *members: StandIn, name: str) -> Iterator[None]:
        """Time the members' reads in the block: a proposer ``step`` or the verifiers' ``block``."""
        before = sum(m.member.clock.decode_seconds for m in members)
        calls = [m.calls for m in members]
        yield
        read = [m for m, count in zip(members, calls) if m.calls > count]
        if not read:
            return
        spent = sum(m.member.clock.decode_seconds for m in members) - before
        if name == "step":
            self.step = spent if self.step is None else DECAY * self.step + (1 - DECAY) * spent
            return
        width = max(m.width for m in read)
        old = self.blocks.get(width)
        self.blocks[width] = spent if old is None else DECAY * old + (1 - DECAY) * spent

    def block(self, width: int) -> float:
        """The verifiers' block of ``width`` tokens: measured, else a least-squares line through the
        widths measured, else the one measured width grown by BLOCK_SLOPE per token."""
        if width in self.blocks:
            return self.blocks[width]
        widths, seconds = list(self.blocks), list(self.blocks.values())
        if len(widths) == 1:
            return seconds[0] * max(0.1, 1 + BLOCK_SLOPE * (width - widths[0]))
        mean_w, mean_s = sum(widths) / len(widths), sum(seconds) / len(seconds)
        slope = (sum((w - mean_w) * (t - mean_s) for w, t in zip(widths, seconds))
                 / sum((w - mean_w) ** 2 for w in widths))
        return max(0.1 * min(seconds), mean_s + slope * (width - mean_w))


@dataclass
class RowRecord:
    """One request's speculative decoding, for its results."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    forwards: list[int] = field(default_factory=list)

    def summary(self) -> dict:
        return {"rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted, "tokens": self.tokens,
                "acceptance_rate": self.accepted / self.drafted if self.drafted else None,
                "tokens_per_round": self.tokens / self.rounds if self.rounds else None,
                "forwards_per_token": [f / self.tokens if self.tokens else None for f in self.forwards]}


@dataclass
class SpeculationStats:
    rows: list[RowRecord] = field(default_factory=list)
    agreed: list[int] = field(default_factory=list)   # per member: positions where its argmax was the choice
    positions: int = 0

    def summary(self, names: Sequence[str], proposer: int | None) -> dict:
        drafted = sum(r.drafted for r in self.rows)
        rounds = sum(r.rounds for r in self.rows)
        tokens = sum(r.tokens for r in self.rows)
        forwards = [sum(r.forwards[m] for r in self.rows if r.forwards) for m in range(len(names))]
        return {"speculative_proposer": AUTO if proposer is None else names[proposer],
                "speculative_acceptance_rate": sum(r.accepted for r in self.rows) / drafted if drafted else None,
                "speculative_tokens_per_round": tokens / rounds if rounds else None,
                "speculative_draft_length_mean": drafted / rounds if rounds else None,
                "speculative_forwards_per_token": {n: f / tokens if tokens else None for n, f in zip(names, forwards)},
                "speculative_agreement": {n: a / self.positions if self.positions and proposer in (None, m) else None
                                          for m, (n, a) in enumerate(zip(names, self.agreed))},  # counted members
                "speculative_rows": [r.summary() for r in self.rows]}


class RowRound(NamedTuple):
    """One row's round: tokens advanced, drafted tokens taken, tokens drafted, whether the proposer was
    right at the round's last decision, and the advance chosen last and not yet given to the members."""

    tokens: int
    accepted: int
    drafted: int
    agreed_after: bool
    pending: Advance | None


class Speculation:
    """Draft-and-verify decoding for one ``Speculable`` method (see the module docstring)."""

    def __init__(self, method: Speculable, longest: int, proposer: int | None):
        self.method, self.longest, self.proposer = method, longest, proposer
        self._members = list(method.members)
        self.all_states: list[RequestState] = []
        self.stats = SpeculationStats(agreed=[0] * len(method.members))
        self.costs = Costs()

    @classmethod
    def of(cls, method: Speculable, params: SpeculativeParams) -> Speculation | None:
        """The method's speculation, or None when ``speculative`` is 0 (every-token decoding)."""
        if not params.speculative:
            return None
        return cls(method, params.speculative, resolve_proposer(params, [m.name for m in method.members], method.lead))

    # --- the loop -------------------------------------------------------------------------------
    def decode(self, prompts: list[list[list[int]]], states: list[RequestState], timing: Timing) -> None:
        method = self.method
        self.all_states = states
        timing.start_batch()
        dists = prefill(method.members, prompts, [s.rule.max_new_tokens for s in states])
        members = [StandIn(m, d) for m, d in zip(method.members, dists)]
        records = [RowRecord(forwards=[0] * len(members)) for _ in states]
        live = list(range(len(states)))
        pending: list[Advance | None] = [None] * len(states)
        lengths = [0] * len(states)  # the first round drafts nothing: it is the first token
        rates = [Rate() for _ in states]
        first = True
        while live:
            drafts = self._round(members, [states[i] for i in live], [pending[i] for i in live],
                                 [lengths[i] for i in live], prompts, live)
            for i, row in zip(live, drafts):
                pending[i] = row.pending
                record = records[i]
                record.rounds += 1
                record.tokens += row.tokens
                record.drafted += row.drafted
                record.accepted += row.accepted
                rates[i].observe(row.accepted, row.drafted, row.agreed_after)
                lengths[i] = self._next_length(row.drafted, row.accepted, row.agreed_after, rates[i].value)
            timing.tokens_generated += sum(row.tokens for row in drafts)
            steps = sum(row.tokens for row in drafts) / len(drafts)
            timing.first_token(steps) if first else timing.step(steps)
            first = False
            still = [k for k, i in enumerate(live) if states[i].finish is None]
            for k, i in enumerate(live):
                records[i].forwards = [f + m.forwards[k] for f, m in zip(records[i].forwards, members)]
            for member in members:
                member.forwards = [0] * len(member.forwards)
            if len(still) < len(live):
                for member in members:
                    member.keep(still)
                live = [live[k] for k in still]
            for member in members:
                member.prune()
        self.stats.rows.extend(records)

    def _next_length(self, drafted: int, accepted: int, agreed_after: bool, rate: float) -> int:
        """The draft length with the most tokens per second expected, from the row's acceptance rate
        a and the measured costs: (1 + a + ... + a^d) / ((d + 1) c_proposer + c_block), d <= N
        (a round's proposer reads the last choice and d drafted tokens, each verifier one block).
        Before any cost is measured: all taken and the proposer right next -> two longer, else
        the number it got right."""
        if self.costs.step is None or not self.costs.blocks:
            return min(self.longest, drafted + 2) if accepted == drafted and agreed_after else accepted

        def promise(length: int) -> float:
            gained = sum(rate ** k for k in range(length + 1))
            return gained / ((length + 1) * self.costs.step + self.costs.block(length + 1))

        return max(range(self.longest + 1), key=promise)

    # --- one round ------------------------------------------------------------------------------
    def _round(self, members: list[StandIn], states: list[RequestState], pending: list[Advance | None],
               lengths: list[int], prompts, live: list[int]) -> list[RowRound]:
        """Rehearse, fetch, replay (module docstring); each row's round."""
        proposer = self._pick_proposer()
        room = [max(0, min(n, s.rule.max_new_tokens - s.count - 1)) for n, s in zip(lengths, states)]
        forced = self._rehearse(members, states, pending, room, proposer)
        return self._replay(members, states, pending, forced, proposer, prompts, live)

    def _rehearse(self, members: list[StandIn], states, pending, room: list[int], proposer: int) -> list[list[Advance]]:
        """Draft with the proposer while rehearsing the method's feeding on copies of the states;
        then fetch what every member will be asked for. Returns each row's drafted advances."""
        copies = self.method.copy_states(states)
        rehearsals = [Rehearsal(m.member, m.virtual) for m in members]
        rehearsing = self.method.speaking_to(rehearsals, counted=False)
        forced: list[list[Advance]] = [[] for _ in states]
        self._feed(rehearsing, rehearsals, copies, {k: a for k, a in enumerate(pending) if a is not None},
                   rehearse=True)
        drafter, rehearsal = members[proposer], rehearsals[proposer]
        going = [k for k in range(len(states)) if room[k] > 0]
        own = {k: list(rehearsal.virtual[k]) for k in going}  # the proposer's own greedy continuation
        with self.costs.timing(drafter, name="step"):
            drafter.fetch({k: (own[k], [len(own[k])]) for k in going})
        while going:
            going = self._draft_step(rehearsing, drafter, rehearsals, copies, forced, own, going, room, proposer)
        with self.costs.timing(*(m for i, m in enumerate(members) if i != proposer), name="block"):
            each(members, lambda member, plan: member.fetch(plan),
                 [{k: (r.virtual[k], r.needed[k]) for k in range(len(states))} for r in rehearsals])
        return forced

    def _draft_step(self, rehearsing: Speculable, drafter: StandIn, rehearsals: list[Rehearsal], copies, forced,
                    own: dict[int, list[int]], going: list[int], room: list[int], proposer: int) -> list[int]:
        """One draft position for rows ``going``: the proposer's greedy token, the method's advance
        for it (rehearsed), the token read by the proposer (one forward for the rows). Returns the
        rows that draft on."""
        dists = torch.stack([drafter.known[k][len(own[k])] for k in going])
        taken: dict[int, Advance] = {}
        for index, (k, token) in enumerate(zip(going, block_argmax(dists).tolist())):
            if token in drafter.member.stop_ids:
                continue
            advance = self.method.draft_advance(copies[k], token, proposer, dists[index])
            if advance is not None:
                taken[k] = advance
                forced[k].append(advance)
                own[k].append(token)
        self._feed(rehearsing, rehearsals, copies, taken, rehearse=True)
        with self.costs.timing(drafter, name="step"):
            drafter.fetch({k: (own[k], [len(own[k])]) for k in taken})
        return [k for k in taken if len(forced[k]) < room[k]]

    @staticmethod
    def _feed(method: Speculable, members: Sequence[Focused], states, advances: dict[int, Advance],
              rehearse: bool = False) -> None:
        """The method's feed (or its rehearsal of a step) for these rows of the batch; ``method`` speaks
        to ``members``."""
        if not advances:
            return
        rows = list(advances)
        focus(members, rows)
        chosen = [advances[k] for k in rows]
        if rehearse:
            method.rehearse([states[k] for k in rows], chosen)
        else:
            method.feed([None] * len(members), [states[k] for k in rows], chosen)

    def _replay(self, members: list[StandIn], states, pending, forced: list[list[Advance]], proposer: int,
                prompts, live: list[int]) -> list[RowRound]:
        """The method's own choices and feeding, answered from the fetched distributions."""
        lead = self.method.members[self.method.lead]
        method = self.method.speaking_to(members)
        outcome = [RowRound(0, 0, len(f), False, None) for f in forced]
        tokens = [0] * len(states)
        self._feed(method, members, states, {k: a for k, a in enumerate(pending) if a is not None})
        going, position = list(range(len(states))), 0
        while going:
            focus(members, going)
            dists = [m.current() for m in members]
            check_distributions(self.method_members, dists, [live[k] for k in going], prompts, self.all_states)
            advances = method.choose(dists, [states[k] for k in going]).advances
            agreed = self._agreement(dists, advances, proposer)
            goes_on: dict[int, Advance] = {}
            for index, (k, advance) in enumerate(zip(going, advances)):
                advance_request(lead, states[k], advance)
                tokens[k] += 1
                if states[k].finish is None and position < len(forced[k]) and advance == forced[k][position]:
                    goes_on[k] = advance
                else:
                    outcome[k] = RowRound(tokens[k], position, len(forced[k]), agreed[index],
                                          advance if states[k].finish is None else None)
            self._feed(method, members, states, goes_on)
            going, position = list(goes_on), position + 1
        return outcome

    def _agreement(self, dists: list[torch.Tensor], advances: list[Advance], proposer: int) -> list[bool]:
        """Per row, whether the proposer's own greedy token was the choice; with ``proposer: auto``
        every member's agreement is counted for the choice of the next proposers."""
        counted = range(len(dists)) if self.proposer is None else [proposer]
        result: list[bool] = []
        for index in counted:
            member = self.method_members[index]
            agrees = [(token in member.stop_ids and advance.finish == "stop_id")
                      or (advance.finish is None and member.vocab.pieces[token] == advance.data)
                      for token, advance in zip(block_argmax(dists[index]).tolist(), advances)]
            self.stats.agreed[index] += sum(agrees)
            if index == proposer:
                result = agrees
        self.stats.positions += len(advances)
        return result

    def _pick_proposer(self) -> int:
        """The fixed proposer, or (auto) the member whose agreement so far and forward cost promise
        the most tokens per second: (1 + a + ... + a^N) / (N c_i + sum of the others' c_j)."""
        if self.proposer is not None:
            return self.proposer
        costs = [m.clock.decode_seconds / m.clock.decode_calls if m.clock.decode_calls else 1.0
                 for m in self.method_members]
        positions = self.stats.positions

        def promise(index: int) -> float:
            rate = (self.stats.agreed[index] + 1) / (positions + 2)
            gained = sum(rate ** k for k in range(self.longest + 1))
            return gained / (self.longest * costs[index] + sum(costs) - costs[index])

        return max(range(len(costs)), key=promise)

    @property
    def method_members(self) -> list[Member]:
        return self._members

    def summary(self) -> dict:
        names = [m.name for m in self._members]
        return {"speculative": self.longest, **self.stats.summary(names, self.proposer)}
