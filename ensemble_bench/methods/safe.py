"""SAFE — "When to Ensemble: Identifying Token-Level Points for Stable and Fast LLM Ensembling"
(Yun, Ki, Lee, Yang; arXiv 2510.15346). Generate - verify - ensemble, one cycle per round:

1. generate: the drafter decodes up to ``draft_tokens`` tokens greedily (Sec. 4, "drafter");
2. verify: every verifier re-tokenises the committed text + the draft with its own tokenizer
   (canonically: vocab/retokenize.py). A draft position (the start of a drafter token) is
   *stable* when it is a token boundary in every verifier's re-tokenisation, so that no verifier
   reads an OOV-like split word there (the paper's tokenisation-mismatch factor). At a stable
   position the verifiers *agree* when each one's most probable next token is its own token of
   the draft from there (the consensus factor). Ensembling happens only at stable positions
   where some verifier disagrees;
3. ensemble: the members' distributions at that position are averaged over the union vocabulary,
   keyed by bytes (GaC Eq. 3, vocab/mixture.py). When the average is overly smooth (its top
   probability below ``sharpen``) it is sharpened: probability spread over sub-word tokens of one
   word is consolidated, each candidate taking the mass of the candidates that are byte prefixes
   of it (" So" and " Sofia" -> " Sofia"), among the ``SHARPEN_TOP`` most probable entries. If the
   chosen entry is the drafter's token the draft goes on; otherwise it replaces the token and the
   rest of the draft is discarded (as in speculative decoding).

A verifier whose vocabulary is the drafter's reads the drafter's own ids (there is nothing to
re-tokenise: every position is stable for it), so a member ensembled with itself never disagrees
and equals the member alone. Every member's KV cache stays warm; each round moves every row of a
member to its new ids with one crop and one extend (``move_rows``). The Member interface returns
the next-token distribution after the last appended token only, so a verifier reads the draft in
one extend per stable position (not the whole draft in one forward as the paper's verifier does).

Log-likelihood (multiple choice): the drafter's own score; SAFE ensembles only while generating.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from pydantic import Field

from ensemble_bench.cache import cache_dir
from ensemble_bench.members.base import Member, Score
from ensemble_bench.methods.base import (GenerationRequest, LoglikelihoodRequest, MethodParams, normalised_weights,
                                         resolve_member, rolling_with_members, score_with_members)
from ensemble_bench.methods.concurrent import each
from ensemble_bench.methods.decode import Advance, DecodingMethod, RequestState, Round
from ensemble_bench.methods.feeding import text_appender
from ensemble_bench.union_cache import cached_union
from ensemble_bench.vocab.append import common_prefix
from ensemble_bench.vocab.mixture import UnionMixture
from ensemble_bench.vocab.retokenize import CanonicalTail, continuation_encoder

SHARPEN_TOP = 16  # union entries considered by the sharpening step


class SafeParams(MethodParams):
    drafter: int | str = 0                                  # member index or name
    draft_tokens: int = Field(default=5, ge=1, le=64)       # tokens drafted per cycle
    sharpen: float = Field(default=0.5, ge=0.0, le=1.0)     # sharpen when the ensemble's top probability < this (0: never)
    weights: list[float] | None = None                      # per-member weights of the average (None: equal)
    window: int = Field(default=4, ge=0, le=64)             # look-behind tokens when the drafter takes a replaced token


@dataclass
class SafeState(RequestState):
    """A request under SAFE: the writer's ids are the drafter's (while every chosen piece is one of its tokens)."""

    prompt: list[list[int]] = field(default_factory=list)      # each member's prompt ids in its row
    held: dict[int, list[int]] = field(default_factory=dict)   # member -> generated ids it holds
    pending: dict[int, bytes] = field(default_factory=dict)    # canonical verifier -> bytes of half a character


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    seen: list[torch.Tensor] = field(default_factory=list)  # the drafter's log-probs before each token (and the stop)
    stop: bool = False                                      # the drafter chose a stop id after ``tokens``
    offsets: list[int] = field(default_factory=lambda: [0])  # byte offset of each token's start, then the end


@dataclass(frozen=True)
class Reading:
    """One verifier's ids of committed text + draft: ``prefix`` (generated ids kept), then ``ids``
    whose ends fall at ``ends`` (byte offsets from the draft's start; the prefix ends at ``start``)."""

    prefix: tuple[int, ...]
    ids: tuple[int, ...]
    ends: tuple[int, ...]
    start: int
    pending: bytes = b""

    def count_to(self, offset: int) -> int | None:
        """How many of ``ids`` end exactly at ``offset`` (None: ``offset`` is inside a token)."""
        if offset == self.start:
            return 0
        return self.ends.index(offset) + 1 if offset in self.ends else None

    def starts_token(self, offset: int) -> bool:
        count = self.count_to(offset)
        return count is not None and count < len(self.ids)


@dataclass
class SafeStats:
    rounds: int = 0
    drafts_accepted: int = 0  # rounds whose whole draft was kept
    tokens: int = 0           # tokens committed (drafter tokens, replaced tokens, stops)
    stable: int = 0           # positions checked for consensus
    ensembled: int = 0        # positions ensembled
    replaced: int = 0         # ensembled positions whose choice was not the drafter's token

    def summary(self) -> dict:
        return {"safe_rounds": self.rounds, "drafts_accepted": self.drafts_accepted,
                "draft_acceptance_rate": self.drafts_accepted / self.rounds if self.rounds else None,
                "tokens_committed": self.tokens, "stable_positions": self.stable,
                "tokens_ensembled": self.ensembled, "tokens_replaced": self.replaced,
                "ensembled_fraction": self.ensembled / self.tokens if self.tokens else None}


def move_rows(member: Member, targets: Sequence[Sequence[int]]) -> torch.Tensor:
    """Bring each row of ``member`` to hold exactly ``targets[r]`` (whole rows, prompt included)
    with one crop and one extend; returns the next-token log-probs of every row. A row that must
    shrink to a prefix of what it holds re-reads its last token (a crop needs tokens after it)."""
    held = member.row_ids()
    keep = []
    for row, target in zip(held, targets):
        same = common_prefix(row, target)
        keep.append(same - 1 if same == len(target) < len(row) else same)
    if any(k < len(row) for k, row in zip(keep, held)):
        member.crop(keep)
    return member.extend([list(target[k:]) for k, target in zip(keep, targets)])


def sharpened_choice(mixed: torch.Tensor, entries: Sequence[bytes], stops: frozenset[int], sharpen: float) -> int:
    """The ensemble's union entry: argmax of the average (lowest index on ties), or, when its top
    probability is below ``sharpen``, of the consolidated scores (each of the top entries plus the
    top entries that are byte prefixes of it; stop entries stand alone)."""
    if float(mixed.max()) >= sharpen:
        return int(mixed.argmax())
    values, indices = mixed.topk(min(SHARPEN_TOP, mixed.shape[0]))
    top = list(zip(indices.tolist(), values.tolist()))
    best, best_score = -1, -1.0
    for index, value in top:
        score = value
        if index not in stops:
            score += sum(v for j, v in top if j != index and j not in stops and entries[j]
                         and entries[index].startswith(entries[j]))
        if score > best_score or (score == best_score and index < best):
            best, best_score = index, score
    return best


class Safe(DecodingMethod):
    name = "safe"
    Params = SafeParams
    min_members = 2

    def __init__(self, members: Sequence[Member], params: SafeParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        self.drafter = resolve_member(params.drafter, [m.name for m in members], "drafter")
        weights = normalised_weights(params.weights or [1.0] * len(members), len(members))
        self.union = cached_union([m.vocab for m in members], [sorted(m.stop_ids) for m in members],
                                  cache_dir() / "union")
        self.mixture = UnionMixture(self.union, weights, [m.vocab.size for m in members])
        self.stop_entries = frozenset(self.union.stop_mask.nonzero().flatten().tolist())
        self.verifiers = [v for v in range(len(members)) if v != self.drafter]
        draft_vocab = members[self.drafter].vocab
        self.shared = {v for v in self.verifiers if members[v].vocab == draft_vocab}  # read the drafter's ids
        self.tails = {v: CanonicalTail.from_view(members[v].vocab, continuation_encoder(
            lambda text, m=members[v]: m.encode(text, add_special_tokens=False)))
            for v in self.verifiers if v not in self.shared}
        self.appender = text_appender(members[self.drafter], params.window, self.union.maps[self.drafter].by_bytes)
        self.stats = SafeStats()

    @classmethod
    def check_members(cls, params: SafeParams, labels: Sequence[str]) -> None:
        resolve_member(params.drafter, labels, "drafter")
        if params.weights is not None:
            normalised_weights(params.weights, len(labels))

    @property
    def writer(self) -> int:
        return self.drafter

    def info(self) -> dict:
        return {**super().info(), "drafter_index": self.drafter, "union_size": self.union.size,
                "verifiers_sharing_the_drafter_vocabulary": sorted(self.shared), **self.stats.summary()}

    # --- generation: the loop's steps -------------------------------------------------------------
    def start(self, request: GenerationRequest) -> SafeState:
        return SafeState.of(request)

    def choose(self, dists: list[torch.Tensor], states: list[SafeState]) -> Round:
        """One generate-verify-ensemble cycle for every live row."""
        if not states[0].prompt:
            self._begin(states)
        drafts = self._draft(dists[self.drafter], states)
        readings = {v: [self._reading(v, s, d) for s, d in zip(states, drafts)] for v in self.verifiers}
        positions = [self._stable(d, [readings[v][k] for v in self.verifiers]) for k, d in enumerate(drafts)]
        seen = dict(zip(self.verifiers, each([self.members[v] for v in self.verifiers], lambda _, v: self._verify(
            v, states, readings[v], drafts, positions), self.verifiers)))
        outcomes = [self._decide(k, draft, positions[k], readings, seen) for k, draft in enumerate(drafts)]
        advances = [self._advance(state, draft, outcome) for state, draft, outcome in zip(states, drafts, outcomes)]
        dists = self._commit(states, drafts, readings, outcomes)
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
        drafter = self.members[self.drafter]
        drafts = [Draft() for _ in states]
        open_rows = [True] * len(states)
        while any(open_rows):
            picks = dist.argmax(dim=-1).tolist()
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
        if len(draft.tokens) >= self.params.draft_tokens or state.count + len(draft.tokens) >= state.rule.max_new_tokens:
            return True
        text = (bytes(state.data) + self.members[self.drafter].vocab.join(draft.tokens)).decode("utf-8", "replace")
        return any(u and u in text for u in state.rule.until)

    # 2. verify
    def _reading(self, v: int, state: SafeState, draft: Draft) -> Reading:
        """Verifier ``v``'s ids of the committed text + the draft (re-tokenised canonically)."""
        if v in self.shared:
            return Reading(tuple(state.held[self.drafter]), tuple(draft.tokens), tuple(draft.offsets[1:]), 0)
        pieces = self.members[v].vocab.pieces
        held = state.held[v]
        data = self.members[self.drafter].vocab.join(draft.tokens)
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
        """Verifier ``v`` reads each row up to each stable position in turn, then to the end of its
        reading; returns per row its log-probs at each stable position."""
        plans = []
        for reading, draft, stable in zip(readings, drafts, positions):
            plans.append([(t, reading.prefix + reading.ids[:reading.count_to(draft.offsets[t])]) for t in stable]
                         + [(None, reading.prefix + reading.ids)])
        found: list[dict[int, torch.Tensor]] = [{} for _ in states]
        for step in range(max(len(p) for p in plans)):
            targets = [state.prompt[v] + list(p[min(step, len(p) - 1)][1]) for state, p in zip(states, plans)]
            dist = move_rows(self.members[v], targets)
            for k, p in enumerate(plans):
                if step < len(p) and p[step][0] is not None:
                    found[k][p[step][0]] = dist[k]
        return found

    # 3. ensemble
    def _decide(self, k: int, draft: Draft, stable: list[int], readings: dict[int, list[Reading]],
                seen: dict[int, list[dict[int, torch.Tensor]]]) -> tuple[int, int | None]:
        """(drafter tokens kept, the replacing union entry or None)."""
        for t in stable:
            self.stats.stable += 1
            at = {v: seen[v][k][t] for v in self.verifiers}
            if all(self._agrees(v, at[v], readings[v][k], draft, t) for v in self.verifiers):
                continue
            self.stats.ensembled += 1
            dists = [draft.seen[t][None] if u == self.drafter else at[u][None] for u in range(len(self.members))]
            mixed = self.mixture.full(dists)[0]  # Eq. 3 over the union vocabulary
            chosen = sharpened_choice(mixed.cpu(), self.union.entries, self.stop_entries, self.params.sharpen)
            if not self._is_drafters(chosen, draft, t):
                self.stats.replaced += 1
                return t, chosen
        return len(draft.tokens), None

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
        return chosen not in self.stop_entries and self.union.entries[chosen] == self.members[self.drafter].vocab.pieces[
            draft.tokens[t]]

    # 4. commit
    def _advance(self, state: SafeState, draft: Draft, outcome: tuple[int, int | None]) -> Advance:
        kept, chosen = outcome
        tokens = draft.tokens[:kept]
        data = self.members[self.drafter].vocab.join(tokens)
        self.stats.rounds += 1
        self.stats.drafts_accepted += chosen is None
        stop = (chosen is None and draft.stop) or (chosen is not None and chosen in self.stop_entries)
        self.stats.tokens += len(tokens) + (chosen is not None or draft.stop)
        if stop:
            return Advance(data, tuple(tokens), len(tokens), "stop_id")
        if chosen is None:
            return Advance(data, tuple(tokens), len(tokens))
        own = int(self.union.maps[self.drafter].to_member[chosen])
        entry = self.union.entries[chosen]
        return Advance(data + entry, tuple(tokens) + (own,) if own >= 0 else None, len(tokens) + 1)

    def _commit(self, states: list[SafeState], drafts: list[Draft], readings: dict[int, list[Reading]],
                outcomes: list[tuple[int, int | None]]) -> list[torch.Tensor]:
        """Every member's rows move to the committed text; returns their next log-probs."""
        for k, (state, draft, (kept, chosen)) in enumerate(zip(states, drafts, outcomes)):
            base = state.held[self.drafter]
            replaced = self.union.entries[chosen] if chosen is not None and chosen not in self.stop_entries else None
            drafter_ids = base + draft.tokens[:kept]
            if replaced is not None:
                plan = self.appender.plan(drafter_ids, replaced)
                drafter_ids = drafter_ids[:len(drafter_ids) - plan.drop] + list(plan.ids)
            for v in self.tails:
                state.held[v], state.pending[v] = self._verifier_ids(v, readings[v][k], draft, kept, replaced)
            for v in [self.drafter, *self.shared]:
                state.held[v] = list(drafter_ids)
        return each(self.members, lambda member, v: move_rows(member, [state.prompt[v] + state.held[v]
                                                                      for state in states]), range(len(self.members)))

    def _verifier_ids(self, v: int, reading: Reading, draft: Draft, kept: int,
                      replaced: bytes | None) -> tuple[list[int], bytes]:
        if replaced is None:
            return list(reading.prefix + reading.ids), reading.pending
        held = list(reading.prefix + reading.ids[:reading.count_to(draft.offsets[kept])])
        plan = self.tails[v].plan(held, b"", replaced)
        return held[:plan.keep] + list(plan.ids), plan.pending

    # --- scoring --------------------------------------------------------------------------------
    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Score]:
        return score_with_members([self.members[self.drafter]], requests, self.batch_size)[0]

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        return rolling_with_members([self.members[self.drafter]], texts, self.batch_size)[0]
