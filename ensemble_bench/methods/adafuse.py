"""AdaFuse — "AdaFuse: Adaptive Ensemble Decoding with Test-Time Scaling for LLMs" (arXiv 2601.06022).

A span-level ensemble whose spans are whole words and whose length adapts (methods/span_level.py
runs the rounds). Each round, from the committed prefix, each member reads the top-1 margin
Delta = p(1) - p(2) of its next-token distribution at the first token of each word (the
uncertainty test) and, as the paper's Figure 1 draws it:
- while confident (Delta >= ``theta_delta``) it commits the greedy word and goes on to the next,
  up to ``max_words`` words (Sec. 3.2, adaptive expansion): a confident state commits a longer span;
- at the first uncertain word it explores: its ``beam_size`` most likely first tokens for that word,
  each completed greedily, give ``beam_size`` candidate spans sharing the confident words before it,
  and the span ends with that word (Sec. 3.3, diversity-aware scaling).
The candidates of all members (their union) are scored by every member by mean negative
log-likelihood per token (own tokenisation); the lowest mean over members wins and every member
appends it (Sec. 3.4). A round where all members propose the same single span commits it unscored.

``commit_rule: code`` follows the authors' script (AdaFuse_two_models.py) instead: an uncertain
first word is explored as above, an uncertain second word is taken greedily without exploring, and
a span confident at its first two words explores its last word (word ``max_words``) whatever its
margin. Words are the boundaries common to all members' tokenizers (vocab/words.py), as SweetSpan's;
``word_unit: whitespace`` keeps only those where whitespace begins, the script's whitespace words
(punctuation stays on its word: "plants," is one word, not " plants" then ",").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from threading import Lock
from typing import Literal

import torch
from pydantic import Field

from ensemble_bench.members.base import Member
from ensemble_bench.methods.span_level import (
    SPAN_CHOICES,
    Branch,
    Proposal,
    SpanMethod,
    SpanParams,
    SpanReport,
    SpanState,
    SpanStats,
    text_of,
)


class AdaFuseParams(SpanParams):
    theta_delta: float = Field(default=0.7, ge=0.0, le=1.0, description=(
        "theta_Delta: a word's first token is confident when its top-1 margin p(1) - p(2) is at least this"))
    max_words: int = Field(default=3, ge=1, le=64, description=(
        "M: the most words a confident member commits in one round"))
    beam_size: int = Field(default=3, ge=1, le=32, description=(
        "B: candidate words an uncertain member explores (its B most likely first tokens, each completed "
        "greedily); 1: no exploration"))
    commit_rule: Literal["paper", "code"] = Field(default="paper", description=(
        "paper: the first uncertain word ends the span and is explored (Figure 1); code: the authors' script, "
        "which explores an uncertain first word, takes an uncertain second word greedily, and explores word M "
        "of a span confident at its first two words"))
    word_unit: Literal["boundaries", "whitespace"] = Field(default="boundaries", description=(
        "boundaries: a word ends where every member's tokenizer starts one (punctuation is a word of its own); "
        "whitespace: the authors' script's unit, a word ends where whitespace begins (punctuation stays on its word)"))


def top1_margin(logprobs: torch.Tensor) -> float:
    """Delta = p(1) - p(2) of a next-token distribution given as log-probs (the uncertainty test)."""
    top = logprobs.float().topk(2).values.exp()
    return float(top[0] - top[1])


def mean_nll(logprobs: Sequence[float]) -> float:
    """A member's score of a candidate: -(1/n) sum log p over its tokens (lower wins)."""
    return -sum(logprobs) / len(logprobs) if logprobs else float("inf")


@dataclass
class AdaFuseStats(SpanStats):
    member_states: int = 0     # (member, row, round) states tested by the margin
    uncertain_states: int = 0  # of which explored further candidates
    row_rounds: int = 0
    scored_rounds: int = 0     # row rounds with more than one candidate (the ensemble scored them)


@dataclass(frozen=True)
class AdaFuseReport(SpanReport):
    member_states: int = 0       # (member, row, round) states tested by the margin
    uncertain_states: int = 0    # of those, the ones that explored further candidates
    ensembled_fraction: float | None = None  # rounds the ensemble scored / all rounds


