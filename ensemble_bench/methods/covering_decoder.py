"""The decoding loop shared by the exact methods that step over symbols smaller than the members'
tokens: ``byte_level`` (the 256 bytes) and ``lvr`` (the members' common vocabulary). Each member is
a model over the symbols through its covering tree (vocab/covering.py); the ensemble averages the
members' next-symbol distributions.

Each step, for every live row:
1. each member's next-symbol distribution M_i(. | y) from its live branches (ByteSampler Eq. 2):
   branches j (a symbol boundary where the last token of a cover starts) weighted by the
   probability of their trunks, each summing its next-token probabilities by the symbol that
   follows y[j:] in the token's spelling;
2. the weighted average over the members with a live branch (``live_average``); greedy: its
   argmax symbol, or the end of the text; a request that samples draws it from the average
   (decoding/sampling.py);
3. every member takes the symbol's bytes: its branches narrow to the tokens that extend y[j:] s,
   and it re-tokenises the text canonically (vocab/retokenize.py: crop + append on its KV cache,
   one forward that also scores the new tokens), which opens the branch at the new end when the
   method's ``opens`` accepts it. Half a UTF-8 character waits (no branch opens inside a
   character). After whitespace the new branch is split by the first byte of its tokens, each
   part on the trunk the tokenizer gives that continuation (vocab/lookahead.py): a part whose
   trunk is not the held one is read by one more crop and scored extend, then the row is restored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import torch

from ensemble_bench.decoding.concurrent import each
from ensemble_bench.decoding.decode import STOP, Advance, DecodingMethod, RequestState, Round
from ensemble_bench.decoding.feeding import canonical_tail
from ensemble_bench.decoding.method import GenerationRequest, normalised_weights, resolve_member
from ensemble_bench.decoding.sampling import decide_on
from ensemble_bench.decoding.stats import peak
from ensemble_bench.decoding.teacher_forced import Forced
from ensemble_bench.members.base import Member
from ensemble_bench.methods.byte_level_params import CoveringSpec
from ensemble_bench.vocab.append import common_prefix
from ensemble_bench.vocab.covering import Branch, SortedVocab, mixture_by_row, next_byte_masses, open_branches
from ensemble_bench.vocab.lookahead import lookahead
from ensemble_bench.vocab.retokenize import Plan


@dataclass
class Tree:
    """One member's covering tree for one row, and what its KV cache holds."""

    held: list[int] = field(default_factory=list)   # canonical ids of the generated text (past ``pending``)
    pending: bytes = b""                             # half a UTF-8 character, not yet given
    cum: list[float] = field(default_factory=lambda: [0.0])  # cum[i] = log P(held[:i] | prompt)
    branches: list[Branch] = field(default_factory=list)
    plan: Plan | None = None                         # the re-tokenisation of the chosen symbol, for ``feed``


@dataclass
class CoverState(RequestState):
    prompt: list[list[int]] = field(default_factory=list)  # each member's prompt ids
    trees: list[Tree] = field(default_factory=list)
    symbols: list[int] = field(default_factory=list)       # the symbols taken so far
    budget_tokens: int = 0  # the lead member's most canonical tokens so far
    read_first: bytes = b""  # the prompt's bytes, read through the loop before generating (byte_level official)

    def spelled(self) -> bytes:
        """The bytes of the covered text so far: the prompt's bytes read so far, then the generated ones."""
        return self.read_first[:len(self.symbols)] + bytes(self.data)


@dataclass
class ScoringState(CoverState):
    """A continuation being scored symbol by symbol: its symbols, the log-probability and greedy flag so far."""

    forced: Sequence[int] = ()
    total: float = 0.0
    greedy: bool = True


@dataclass
class TreeStats:
    steps: int = 0
    branches: int = 0      # live branches summed over steps and members
    widest: int = peak()   # most live branches of one member at one step
    tokens: int = 0        # tokens under the live branches, summed

    def add(self, trees: Sequence[Tree]) -> None:
        self.steps += 1
        for tree in trees:
            self.branches += len(tree.branches)
            self.widest = max(self.widest, len(tree.branches))
            self.tokens += sum(b.width for b in tree.branches)

    def add_walks(self, walks: Sequence, steps: int) -> None:
        """Every step of a scored batch read as trees (vocab/byte_tree.ForcedBranches)."""
        self.steps += steps
        for walk in walks:
            counts = [0] * steps
            for group, lo, hi in zip(walk.group, walk.lo, walk.hi):
                counts[group] += 1
                self.tokens += hi - lo
            self.branches += sum(counts)
            self.widest = max(self.widest, *counts)

    def add_rows(self, states: Sequence[CoverState]) -> None:
        for state in states:
            self.add(state.trees)

    def summary(self, members: int, unit: str) -> dict:
        per = self.steps * members
        return {f"{unit}_steps": self.steps,
                "covering_tree_branches_mean": self.branches / per if per else None,
                "covering_tree_branches_max": self.widest,
                "covering_tree_tokens_mean": self.tokens / per if per else None}


