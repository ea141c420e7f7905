"""SAFE — "When to Ensemble: Identifying Token-Level Points for Stable and Fast LLM Ensembling"
(Yun, Ki, Lee, Yang; arXiv 2510.15346v2). Generate - verify - ensemble, one cycle per round
(Sec. 3, Algorithm 1):

1. generate (Sec. 3.1): the drafter decodes up to ``draft_tokens`` tokens greedily;
2. verify (Sec. 3.2): every verifier re-tokenises the committed text + the draft with its own
   tokenizer (canonically: vocab/retokenize.py). (i) OOV-like check, Eq. (1): a draft position
   (the start of a drafter token) may be ensembled only when the text before it ends on a token
   boundary of every verifier's re-tokenisation (compared as byte offsets). (ii) ensemble
   distribution check: an allowed position is skipped when (1) every verifier's most probable
   token is its own token of the draft there (unanimous consensus), or (2) the average over all
   members, drafter included (weighted, App. H), of each member's probability of its own aligned
   token is above 1/2. With ``gate_threshold`` (GaC's rule, Sec. 4.1 "Baselines": "GaC + SAFE") a position
   is also skipped unless the drafter's top probability is below ``gate_threshold``. The earliest position
   left is ensembled;
3. ensemble (Sec. 3.3): the members' distributions there are averaged over the union vocabulary,
   keyed by bytes (GaC Eq. 3, vocab/mixture.py). When the average is overly smooth (its top
   probability below ``sharpen``, the paper's 0.5) it is sharpened heuristically: each candidate
   -- one of the drafter's ``POOL_TOP`` most probable tokens whose average exceeds
   ``candidate_floor`` (the paper's lambda) -- gains the average of the entries that extend it
   (whose bytes start with its bytes; the pool: every member's ``POOL_TOP`` most probable
   entries, as the authors' code), so " Sofia" and " Sofa" consolidate into " So"; then the top
   entry is chosen. If it is the drafter's token the draft goes on (Algorithm 1 re-drafts from it;
   under greedy decoding the drafter would draft the same tokens again); otherwise it replaces the
   token and the rest of the draft is discarded.

A verifier whose vocabulary is the drafter's reads the drafter's own ids (there is nothing to
re-tokenise: every position is stable for it), so a member ensembled with itself always agrees
and equals the member alone. Every member's KV cache stays warm (App. D prunes and re-extends the
caches too). As the paper's verifier, each verifier reads the committed text + the whole draft in
ONE forward pass per cycle for the whole batch (``read_block``: it appends what the row lacks and
returns the distributions at every stable position), after a crop to the longest prefix it still
shares; after the decision it is cropped back to the committed text, and the next cycle's block
reads the tokens it lacks. The drafter drafts token by token and then moves to the committed ids
with one crop and one extend (``move_rows``). The decisions are those of one-token extends, within
float tolerance (tests/methods/test_safe.py compares them).

Log-likelihood (multiple choice): the drafter's own score; SAFE ensembles only while generating.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ensemble_bench.cache import cache_dir
from ensemble_bench.decoding.concurrent import each
from ensemble_bench.decoding.decode import Advance, DecodingMethod, RequestState, Round
from ensemble_bench.decoding.feeding import canonical_tail, text_appender
from ensemble_bench.decoding.method import (
    GenerationRequest,
    LoglikelihoodRequest,
    normalised_weights,
    resolve_member,
    rolling_with_members,
    score_with_members,
)
from ensemble_bench.decoding.stats import MethodStats, spread
from ensemble_bench.members.base import BLOCK_READS, Member, Score, require
from ensemble_bench.methods.safe_params import SafeParams, SafeSpec
from ensemble_bench.methods.safe_reading import Draft, Reading, crop_rows, move_rows, sharpened_choice
from ensemble_bench.vocab.append import common_prefix
from ensemble_bench.vocab.fast_topk import block_argmax
from ensemble_bench.vocab.mixture import UnionMixture
from ensemble_bench.vocab.union_cache import cached_union

POOL_TOP = 10      # the sharpening pool: each member's most probable union entries (authors' code: top 10)
AVERAGE_SKIP = 0.5  # Sec. 3.2 (ii)(2): skip when the (weighted) average of the own-token probabilities is above this
END = -1            # a verifier's read after the whole of a row's reading (beside its stable positions)


@dataclass
class SafeState(RequestState):
    """A request under SAFE: the writer's ids are the drafter's (while every chosen piece is one of its tokens)."""

    prompt: list[list[int]] = field(default_factory=list)      # each member's prompt ids in its row
    held: dict[int, list[int]] = field(default_factory=dict)   # member -> generated ids it holds
    pending: dict[int, bytes] = field(default_factory=dict)    # canonical verifier -> bytes of half a character


@dataclass
class SafeStats:
    rounds: int = 0
    drafts_accepted: int = 0  # rounds whose whole draft was kept
    tokens: int = 0           # tokens committed (drafter tokens, replaced tokens, stops)
    stable: int = 0           # positions checked for consensus (no OOV-like token before them)
    unanimous: int = 0        # skipped by Sec. 3.2 (ii)(1): every verifier's top token is its draft token
    average: int = 0          # skipped by Sec. 3.2 (ii)(2) only: the average own-token probability > 1/2
    gated: int = 0            # skipped by ``gate_threshold`` only: the drafter's top probability is not below it
    ensembled: int = 0        # positions ensembled
    sharpened: int = 0        # ensembled positions whose average was sharpened (Sec. 3.3)
    replaced: int = 0         # ensembled positions whose choice was not the drafter's token

    def summary(self) -> dict:
        return {"safe_rounds": self.rounds, "drafts_accepted": self.drafts_accepted,
                "draft_acceptance_rate": self.drafts_accepted / self.rounds if self.rounds else None,
                "tokens_committed": self.tokens, "stable_positions": self.stable,
                "skipped_unanimous": self.unanimous, "skipped_average": self.average, "skipped_gate": self.gated,
                "tokens_ensembled": self.ensembled, "tokens_sharpened": self.sharpened,
                "tokens_replaced": self.replaced,
                "ensembled_fraction": self.ensembled / self.tokens if self.tokens else None}


@dataclass(frozen=True)
class SafeReport(MethodStats):
    lead_index: int
    union_size: int
    verifiers_sharing_the_drafter_vocabulary: list[int]
    cycles: dict = spread()  # SafeStats.summary(): drafts, positions checked, skipped, ensembled


class Safe(SafeSpec, DecodingMethod):

    def __init__(self, members: Sequence[Member], params: SafeParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        require(members, BLOCK_READS, "safe (its verifier reads each draft in one pass)")
        self.lead = resolve_member(params.lead, [m.name for m in members], params.lead_spelling)  # the drafter
        weights = normalised_weights(params.weights or [1.0] * len(members), len(members))
        self.weights = weights
        self.union = cached_union([m.vocab for m in members], [sorted(m.stop_ids) for m in members],
                                  cache_dir() / "union")
        self.mixture = UnionMixture(self.union, weights, [m.vocab.size for m in members])
        self.stop_entries = frozenset(self.union.stop_mask.nonzero().flatten().tolist())
        self.verifiers = [v for v in range(len(members)) if v != self.lead]
        draft_vocab = members[self.lead].vocab
        self.shared = {v for v in self.verifiers if members[v].vocab == draft_vocab}  # read the drafter's ids
        self.tails = {v: canonical_tail(members[v]) for v in self.verifiers if v not in self.shared}
        self.appender = text_appender(members[self.lead], params.window, self.union.maps[self.lead].by_bytes)
        self.stats = SafeStats()

    def statistics(self) -> SafeReport:
        return SafeReport(lead_index=self.lead, union_size=self.union.size,
                          verifiers_sharing_the_drafter_vocabulary=sorted(self.shared), cycles=self.stats.summary())

    # --- generation: the loop's steps -------------------------------------------------------------
    def start(self, request: GenerationRequest) -> SafeState:
        return SafeState.of(request)

    def choose(self, dists: list[torch.Tensor], states: list[SafeState]) -> Round:
        """One generate-verify-ensemble cycle for every live row."""
        if not states[0].prompt:
            self._begin(states)
        drafts = self._draft(dists[self.lead], states)
        readings = {v: [self._reading(v, s, d) for s, d in zip(states, drafts)] for v in self.verifiers}
        positions = [self._stable(d, [readings[v][k] for v in self.verifiers]) for k, d in enumerate(drafts)]
        seen = dict(zip(self.verifiers, each([self.members[v] for v in self.verifiers], lambda _, v: self._verify(
            v, states, readings[v], drafts, positions), self.verifiers)))
        outcomes = [self._decide(k, draft, positions[k], readings, seen) for k, draft in enumerate(drafts)]
        advances = [self._advance(state, draft, outcome) for state, draft, outcome in zip(states, drafts, outcomes)]
        dists = self._commit(states, drafts, readings, outcomes, seen)
        return Round(advances, dists, by_span=True)

    def feed(self, dists, states, advances) -> list[torch.Tensor]:
        """Nothing left to give: the cycle's commit moved every member."""
        return dists

    def _begin(self, states: list[SafeState]) -> None:
        prompts = [m.row_ids() for m in self.members]
        for k, state in enumerate(states):
            state.prompt = [rows[k] for rows in prompts]
            state.held = {v: [] for v in range(len(self.members))}
            state.pending = {v: b"" for v in self.tails}

    # 1. generate
    def _draft(self, dist: torch.Tensor, states: list[SafeState]) -> list[Draft]:
        drafter = self.members[self.lead]
        drafts = [Draft() for _ in states]
        open_rows = [True] * len(states)
        while any(open_rows):
            picks = block_argmax(dist).tolist()
            grow: list[list[int]] = [[] for _ in states]
            for k, (state, draft) in enumerate(zip(states, drafts)):
                if not open_rows[k]:
                    continue
                draft.seen.append(dist[k])
                if picks[k] in drafter.stop_ids:
                    draft.stop, open_rows[k] = True, False
                    continue
                draft.tokens.append(picks[k])
                draft.offsets.append(draft.offsets[-1] + len(drafter.vocab.pieces[picks[k]] or b""))
                grow[k] = [picks[k]]
                open_rows[k] = not self._draft_ends(state, draft)
            if any(grow):
                dist = drafter.extend(grow)
        return drafts

    def _draft_ends(self, state: SafeState, draft: Draft) -> bool:
        budget_left = state.rule.max_new_tokens - state.count
        if len(draft.tokens) >= self.params.draft_tokens or len(draft.tokens) >= budget_left:
            return True
        text = (bytes(state.data) + self.members[self.lead].vocab.join(draft.tokens)).decode("utf-8", "replace")
        return any(u and u in text for u in state.rule.until)

    # 2. verify
    def _reading(self, v: int, state: SafeState, draft: Draft) -> Reading:
        """Verifier ``v``'s ids of the committed text + the draft (re-tokenised canonically)."""
        if v in self.shared:
            return Reading(tuple(state.held[self.lead]), tuple(draft.tokens), tuple(draft.offsets[1:]), 0)
        pieces = self.members[v].vocab.pieces
        held = state.held[v]
        data = self.members[self.lead].vocab.join(draft.tokens)
        plan = self.tails[v].plan(held, state.pending[v], data)
        start = len(self.members[v].vocab.join(held[:plan.keep])) - len(state.data)
        ends, at = [], start
        for token in plan.ids:
            at += len(pieces[token] or b"")
            ends.append(at)
        return Reading(tuple(held[:plan.keep]), plan.ids, tuple(ends), start, plan.pending)

    @staticmethod
    def _stable(draft: Draft, readings: list[Reading]) -> list[int]:
        """Draft positions (token indices; ``len(tokens)`` for the drafter's stop) that start a token
        in every verifier's reading (the stop: end one)."""
        stable = [t for t in range(len(draft.tokens)) if all(r.starts_token(draft.offsets[t]) for r in readings)]
        if draft.stop and all(r.count_to(draft.offsets[-1]) is not None for r in readings):
            stable.append(len(draft.tokens))
        return stable

    def _verify(self, v: int, states: list[SafeState], readings: list[Reading], drafts: list[Draft],
                positions: list[list[int]]) -> list[dict[int, torch.Tensor]]:
        """Verifier ``v`` reads every row's committed text + draft in ONE ``read_block`` (one forward
        pass for the batch); returns per row its log-probs at each stable position and at ``END``."""
        member = self.members[v]
        targets = [state.prompt[v] + list(reading.prefix + reading.ids) for state, reading in zip(states, readings)]
        wanted = [self._last_tokens(len(state.prompt[v]), reading, draft, stable, len(target))
                  for state, reading, draft, stable, target in zip(states, readings, drafts, positions, targets)]
        held = member.row_ids()
        keep = [min(common_prefix(row, target), *ends.values()) for row, target, ends in zip(held, targets, wanted)]
        crop_rows(member, held, keep)
        at = [sorted({i - k for i in ends.values()}) for k, ends in zip(keep, wanted)]
        read = member.read_block([target[k:] for k, target in zip(keep, targets)], at)
        return [{t: rows[cols.index(i - k)] for t, i in ends.items()}
                for rows, cols, k, ends in zip(read, at, keep, wanted)]

    @staticmethod
    def _last_tokens(prompt: int, reading: Reading, draft: Draft, stable: list[int], length: int) -> dict[int, int]:
        """Per stable position (and ``END``), the index in the verifier's row of the token after
        which its distribution is read (the block re-reads it when the row holds it already)."""
        base = prompt + len(reading.prefix) - 1
        return {**{t: base + reading.count_to(draft.offsets[t]) for t in stable}, END: length - 1}

    # 3. ensemble
    def _decide(self, k: int, draft: Draft, stable: list[int], readings: dict[int, list[Reading]],
                seen: dict[int, list[dict[int, torch.Tensor]]]) -> tuple[int, int | None]:
        """(drafter tokens kept, the replacing union entry or None)."""
        for t in stable:
            self.stats.stable += 1
            at = {v: seen[v][k][t] for v in self.verifiers}
            if all(self._agrees(v, at[v], readings[v][k], draft, t) for v in self.verifiers):
                self.stats.unanimous += 1  # Sec. 3.2 (ii)(1)
                continue
            own = {u: self._own_probability(u, at.get(u, draft.seen[t]), readings, k, draft, t)
                   for u in range(len(self.members))}
            if sum(self.weights[u] * p for u, p in own.items()) > AVERAGE_SKIP:
                self.stats.average += 1  # Sec. 3.2 (ii)(2), weighted as App. H
                continue
            gate = self.params.gate_threshold
            if gate is not None and float(draft.seen[t].max().exp()) >= gate:
                self.stats.gated += 1  # GaC's gate ("GaC + SAFE", Sec. 4.1)
                continue
            self.stats.ensembled += 1
            dists = [draft.seen[t][None] if u == self.lead else at[u][None] for u in range(len(self.members))]
            chosen = self._ensemble(dists)
            if not self._is_drafters(chosen, draft, t):
                self.stats.replaced += 1
                return t, chosen
        return len(draft.tokens), None

    def _own_probability(self, u: int, dist: torch.Tensor, readings: dict[int, list[Reading]], k: int,
                         draft: Draft, t: int) -> float:
        """Member ``u``'s probability of its own token of the draft at position ``t`` (at the
        drafter's stop: of any of its stop ids)."""
        member = self.members[u]
        if t == len(draft.tokens):
            return float(dist[sorted(member.stop_ids)].exp().sum())
        if u == self.lead:
            return float(dist[draft.tokens[t]].exp())
        reading = readings[u][k]
        return float(dist[reading.ids[reading.count_to(draft.offsets[t])]].exp())

    def _ensemble(self, dists: list[torch.Tensor]) -> int:
        """The union entry chosen from the members' log-probs [1, V_u] (GaC Eq. 3, then Sec. 3.3)."""
        mixed = self.mixture.full(dists)[0].cpu()
        if float(mixed.max()) >= self.params.sharpen:
            return int(mixed.argmax())
        self.stats.sharpened += 1
        tops = [self.union.maps[u].project(d.float().exp().cpu(), self.union.size)[0].topk(
            min(POOL_TOP, self.union.size)).indices.tolist() for u, d in enumerate(dists)]
        pool = [entry for top in tops for entry in top]
        return sharpened_choice(mixed, self.union.entries, self.stop_entries, self.params.sharpen,
                                tops[self.lead], pool, self.params.candidate_floor)

    def _agrees(self, v: int, dist: torch.Tensor, reading: Reading, draft: Draft, t: int) -> bool:
        """Consensus: the verifier's top token is its own token of the draft at position ``t``."""
        top = int(dist.argmax())
        if t == len(draft.tokens):
            return top in self.members[v].stop_ids
        return top == reading.ids[reading.count_to(draft.offsets[t])]

    def _is_drafters(self, chosen: int, draft: Draft, t: int) -> bool:
        """Whether the ensemble's entry is the drafter's choice at position ``t`` (its token's bytes, or a stop)."""
        if t == len(draft.tokens):
            return chosen in self.stop_entries
        return chosen not in self.stop_entries and self.union.entries[chosen] == self.members[self.lead].vocab.pieces[
            draft.tokens[t]]

    # 4. commit
    def _advance(self, state: SafeState, draft: Draft, outcome: tuple[int, int | None]) -> Advance:
        kept, chosen = outcome
        tokens = draft.tokens[:kept]
        data = self.members[self.lead].vocab.join(tokens)
        self.stats.rounds += 1
        self.stats.drafts_accepted += chosen is None
        stop = (chosen is None and draft.stop) or (chosen is not None and chosen in self.stop_entries)
        self.stats.tokens += len(tokens) + (chosen is not None or draft.stop)
        if stop:
            return Advance(data, tuple(tokens), len(tokens), "stop_id")
        if chosen is None:
            return Advance(data, tuple(tokens), len(tokens))
        own = int(self.union.maps[self.lead].to_member[chosen])
        entry = self.union.entries[chosen]
        return Advance(data + entry, tuple(tokens) + (own,) if own >= 0 else None, len(tokens) + 1)

    def _commit(self, states: list[SafeState], drafts: list[Draft], readings: dict[int, list[Reading]],
                outcomes: list[tuple[int, int | None]], seen: dict[int, list[dict[int, torch.Tensor]]]
                ) -> list[torch.Tensor]:
        """Every member's rows move to the committed text (``_move``); returns one log-prob tensor per member."""
        for k, (state, draft, (kept, chosen)) in enumerate(zip(states, drafts, outcomes)):
            base = state.held[self.lead]
            replaced = self.union.entries[chosen] if chosen is not None and chosen not in self.stop_entries else None
            drafter_ids = base + draft.tokens[:kept]
            if replaced is not None:
                plan = self.appender.plan(drafter_ids, replaced)
                drafter_ids = drafter_ids[:len(drafter_ids) - plan.drop] + list(plan.ids)
            for v in self.tails:
                state.held[v], state.pending[v] = self._verifier_ids(v, readings[v][k], draft, kept, replaced)
            for v in [self.lead, *self.shared]:
                state.held[v] = list(drafter_ids)
        return each(self.members, lambda member, v: self._move(member, v, states, seen), range(len(self.members)))

    def _move(self, member: Member, v: int, states: list[SafeState],
              seen: dict[int, list[dict[int, torch.Tensor]]]) -> torch.Tensor:
        """The drafter moves to its committed ids (its next log-probs); a verifier is only cropped
        back to them (no forward: the next cycle's block reads what it lacks) and gives its read at
        the end of each row's reading (checked by the loop, unused by SAFE)."""
        targets = [state.prompt[v] + state.held[v] for state in states]
        if v == self.lead:
            return move_rows(member, targets)
        held = member.row_ids()
        crop_rows(member, held, [common_prefix(row, target) for row, target in zip(held, targets)])
        return torch.stack([found[END] for found in seen[v]])

    def _verifier_ids(self, v: int, reading: Reading, draft: Draft, kept: int,
                      replaced: bytes | None) -> tuple[list[int], bytes]:
        if replaced is None:
            return list(reading.prefix + reading.ids), reading.pending
        held = list(reading.prefix + reading.ids[:reading.count_to(draft.offsets[kept])])
        plan = self.tails[v].plan(held, b"", replaced)
        return held[:plan.keep] + list(plan.ids), plan.pending

    # --- scoring --------------------------------------------------------------------------------
    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Score]:
        return score_with_members([self.members[self.lead]], requests, self.batch_size)[0]

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        return rolling_with_members([self.members[self.lead]], texts, self.batch_size)[0]
