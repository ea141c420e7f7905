"""ME — the Mixture-model-like Ensemble, "Rethinking LLM Ensembling from the Perspective of Mixture
Models" (arXiv 2605.00419).

The conventional ensemble (CE) samples each token from the weighted average of the members'
next-token distributions (Sec. 2.1),

    P(y | x) = sum_i lambda_i M_i(y | x),      lambda_i >= 0,  sum_i lambda_i = 1,

which needs every member's forward pass at every step. Read as a mixture model, the same
distribution is drawn from in two stages (Sec. 2.2): pick member i with probability lambda_i,
then draw y from M_i alone. Only the picked member must be current at that step; the others take
the chosen bytes later, in one call, when a step first needs them (the "lazy" KV synchronisation;
here the members' feeders of decoding/feeding.py, as GaC's gate skips members).

Members with different tokenizers meet in GaC's union vocabulary keyed by bytes (the authors' code
does the same): a member's token is the union entry of its bytes, and M_i projected onto the union
sums the ids with equal bytes, so drawing the member's own token and taking its bytes draws from the
projection. The picked member continues with its own token; the others take its bytes.

With a request's sampling settings each member's distribution is shaped before the draw
(decoding/sampling.py: temperature, top-k, top-p, min-p), as a member sampling alone shapes it:
the text is drawn from sum_i lambda_i shape(M_i), which is CE's shaped distribution exactly at
temperature 1 without truncation.

Greedy decoding (``do_sample`` false, or temperature 0) has no mixture draw: the mode of the mixture
is not the mode of a randomly picked member. A greedy request therefore takes CE's choice,
argmax_u sum_i lambda_i P_i(u) over the union (GaC's Eq. 3, every member run each step): the
distribution ME samples from, decoded greedily. Log-likelihoods are the mixture of the members'
sequence probabilities, as GaC scores (docs/methods/sampling_ensembles.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ensemble_bench.cache import cache_dir
from ensemble_bench.decoding.concurrent import each
from ensemble_bench.decoding.decode import STOP, Advance, DecodingMethod, PendingState, Round
from ensemble_bench.decoding.feeding import FeedStats, make_feeders
from ensemble_bench.decoding.method import (
    GenerationRequest,
    LoglikelihoodRequest,
    resolve_member,
    rolling_with_members,
    score_with_members,
    sequence_mixture,
)
from ensemble_bench.decoding.sampling import NOT_DRAWN, Sampler, draw_rows, inverse_cdf, rows_of, sampling_rows
from ensemble_bench.decoding.stats import MethodStats
from ensemble_bench.members.base import Member, Score
from ensemble_bench.methods.me_params import MeParams, MeSpec, resolve_weights
from ensemble_bench.vocab.mixture import UnionMixture
from ensemble_bench.vocab.union import UnionVocab
from ensemble_bench.vocab.union_cache import cached_union

CE = -1  # a greedy step's "member": the conventional ensemble's argmax over the union


@dataclass
class MeState(PendingState):
    """A request under ME: the pieces each member has not taken yet, and which member drew each step."""

    drawn_by: list[int] = field(default_factory=list)  # per step: the member picked, or CE (greedy)

    def copy(self) -> MeState:
        copied = super().copy()
        copied.drawn_by = list(self.drawn_by)
        return copied


@dataclass(frozen=True)
class MePick(Advance):
    """A row's step: the picked member and its own token, or (``member`` CE) a union entry."""

    member: int = CE
    token: int = -1


@dataclass
class MeCounts:
    steps_per_member: list[int]  # sampled steps each member was picked for
    greedy_steps: int = 0        # steps decided by CE's argmax (greedy requests)
    member_calls: int = 0        # member forward calls (prefill excluded)


@dataclass(frozen=True)
class MeReport(MethodStats):
    union_size: int
    lead_index: int
    weights_resolved: list[float]
    steps_per_member: list[int]
    greedy_steps: int
    member_calls_per_step: float | None  # forward calls per decode step, n for CE