class AdaFuse(SpanMethod):
    name = "adafuse"
    Params = AdaFuseParams
    choice_scoring = SPAN_CHOICES
    inert_on_choices = frozenset(AdaFuseParams.model_fields)
    score_name = "nll"

    def __init__(self, members: Sequence[Member], params: AdaFuseParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        self.stats = AdaFuseStats()
        self.counting = Lock()     # members propose concurrently

    # --- where a span ends and what a member explores --------------------------------------------
    def _common_ends(self, text: str) -> list[int]:
        ends = super()._common_ends(text)
        if self.params.word_unit == "whitespace":
            return [end for end in ends if text[end].isspace() and not text[end - 1].isspace()]
        return ends

    def _confident(self, logprobs: torch.Tensor) -> bool:
        return top1_margin(logprobs) >= self.params.theta_delta

    def _word_starts_at(self, proposer: int, text: str, tokens: list[int]) -> list[tuple[int, int]]:
        """(offset, token index) of each word start after the first that begins one of ``tokens``."""
        vocab = self.members[proposer].vocab
        token_at = {size: t for t, size in enumerate(accumulate(len(vocab.join([i])) for i in tokens), start=1)}
        starts = []
        for end in self._common_ends(text):
            t = token_at.get(len(text[:end].encode("utf-8")))
            if t is not None and t < len(tokens):
                starts.append((end, t))
        return starts

    def _segment_end(self, proposer: int, text: str, tokens: list[int], picked_from: list[torch.Tensor]) -> int | None:
        """After the first uncertain word (Sec. 3.3), or after ``max_words`` confident ones (Sec. 3.2)."""
        if not self._confident(picked_from[0]):
            return self._word_end(text, 1)
        for j, (end, t) in enumerate(self._word_starts_at(proposer, text, tokens), start=1):
            if j == self.params.max_words:
                return end
            if not self._confident(picked_from[t]):  # word j + 1 starts uncertain: it ends the span
                return self._word_end(text, j + 1)
        return None

    def _branches(self, proposer: int, tokens: list[int], picked_from: list[torch.Tensor],
                  proposal: Proposal) -> tuple[Branch, ...]:
        """Diversity-aware scaling: the B-1 next most likely first tokens of the word explored."""
        if self.params.beam_size == 1 or not picked_from:
            return ()
        if not self._confident(picked_from[0]):
            return self._alternatives(tokens, picked_from, 0, 1)
        if proposal.final is not None:
            return ()
        words = self.params.max_words
        starts = self._word_starts_at(proposer, text_of(self.members[proposer], tokens), tokens)[:words - 1]
        if self.params.commit_rule == "code":
            if words < 2 or len(starts) < words - 1 or not all(self._confident(picked_from[t])
                                                                 for _, t in starts[:words - 2]):
                return ()
            return self._alternatives(tokens, picked_from, starts[words - 2][1], words)
        for j, (_, t) in enumerate(starts, start=2):
            if not self._confident(picked_from[t]):
                return self._alternatives(tokens, picked_from, t, j)
        return ()

    def _alternatives(self, tokens: list[int], picked_from: list[torch.Tensor], at: int,
                      words: int) -> tuple[Branch, ...]:
        """Branches that share ``tokens[:at]`` and then take the 2nd..B-th most likely token at ``at``."""
        best = picked_from[at].float().topk(self.params.beam_size).indices.tolist()
        return tuple(Branch(tuple(tokens[:at]) + (token,), words) for token in best[1:])

    def _proposals(self, proposer: int, rows: list[SpanState], dist: torch.Tensor,
                   prefix: list[int]) -> list[list[Proposal]]:
        """The member's greedy span for each row, then, one branch at a time, the words it explores;
        a row's cache holds its last candidate (the others' ``after`` is dropped)."""
        primary = self._propose(proposer, rows, dist, prefix)
        found = [[proposal] for proposal in primary]
        with self.counting:
            self.stats.member_states += len(rows)
            self.stats.uncertain_states += sum(bool(p.branches) for p in primary)
        for b in range(max(len(p.branches) for p in primary)):
            branches = [p.branches[b] if b < len(p.branches) else None for p in primary]
            for k, proposal in enumerate(self._propose(proposer, rows, dist, prefix, branches)):
                if proposal is not None:
                    found[k] = [p if p.after is None else _without_cache(p) for p in found[k]] + [proposal]
        return found

    def choose(self, dists, states):
        before = sum(len(state.rounds) for state in states)
        out = super().choose(dists, states)
        self.stats.row_rounds += len(states)
        self.stats.scored_rounds += sum(len(state.rounds) for state in states) - before
        return out

    def _span_score(self, logprobs: Sequence[float]) -> float:
        return mean_nll(logprobs)

    def statistics(self) -> AdaFuseReport:
        stats = self.stats
        return AdaFuseReport(**vars(super().statistics()), member_states=stats.member_states,
                             uncertain_states=stats.uncertain_states,
                             ensembled_fraction=stats.scored_rounds / stats.row_rounds if stats.row_rounds else None)


def _without_cache(proposal: Proposal) -> Proposal:
    """A proposal whose tokens the member's cache no longer holds."""
    return Proposal(proposal.text, proposal.tokens, proposal.final, proposal.logprobs, None, proposal.branches)
