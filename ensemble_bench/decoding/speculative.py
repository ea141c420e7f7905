"""Draft and verify across tokenizers: a token-level method decodes speculatively and every output
equals its every-token mode (method parameter ``speculative: N``, docs/speculative.md).

A method opts in by declaring ``Speculable`` (its steps, ``draft_advance``, ``rehearse``,
``speaking_to``, ``copy_states``; ``SpeculativeSteps`` gives the last three to a method with feeders).
The engine never patches the method: stand-in members reach it through ``speaking_to``, a view that
leaves the method as it is, and the rehearsal works on ``copy_states`` copies with its feeding
uncounted. ``Speculation`` is a strategy of the one decode loop (``decoding.decode.decode_batch``:
prefill, live rows, stopping, keeping and timing are the loop's); each of its rounds, for the live
rows of a batch:

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

Every decision is the method's own, on the distributions of the text it chose: the outputs are the
every-token outputs up to the float differences between a block forward and one-token steps
(docs/speculative.md lists the near-ties measured). A request that samples drafts by sampling and is
verified by ``SamplingAcceptance`` (decoding/acceptance.py, beside the greedy rule), which keeps its
output distribution the ensemble's (methods that offer ``speculative_choice``: GaC;
decoding/speculative_sampling.py).

The draft length adapts to the batch (``_draft_lengths``): the d <= N with the most tokens per second
expected from its rows' acceptance rates and the measured costs of a proposer step and of the
verifiers' block; 0 is a plain every-token round. Where rounds that drafted took more wall time per
token than plain rounds at the same number of live rows (``Pace``: crops, re-submissions and the
round's bookkeeping, which the members' forward clocks do not see), rounds are plain. After
``probe_after`` plain rounds in a row one round drafts again (at least one token), so both are
measured anew; a probe that loses doubles the wait (PROBE_AFTER up to PROBE_MOST). ``proposer: auto`` picks, each
round, the member whose measured agreement and forward cost promise the most tokens per second.
"""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import torch

from ensemble_bench.decoding.acceptance import GreedyAcceptance
from ensemble_bench.decoding.concurrent import each
from ensemble_bench.decoding.decode import (
    Advance,
    RequestState,
    Round,
    Rounds,
    Tally,
    advance_request,
    check_distributions,
    located,
)
from ensemble_bench.decoding.feeding import Feeder, FeedStats
from ensemble_bench.decoding.fused import NonFiniteFusion
from ensemble_bench.decoding.params import SpeculativeParams as SpeculativeParams
from ensemble_bench.decoding.params import resolve_proposer as resolve_proposer
from ensemble_bench.decoding.speculation_stats import Costs, Pace, Rate, RowRecord, SpeculationStats
from ensemble_bench.decoding.speculative_sampling import Drafted, draft_tokens, replay_choice, samples
from ensemble_bench.decoding.stand_ins import Focused, Read, Rehearsal, StandIn, focus
from ensemble_bench.members.base import BLOCK_READS, Member, require
from ensemble_bench.vocab.fast_topk import block_argmax

PROBE_AFTER = 8  # plain rounds in a row, after which one drafts (the rows' own lengths, at least 1)
PROBE_MOST = 64  # the longest wait between probes, after probes that kept losing on the wall clock


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


def unmet(method: object) -> list[str]:
    """What ``method`` lacks of ``Speculable``: each attribute it does not have, and each hook its
    class does not define or defines so that it cannot take the protocol's arguments."""
    defined = dict(inspect.getmembers(type(method), inspect.isfunction))  # the class's own hooks, inherited too
    lacking = [name for name in Speculable.__annotations__ if not hasattr(method, name)]
    for name, declared in vars(Speculable).items():
        if not inspect.isfunction(declared) or name.startswith("_"):
            continue
        arguments = list(inspect.signature(declared).parameters)  # self, then the protocol's arguments
        if name not in defined:
            lacking.append(name)
            continue
        try:
            inspect.signature(defined[name]).bind(*arguments)
        except TypeError:
            lacking.append(f"{name}({', '.join(arguments[1:])})")
    return lacking


class SpeculativeSteps:
    """``Speculable``'s defaults for a method whose members take chosen text through ``feeders``
    (decoding/feeding.py) counted in ``feed_stats``: a view of the method over other members, a
    rehearsal that feeds as a step would, and the states' own copies. Statistics a step counts must
    live in objects the view shares (``self.stats.x += 1``, never ``self.x += 1``)."""

    members: list[Member]
    feeders: list[Feeder | None]
    feed_stats: FeedStats
    speculation: Speculation | None

    def carried(self) -> dict[str, object]:
        """The method's accumulators (``Method.carried``, next in the method's bases) and the speculation's:
        a resumed row's statistics count every sitting (sittings.py)."""
        speculation = {"speculation": self.speculation.stats} if self.speculation else {}
        return {**super().carried(), **speculation}  # type: ignore[misc]

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


class RowRound(NamedTuple):
    """One row's round: tokens advanced, drafted tokens taken, tokens drafted, whether the proposer was
    right at the round's last decision, and the advance chosen last and not yet given to the members."""

    tokens: int
    accepted: int
    drafted: int
    agreed_after: bool
    pending: Advance | None