class Me(MeSpec, DecodingMethod):

    def __init__(self, members: Sequence[Member], params: MeParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        self.weights = resolve_weights(params, len(members))
        self.lead = resolve_member(params.lead, [m.name for m in members], params.lead_spelling)
        self.union: UnionVocab = cached_union([m.vocab for m in members], [sorted(m.stop_ids) for m in members],
                                              cache_dir() / "union")
        self.mixture = UnionMixture(self.union, self.weights, [m.vocab.size for m in members])
        self.stop_entries = frozenset(self.union.stop_mask.nonzero().flatten().tolist())
        self.feed_stats = FeedStats()
        self.feeders = make_feeders(members, params.retokenize, self.feed_stats, params.window,
                                    [self.union.maps[i].by_bytes for i in range(len(members))])
        self.stats = MeCounts([0] * len(members))
        self._picking = torch.tensor([self.weights], dtype=torch.float64)
        self._unmapped_ids: dict[tuple[int, int, str], torch.Tensor] = {}

    def statistics(self) -> MeReport:
        steps = sum(self.stats.steps_per_member) + self.stats.greedy_steps
        return MeReport(union_size=self.union.size, lead_index=self.lead, weights_resolved=self.weights,
                        steps_per_member=list(self.stats.steps_per_member), greedy_steps=self.stats.greedy_steps,
                        member_calls_per_step=self.stats.member_calls / steps if steps else None)

    # --- generation: the loop's steps -------------------------------------------------------------
    def start(self, request: GenerationRequest) -> MeState:
        return MeState.of(request)

    def choose(self, dists: list[torch.Tensor], states: list[MeState]) -> Round:
        """Sec. 2.2 per sampling row: member i ~ lambda from the row's generator, then its token ~ shaped
        M_i; a greedy row takes CE's argmax over the union. Members a row needs catch up first."""
        samplers = [state.sampler for state in states]
        drawing = sampling_rows(samplers)
        members = [CE] * len(states)
        if drawing:
            picked = inverse_cdf(self._picking.expand(len(drawing), -1), [samplers[k].generator for k in drawing])
            for k, member in zip(drawing, picked.tolist()):
                members[k] = member
        dists = self._catch_up(states, members, dists)
        picks: list[Advance] = [STOP] * len(states)
        for member in sorted(set(members)):
            rows = [k for k, m in enumerate(members) if m == member]
            for k, pick in zip(rows, self._pick(member, dists, rows, samplers)):
                picks[k] = pick
                states[k].drawn_by.append(member)
        return Round(picks, dists)

    def _pick(self, member: int, dists: list[torch.Tensor], rows: list[int],
              samplers: Sequence[Sampler | None]) -> list[Advance]:
        """These rows' advances: member ``member``'s own draws, or (CE) the union's argmax."""
        if member == CE:
            self.stats.greedy_steps += len(rows)
            return [self._entry_advance(entry) for entry in self.mixture.greedy([rows_of(d, rows) for d in dists])]
        self.stats.steps_per_member[member] += len(rows)
        own = rows_of(dists[member], rows)
        tokens = draw_rows(own.masked_fill(self._unmapped(member, own), NOT_DRAWN), [samplers[k] for k in rows])
        return [self._own_advance(member, token) for token in tokens]

    def _unmapped(self, member: int, dist: torch.Tensor) -> torch.Tensor:
        """[V] true for the member's ids that map to no union entry (special tokens other than its stops,
        padded head rows): M_i projected onto the union has no mass there, so they are never drawn."""
        key = (member, dist.shape[-1], str(dist.device))
        if key not in self._unmapped_ids:
            mapped = torch.zeros(dist.shape[-1], dtype=torch.bool)
            mapped[self.union.maps[member].src_ids] = True
            self._unmapped_ids[key] = (~mapped).to(dist.device)
        return self._unmapped_ids[key]

    def _entry_advance(self, entry: int) -> Advance:
        if entry in self.stop_entries:
            return STOP
        lead_token = int(self.union.maps[self.lead].to_member[entry])
        return MePick(self.union.entries[entry], (lead_token,) if lead_token >= 0 else None, 1)

    def _own_advance(self, member: int, token: int) -> Advance:
        """Member ``member``'s token: its bytes, the lead's id for them (the token itself for the lead)."""
        if token in self.members[member].stop_ids:
            return STOP
        data = self.members[member].vocab.pieces[token] or b""
        lead_token = token if member == self.lead else self.union.maps[self.lead].by_bytes.get(data)
        return MePick(data, None if lead_token is None else (lead_token,), 1, member=member, token=token)

    def _catch_up(self, states: list[MeState], members: list[int], dists: list[torch.Tensor]) -> list[torch.Tensor]:
        """Members a row needs this step (its picked member; every member for CE) take the pieces they
        missed, every row's in one call (pieces applied one by one: the result does not depend on when)."""
        needed = sorted({index for k, member in enumerate(members) for index in range(len(self.members))
                         if member in (CE, index) and states[k].pending.get(index)})
        chunks = [[state.pending.pop(index, []) for state in states] for index in needed]
        self.stats.member_calls += len(needed)
        results = each([self.members[index] for index in needed],
                       lambda member, index, member_chunks: self.feeders[index].give(states, member_chunks),
                       needed, chunks)
        updated = list(dists)
        for index, result in zip(needed, results):
            updated[index] = result
        return updated

    def feed(self, dists, states: list[MeState], picks: list[MePick]) -> list[torch.Tensor]:
        """The picked member takes its own token; at a CE step every member takes the bytes; other members
        keep the bytes pending (``_catch_up`` gives them when a step needs the member)."""
        calls = []  # (member index, chunks, direct)
        for index in range(len(self.members)):
            chunks: list[list[bytes]] = []
            direct: list[list[int]] = []
            for state, pick in zip(states, picks):
                if pick.member == index:
                    chunks.append([])
                    direct.append([pick.token])
                elif pick.member == CE:
                    chunks.append([pick.data])
                    direct.append([])
                else:
                    state.pending.setdefault(index, []).append(pick.data)
                    chunks.append([])
                    direct.append([])
            if any(chunks) or any(direct):
                calls.append((index, chunks, direct))
        self.stats.member_calls += len(calls)
        results = each([self.members[index] for index, _, _ in calls],
                       lambda member, call: self.feeders[call[0]].give(states, call[1], call[2]), calls)
        updated = list(dists)
        for (index, _, _), result in zip(calls, results):
            updated[index] = result
        return updated

    # --- scoring: the mixture of the members' sequence probabilities, as GaC -----------------------
    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Score]:
        per_member = score_with_members(self.members, requests, self.batch_size)
        combined = sequence_mixture(self.weights, [[s.logprob for s in scores] for scores in per_member])
        return [Score(lp, all(scores[k].is_greedy for scores in per_member)) for k, lp in enumerate(combined)]

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        return sequence_mixture(self.weights, rolling_with_members(self.members, texts, self.batch_size))