class CoveringDecoder(CoveringSpec, DecodingMethod):
    """The loop over symbols; a subclass spells its members' tokens in symbols (``member_vocabs``),
    gives each symbol's first byte (``first_bytes``) and says how a symbol is spelled."""

    first_bytes: Sequence[int]

    def __init__(self, members: Sequence[Member], params, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        self.lead = resolve_member(params.lead, [m.name for m in members], params.lead_spelling)
        self.weights = normalised_weights(params.weights or [1.0] * len(members), len(members))
        self.tails = [canonical_tail(m) for m in members]
        self.stops = [sorted(m.stop_ids) for m in members]
        self.stats = TreeStats()
        self.vocabs: list[SortedVocab] = self.member_vocabs()

    def member_vocabs(self) -> list[SortedVocab]:
        raise NotImplementedError

    def symbol_bytes(self, symbol: int) -> bytes:
        raise NotImplementedError

    def spelling(self, symbols: Sequence[int]):
        """The spelling type of ``vocabs`` (bytes or a tuple) of a run of symbols."""
        raise NotImplementedError

    def opens(self, i: int, trunk: Sequence[int], state: CoverState) -> bool:
        """Whether member i's ids ``trunk`` of the whole text are a cover's trunk (default: always)."""
        return True

    @property
    def end(self) -> int:
        return self.vocabs[0].end

    # --- the loop's steps ------------------------------------------------------------------------
    def start(self, request: GenerationRequest) -> CoverState:
        return CoverState.of(request)

    def choose(self, dists: list[torch.Tensor], states: list[CoverState]) -> Round:
        """Steps 1-2 for every live row, and each member's re-tokenisation of the chosen symbol."""
        if not states[0].trees:
            self.begin(dists, states)
        self.stats.add_rows(states)
        mixed, alive = self.mixed_rows(states)
        chosen = self.symbols(mixed, alive, states)
        return Round([self.read_prompt(state) if len(state.symbols) < len(state.read_first)
                      else NO_CONTINUATION if not live else STOP if symbol == self.end else self.plan(state, symbol)
                      for state, symbol, live in zip(states, chosen, alive.tolist())], dists, by_span=True)

    def symbols(self, mixed: torch.Tensor, alive: torch.Tensor, states: list[CoverState]) -> list[int]:
        """Each row's symbol: q's argmax (step 2), or a draw from q for a row that samples, is live and
        no longer reads the prompt."""
        live = alive.tolist()
        samplers = [state.sampler if live[k] and len(state.symbols) >= len(state.read_first) else None
                    for k, state in enumerate(states)]
        return decide_on(mixed, samplers, lambda kept: kept.argmax(dim=1).tolist(), probabilities=True)

    def read_prompt(self, state: CoverState) -> Advance:
        """The prompt's next byte taken as the symbol (``read_first``): every member re-tokenises it as
        a generated byte, but it is no text and counts no token (the budget counts from the prompt's end)."""
        self.plan(state, state.read_first[len(state.symbols)])
        return READING

    def begin(self, dists: list[torch.Tensor], states: list[CoverState]) -> None:
        """Every row's root branch in every member (depth 0 after its prompt, P = 1)."""
        prompts = [m.row_ids() for m in self.members]
        for k, state in enumerate(states):
            state.prompt = [rows[k] for rows in prompts]
            state.trees = [Tree() for _ in self.members]
        for i in range(len(self.members)):
            roots = open_branches(self.vocabs[i], [0.0] * len(states), dists[i], self.stops[i])
            for state, root in zip(states, roots):
                state.trees[i].branches = [root]

    def member_distributions(self, i: int, states: Sequence[CoverState]) -> torch.Tensor:
        """[rows, end + 1] member i's M_i(. | y) of every row (step 1): its live branches of all
        rows in one scatter-add and one weighted sum."""
        branches = [b for state in states for b in state.trees[i].branches]
        rows = torch.tensor([k for k, state in enumerate(states) for _ in state.trees[i].branches], dtype=torch.long)
        logps = torch.tensor([b.logp for b in branches], dtype=torch.float64)
        return mixture_by_row(next_byte_masses(self.vocabs[i], branches), logps, rows, len(states)).cpu()

    def mixed_rows(self, states: Sequence[CoverState]) -> tuple[torch.Tensor, torch.Tensor]:
        """The weighted average of the members' next-symbol distributions (step 2) and whether a member is live."""
        return self.combine([self.member_distributions(i, states) for i in range(len(self.members))])

    def combine(self, dists: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 2 on the members' [rows, symbols + 1] distributions: q and whether a row has a live member
        (``live_average``; f_ensemble combines by its operator)."""
        return live_average(dists, self.weights)

    def plan(self, state: CoverState, symbol: int) -> Advance:
        """Each member's re-tokenisation of ``symbol`` (for ``feed``), and the advance that takes it."""
        data = self.symbol_bytes(symbol)
        state.symbols.append(symbol)
        for tail, tree in zip(self.tails, state.trees):
            tree.plan = tail.plan(tree.held, tree.pending, data)
        plan = state.trees[self.lead].plan
        tokens = max(0, plan.keep + len(plan.ids) - state.budget_tokens)
        state.budget_tokens += tokens
        return Advance(data, None, tokens)

    def forced_step(self, dists: list[torch.Tensor], states: list[ScoringState]) -> list[Forced]:
        """Each row's next continuation symbol: log q of it (``forced_logprobs``), whether it is q's argmax,
        and its re-tokenisation by every member, one symbol of the budget (``TeacherForced``)."""
        if not states[0].trees:
            self.begin(dists, states)
        self.stats.add_rows(states)
        mixed, alive = self.mixed_rows(states)
        forced = torch.tensor([state.forced[state.count] for state in states], dtype=torch.long)
        greedy = ((mixed.argmax(dim=1) == forced) & alive).tolist()
        return [Forced(logp, top, Advance(self.plan(state, symbol).data, None, 1))
                for state, symbol, logp, top in zip(states, forced.tolist(), forced_logprobs(mixed, alive, forced),
                                                   greedy)]

    def feed(self, dists, states: list[CoverState], advances) -> list[torch.Tensor]:
        """Step 3: every member takes the chosen symbol (one crop and one scored extend for all rows)."""
        return each(self.members, lambda member, i: self._take(i, member, states, dists[i]), range(len(self.members)))

    def _take(self, i: int, member: Member, states: list[CoverState], dist: torch.Tensor) -> torch.Tensor:
        lengths, feeds = self._grow(i, states)
        if not any(feeds):
            return dist
        member.crop(lengths)
        dist, scored = member.extend_scored(feeds)
        opening = [k for k, state in enumerate(states) if feeds[k] and self._advance_tree(state.trees[i], scored[k])
                   and self.opens(i, state.trees[i].held, state)]
        if opening:  # the branch at the new end of every row that has one, opened together
            index = torch.tensor(opening, dtype=torch.long, device=dist.device)
            opened = open_branches(self.vocabs[i], [states[k].trees[i].cum[-1] for k in opening],
                                   dist.index_select(0, index), self.stops[i])
            for k, branch in zip(opening, opened):
                states[k].trees[i].branches.append(branch)
            dist = self._look_ahead(i, member, states, opening, dist)
        return dist

    def _grow(self, i: int, states: Sequence[CoverState]) -> tuple[list[int], list[list[int]]]:
        """Member i's branches of every row narrowed by the taken symbol; each row's crop length and
        feed (empty: nothing moved, the bytes wait in ``pending``)."""
        lengths, feeds = [], []
        for state in states:
            tree = state.trees[i]
            tree.branches = [grown for b in tree.branches
                             if (grown := b.grow(self.vocabs[i], self.spelling(state.symbols[-b.depth - 1:])))]
            plan, whole = tree.plan, state.prompt[i] + tree.held
            moved = bool(plan.ids) or plan.keep < len(tree.held)
            tree.pending = plan.pending
            cut = len(state.prompt[i]) + plan.keep - 1  # one token before the change, re-read to score the first new id
            lengths.append(cut if moved else len(whole))
            feeds.append([whole[cut], *plan.ids] if moved else [])
        return lengths, feeds

    @staticmethod
    def _advance_tree(tree: Tree, scored: list[float]) -> bool:
        """The row holds the plan's ids (and their log-probabilities); True when no bytes are pending."""
        plan = tree.plan
        tree.held = tree.held[:plan.keep] + list(plan.ids)
        tree.cum = tree.cum[:plan.keep + 1] + list(accumulate(scored, initial=tree.cum[plan.keep]))[1:]
        return not plan.pending

    # --- the trunk after whitespace (vocab/lookahead.py) ----------------------------------------------
    def _look_ahead(self, i: int, member: Member, states: list[CoverState], opening: list[int],
                    dist: torch.Tensor) -> torch.Tensor:
        """Split the branches just opened after whitespace by their tokens' first byte; read every
        other trunk (one crop and scored extend per alternative), then restore the held rows."""
        splits = {k: lookahead(self.tails[i], states[k].trees[i].held, states[k].spelled()) for k in opening}
        splits = {k: s for k, s in splits.items() if len(s.keep) < 256}
        for k, split in splits.items():
            tree = states[k].trees[i]
            tree.branches[-1] = self._restricted(tree.branches[-1], split.keep, keeps_end=True)
        rounds = max((len(s.others) for s in splits.values()), default=0)
        holding = {k: tuple(states[k].trees[i].held) for k in splits}  # what each row's cache holds
        for slot in range(rounds):
            chosen = {k: s.others[slot] for k, s in splits.items()
                      if len(s.others) > slot and self.opens(i, s.others[slot][1], states[k])}
            alt, scored = self._read_trunks(member, states, i, {k: trunk for k, (_, trunk) in chosen.items()}, holding)
            for k, (first_bytes, trunk) in chosen.items():
                tree = states[k].trees[i]
                shared = common_prefix(tree.held, trunk)
                logp = tree.cum[shared] + sum(scored[k][len(scored[k]) - len(trunk) + shared:])
                branch = open_branches(self.vocabs[i], [logp], alt[k:k + 1], self.stops[i])[0]
                tree.branches.append(self._restricted(branch, first_bytes, keeps_end=False))
        if rounds:
            moved = {k: tuple(states[k].trees[i].held) for k, s in splits.items() if s.others}
            dist, _ = self._read_trunks(member, states, i, moved, holding)
        return dist

    @staticmethod
    def _read_trunks(member: Member, states: list[CoverState], i: int, trunks: dict[int, tuple[int, ...]],
                     holding: dict[int, tuple[int, ...]]) -> tuple[torch.Tensor, list[list[float]]]:
        """Rows k of ``trunks`` come to hold that trunk after their prompt (``holding``: what they
        hold now, updated) in one crop and one scored extend; the scores are of the ids after the
        re-read one (the last ``len(trunk) - shared`` are the trunk's own)."""
        lengths, feeds = [], []
        for k, state in enumerate(states):
            now = holding.get(k, tuple(state.trees[i].held))
            if k not in trunks:
                lengths.append(len(state.prompt[i]) + len(now))
                feeds.append([])
                continue
            whole = state.prompt[i] + list(trunks[k])
            cut = len(state.prompt[i]) + common_prefix(now, trunks[k]) - 1
            lengths.append(cut)
            feeds.append(whole[cut:])
            holding[k] = trunks[k]
        member.crop(lengths)
        return member.extend_scored(feeds)

    def _restricted(self, branch: Branch, first_bytes: frozenset[int], keeps_end: bool) -> Branch:
        """The branch keeping only the tokens whose first symbol starts with one of ``first_bytes``."""
        allowed, mask = self._mask(first_bytes)
        mask = mask.to(device=branch.mass.device, dtype=branch.mass.dtype)
        if keeps_end:
            mask[self.end] = 1.0
        return Branch(branch.logp, branch.probs, branch.lo, branch.hi, 0, 0.0, branch.mass * mask, allowed)

    def _mask(self, first_bytes: frozenset[int]) -> tuple[frozenset[int], torch.Tensor]:
        """The symbols whose first byte is one of ``first_bytes``, as a set and a [end + 1] 0/1 mask (cached)."""
        masks = self.__dict__.setdefault("_masks", {})
        if first_bytes not in masks:
            allowed = frozenset(s for s, b in enumerate(self.first_bytes) if b in first_bytes)
            mask = torch.zeros(self.end + 1)
            mask[sorted(allowed)] = 1.0
            masks[first_bytes] = allowed, mask
        allowed, mask = masks[first_bytes]
        return allowed, mask.clone()


NO_CONTINUATION = Advance(finish="no_continuation")  # no member has a live branch: nothing can follow
READING = Advance()  # a prompt byte read through the loop: no text, no token


def live_average(dists: list[torch.Tensor], weights: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, symbols + 1] q = sum_i w_i M_i(. | y) over the members with a live branch, renormalised
    by their weights (a member's row without mass gives y probability zero), and [rows] whether any
    member is live (else q's row is all zero). Rows where every member is live are the plain sum."""
    live = torch.stack([dist.sum(dim=1) > 0 for dist in dists])
    mixed = sum(w * torch.where(alive[:, None], dist, 0.0) for w, dist, alive in zip(weights, dists, live))
    share = (torch.tensor(weights, dtype=mixed.dtype)[:, None] * live).sum(dim=0)
    partial = ~live.all(dim=0) & (share > 0)
    if bool(partial.any()):
        mixed[partial] /= share[partial, None]
    return mixed, share > 0


def forced_logprobs(mixed: torch.Tensor, alive: torch.Tensor, forced: torch.Tensor) -> list[float]:
    """log q of each row's forced symbol: -inf where no member is live; a symbol the live members give
    zero mass (a byte token inside a character, where no branch opens) counts as 1e-300."""
    chance = mixed.gather(1, forced[:, None])[:, 0].tolist()
    return [math.log(p or 1e-300) if live else -math.inf for p, live in zip(chance, alive.tolist())]