class Speculation(Rounds):
    """Draft-and-verify rounds for one ``Speculable`` method, inside the decode loop
    (``decoding.decode.decode_batch``; see the module docstring)."""

    acceptance = GreedyAcceptance()

    def __init__(self, method: Speculable, longest: int, proposer: int | None):
        self.method, self.longest, self.proposer = method, longest, proposer
        self._members = list(method.members)
        self.stats = SpeculationStats(forwards=[0] * len(method.members), agreed=[0] * len(method.members))
        self.costs = Costs()
        self.pace = Pace()
        self.plain_rounds = 0  # plain rounds in a row that the costs or the pace chose
        self.probe_after = PROBE_AFTER  # plain rounds in a row before a probe drafts

    @classmethod
    def of(cls, method: Speculable, params: SpeculativeParams) -> Speculation | None:
        """The method's speculation, or None when ``speculative`` is 0 (every-token decoding)."""
        if not params.speculative:
            return None
        if lacking := unmet(method):
            raise TypeError(f"{type(method).__name__} cannot decode speculatively: it lacks {', '.join(lacking)} "
                            "(decoding/speculative.py: Speculable)")
        require(method.members, BLOCK_READS, f"{method.name}: speculative: {params.speculative}")
        return cls(method, params.speculative, resolve_proposer(params, [m.name for m in method.members], method.lead))

    # --- the loop's rounds ----------------------------------------------------------------------
    def begin(self, dists: list[torch.Tensor], prompts: list[list[list[int]]], states: list[RequestState]) -> None:
        self.prompts, self.all_states = prompts, states
        self.stand_ins = [StandIn(m, d) for m, d in zip(self.method.members, dists)]
        self.records = [RowRecord(forwards=[0] * len(self.stand_ins)) for _ in states]
        self.pending: list[Advance | None] = [None] * len(states)  # chosen last, not yet given to the members
        self.lengths = [0] * len(states)  # before the costs are measured; the first round drafts nothing
        self.paced_rounds = 0  # rounds of this batch the pace has seen (the first is the prefill's, uncounted)
        self.aftermath = False  # whether the last round drafted: this one re-reads its rows (crops, re-submissions)
        self.rates = [Rate() for _ in states]

    def round(self, live: list[int]) -> Tally:
        """Rehearse, fetch, replay (module docstring) for rows ``live``; then each row's record and
        next draft length."""
        started = time.perf_counter()
        states, pending = [self.all_states[i] for i in live], [self.pending[i] for i in live]
        proposer = self._pick_proposer()
        # a row that samples always drafts N, from its first round: its draws never depend on the clock
        lengths = [self.longest if samples(s) else d for s, d in zip(states, self._draft_lengths(live))]
        room = [max(0, min(d, s.rule.max_new_tokens - s.count - 1)) for d, s in zip(lengths, states)]
        self.drafted: list[list[Drafted]] = [[] for _ in states]  # sampling rows: what each position proposed
        if any(room) or 1 not in self.costs.blocks:
            forced = self._rehearse(self.stand_ins, states, pending, room, proposer)
        else:  # an every-token round: the replay reads what it needs, in one forward per member
            forced = [[] for _ in states]
        rows = self._replay(self.stand_ins, states, pending, forced, proposer, self.prompts, live)
        for k, (i, row) in enumerate(zip(live, rows)):
            self.pending[i] = row.pending
            self._observe(self.records[i], self.rates[i], row, [m.forwards[k] for m in self.stand_ins])
            grows = row.accepted == row.drafted and row.agreed_after
            self.lengths[i] = min(self.longest, row.drafted + 2) if grows else row.accepted
        for member in self.stand_ins:
            member.forwards = [0] * len(member.forwards)
            member.prune()
        tokens = sum(row.tokens for row in rows)
        self._paced(len(live), any(room), time.perf_counter() - started, tokens)
        return Tally(tokens, tokens / len(rows))

    def _paced(self, rows: int, drafted: bool, seconds: float, tokens: int) -> None:
        """The round's wall time into the pace (a round after one that drafted counts as drafting: it pays
        for that round's rejected tokens, cropping and re-reading its rows; a batch's first round, which
        the prefill answered, not at all); after a round that drafted, the wait before the next probe:
        doubled when drafting now loses at this many rows, else the first."""
        self.paced_rounds += 1
        aftermath, self.aftermath = self.aftermath, drafted
        if self.paced_rounds == 1:
            return
        self.pace.observe(rows, drafted or aftermath, seconds, tokens)
        if drafted:
            loses = self.pace.drafting_loses(rows)
            self.probe_after = min(PROBE_MOST, 2 * self.probe_after) if loses else PROBE_AFTER

    @staticmethod
    def _observe(record: RowRecord, rate: Rate, row: RowRound, forwards: list[int]) -> None:
        """A row's round into its record (with the forward passes it took part in) and its rate."""
        record.rounds += 1
        record.tokens += row.tokens
        record.drafted += row.drafted
        record.accepted += row.accepted
        record.forwards = [f + n for f, n in zip(record.forwards, forwards)]
        rate.observe(row.accepted, row.drafted, row.agreed_after)

    def keep(self, still: list[int]) -> None:
        for member in self.stand_ins:
            member.keep(still)

    def end(self) -> None:
        """The batch's rows into the statistics; its stand-ins (and their distributions) let go."""
        self.stats.add(self.records)
        self.stand_ins, self.records = [], []

    def _draft_lengths(self, live: list[int]) -> list[int]:
        """Each live row's draft length this round: 0 until a plain round is paced; until both costs are
        measured its own (two longer after a fully taken draft the proposer also got right next, else the
        number taken); then the batch's, the d <= N with the most tokens per second over its rows'
        acceptance rates a_r, sum_r (1 + a_r + ... + a_r^d) / ((d + 1) c_proposer + c_block(d + 1)): the
        rows share the proposer's steps and a block as wide as the longest draft (batch 1: the row's own
        best d). 0 where the pace says drafting loses at this many rows; a probe after ``probe_after``
        plain rounds in a row."""
        if not self.pace.plain:  # a plain round first, to weigh every drafting round against
            return [0] * len(live)
        best = self._best_length(live) if self.costs.step is not None and self.costs.blocks else None
        if self.pace.drafting_loses(len(live)):  # the wall clock saw what the members' clocks did not
            best = 0
        if best == 0 and self.plain_rounds >= self.probe_after:  # plain rounds measure no block: a dear one sticks
            self.plain_rounds = 0
            return [max(1, self.lengths[i]) for i in live]
        self.plain_rounds = self.plain_rounds + 1 if best == 0 else 0
        return [self.lengths[i] for i in live] if best is None else [best] * len(live)

    def _best_length(self, live: list[int]) -> int:
        """The d <= N the members' measured costs promise the most tokens per second for rows ``live``."""
        rates = [self.rates[i].value for i in live]

        def promise(length: int) -> float:
            gained = sum(sum(rate ** k for k in range(length + 1)) for rate in rates)
            return gained / ((length + 1) * self.costs.step + self.costs.block(length + 1))

        return max(range(self.longest + 1), key=promise)

    # --- one round ------------------------------------------------------------------------------
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
            drafter.fetch({k: Read(own[k], [len(own[k])]) for k in going})
        while going:
            going = self._draft_step(rehearsing, drafter, rehearsals, copies, forced, own, going, room, proposer)
        with self.costs.timing(*(m for i, m in enumerate(members) if i != proposer), name="block"):
            each(members, lambda member, plan: member.fetch(plan),
                 [{k: Read(r.virtual[k], r.needed[k]) for k in range(len(states))} for r in rehearsals])
        return forced

    def _draft_step(self, rehearsing: Speculable, drafter: StandIn, rehearsals: list[Rehearsal], copies, forced,
                    own: dict[int, list[int]], going: list[int], room: list[int], proposer: int) -> list[int]:
        """One draft position for rows ``going``: the proposer's greedy token, the method's advance
        for it (rehearsed), the token read by the proposer (one forward for the rows). Returns the
        rows that draft on."""
        dists = torch.stack([drafter.known[k][len(own[k])] for k in going])
        taken: dict[int, Advance] = {}
        for index, (k, token) in enumerate(zip(going, draft_tokens(dists, [copies[k] for k in going]))):
            advance = None if token in drafter.member.stop_ids else self.method.draft_advance(
                copies[k], token, proposer, dists[index])
            if samples(copies[k]):  # the proposal, and "none" for a token the draft cannot take
                self.drafted[k].append(Drafted(advance, proposer, dists[index]))
            if advance is not None:
                taken[k] = advance
                forced[k].append(advance)
                own[k].append(token)
        self._feed(rehearsing, rehearsals, copies, taken, rehearse=True)
        with self.costs.timing(drafter, name="step"):
            drafter.fetch({k: Read(own[k], [len(own[k])]) for k in taken})
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
            try:
                advances = replay_choice(method, dists, [states[k] for k in going],
                                         [self._drafted_at(k, position) for k in going])
            except NonFiniteFusion as err:
                raise located(err, self.method, [live[k] for k in going], prompts, self.all_states) from None
            agreed = self._agreement(dists, advances, proposer)
            goes_on: dict[int, Advance] = {}
            for index, (k, advance) in enumerate(zip(going, advances)):
                advance_request(lead, states[k], advance)
                tokens[k] += 1
                if (states[k].finish is None and position < len(forced[k])
                        and self.acceptance.accepts(advance, forced[k][position])):
                    goes_on[k] = advance
                else:
                    outcome[k] = RowRound(tokens[k], position, len(forced[k]), agreed[index],
                                          advance if states[k].finish is None else None)
            self._feed(method, members, states, goes_on)
            going, position = list(goes_on), position + 1
        return outcome

    def _drafted_at(self, k: int, position: int) -> Drafted | None:
        """What row k's proposer drafted at ``position`` of the replay (None: past its draft, or a greedy row)."""
        drafted = self.drafted[k]
        return drafted[position] if position < len(drafted) else None

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
