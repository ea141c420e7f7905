"""CharED — "Character-wise Ensemble Decoding for Large Language Models" (Gu, Tuecke, Katz, Horesh,
Alvarez-Melis and Yurochkin, arXiv 2407.11009; docs/methods_after_seeds.md).

Each step every member gives its next-token distribution p_k once; the next piece of text s is then
grown one character c at a time from each member's marginal distribution of the next character,
conditioned on its next token starting with the characters chosen so far:

    P_k(c | s)   = sum_{t: t starts with s+c} p_k(t) / Z_k(s),   Z_k(s) = sum_{t: t starts with s} p_k(t)
    P_k(end | s) = sum_{t: t == s} p_k(t) / Z_k(s)               (the token ends here: the empty string)
    q(. | s)     = sum_k w_k P_k(. | s) / sum_k w_k              (weighted average; greedy choice)

until "end" wins; s is then given to every member as text (re-tokenised behind a look-behind window,
methods/feeding.py) and the next step begins. At s = "" "end" is a stop token (generation ends). A
member with no token that continues s (Z_k(s) = 0) puts its whole vote on "end": its own token has
to end before s does. Characters here are bytes (identical for ASCII; a multi-byte character is
chosen byte by byte, which byte-level vocabularies need anyway). Sums over "tokens that start with
s" are contiguous ranges of each member's vocabulary sorted by bytes: one cumulative sum per step.

Log-likelihood of a continuation: sum_k w_k p_k(continuation) / sum_k w_k (sequence level, as GaC
scores); the paper scores no continuations.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from pydantic import Field, model_validator

from ensemble_bench.members.base import Member, Score
from ensemble_bench.methods.base import (Generation, GenerationRequest, LoglikelihoodRequest, MethodParams,
                                         normalised_weights, rolling_with_members, score_with_members)
from ensemble_bench.methods.concurrent import each
from ensemble_bench.methods.decode import STOP, Advance, DecodingMethod, RequestState, Round
from ensemble_bench.methods.feeding import give_text, text_appender, text_lookup
from ensemble_bench.methods.packllm import mix

END = -1  # the option "the token ends here" (sorts before every byte: ties end the piece)


class CharEDParams(MethodParams):
    weights: list[float] | None = None          # per member; None: equal (the paper's average)
    window: int = Field(default=4, ge=0, le=64)  # look-behind tokens when re-tokenising new text

    @model_validator(mode="after")
    def _weights(self):
        if self.weights is not None and (any(w < 0 for w in self.weights) or sum(self.weights) <= 0):
            raise ValueError("weights must be >= 0 with a positive sum")
        return self


@dataclass(frozen=True)
class Groups:
    """The tokens that start with one prefix s, as ranges of a vocabulary sorted by bytes."""

    exact_end: int                          # [lo, exact_end): the tokens equal to s
    by_byte: dict[int, tuple[int, int]]     # next byte -> range of the tokens that start with s + byte


class SortedVocab:
    """One member's ordinary tokens sorted by their bytes, and its stop ids."""

    def __init__(self, member: Member):
        ids = sorted(member.vocab.text_ids(), key=lambda i: (member.vocab.pieces[i], i))
        self.ids = torch.tensor([i for i in ids if i not in member.stop_ids], dtype=torch.long)
        self.pieces = [member.vocab.pieces[i] for i in self.ids.tolist()]
        self.stops = torch.tensor(sorted(member.stop_ids), dtype=torch.long)
        self.groups = lru_cache(maxsize=65536)(self._groups)

    def _groups(self, prefix: bytes, lo: int, hi: int) -> Groups:
        depth, exact = len(prefix), lo
        while exact < hi and len(self.pieces[exact]) == depth:
            exact += 1
        by_byte, start = {}, exact
        while start < hi:
            byte = self.pieces[start][depth]
            end = hi if byte == 255 else bisect_left(self.pieces, prefix + bytes([byte + 1]), start, hi)
            by_byte[byte] = (start, end)
            start = end
        return Groups(exact, by_byte)

    def cumulative(self, logprobs: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Per row: running sums of p over the sorted tokens (leading 0), and the stop mass."""
        probs = logprobs.exp().double()
        sums = torch.nn.functional.pad(probs[:, self.ids.to(probs.device)].cumsum(1), (1, 0))
        stops = probs[:, self.stops.to(probs.device)].sum(1) if len(self.stops) else probs.new_zeros(len(probs))
        return sums.cpu().numpy(), stops.cpu().numpy()


@dataclass
class Reader:
    """Where one member stands inside one row's growing piece: its range of tokens starting with s."""

    lo: int
    hi: int

    def votes(self, vocab: SortedVocab, sums: np.ndarray, stop: float, prefix: bytes) -> dict[int, float] | None:
        """P_k(. | s) over END and next bytes; None when the member has no say (Z_k = 0 at s = "")."""
        mass = sums[self.hi] - sums[self.lo] + (stop if not prefix else 0.0)
        if mass <= 0:
            return {END: 1.0} if prefix else None
        groups = vocab.groups(prefix, self.lo, self.hi)
        ended = stop if not prefix else sums[groups.exact_end] - sums[self.lo]
        found = {END: ended / mass}
        for byte, (start, end) in groups.by_byte.items():
            found[byte] = (sums[end] - sums[start]) / mass
        return found

    def narrow(self, vocab: SortedVocab, prefix: bytes, byte: int) -> None:
        """Keep the tokens that start with prefix + byte (an empty range when none does)."""
        if self.hi > self.lo:
            self.lo, self.hi = vocab.groups(prefix, self.lo, self.hi).by_byte.get(byte, (self.lo, self.lo))


def grow_piece(vocabs: Sequence[SortedVocab], sums: Sequence[np.ndarray], stops: Sequence[float],
               weights: Sequence[float]) -> bytes | None:
    """One row's next piece, byte by byte from the weighted marginals; None: a stop wins at s = ""."""
    readers = [Reader(0, len(v.pieces)) for v in vocabs]
    prefix = b""
    while True:
        total: dict[int, float] = {}
        for reader, vocab, row_sums, stop, weight in zip(readers, vocabs, sums, stops, weights):
            votes = reader.votes(vocab, row_sums, stop, prefix)
            for option, p in (votes or {}).items():
                total[option] = total.get(option, 0.0) + weight * p
        best = max(total, key=lambda option: (total[option], -option))
        if best == END:
            return prefix or None
        for reader, vocab in zip(readers, vocabs):
            reader.narrow(vocab, prefix, best)
        prefix += bytes([best])


@dataclass
class CharStats:
    steps: int = 0
    data_bytes: int = 0
    characters: int = 0

    def summary(self) -> dict:
        per = (lambda n: n / self.steps if self.steps else None)
        return {"chared_steps": self.steps, "chared_characters_per_token": per(self.characters),
                "chared_bytes_per_token": per(self.data_bytes)}


class CharED(DecodingMethod):
    name = "chared"
    Params = CharEDParams
    min_members = 1  # one member alone decodes character-wise (the reference a member with itself equals)
    writer = 0

    def __init__(self, members: Sequence[Member], params: CharEDParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        self.weights = normalised_weights(params.weights or [1.0] * len(members), len(members))
        self.vocabs = [SortedVocab(m) for m in members]
        self.appenders = [text_appender(m, params.window) for m in members]
        self.writer_ids = text_lookup(members[self.writer])
        self.stats = CharStats()

    @classmethod
    def check_members(cls, params: CharEDParams, labels: Sequence[str]) -> None:
        if params.weights is not None:
            normalised_weights(params.weights, len(labels))

    def info(self) -> dict:
        return {**super().info(), "weights_resolved": self.weights, **self.stats.summary()}

    # --- generation: the loop's steps -------------------------------------------------------------
    def choose(self, dists: list[torch.Tensor], states: list[RequestState]) -> Round:
        tables = each(self.members, lambda m, vocab, lp: vocab.cumulative(lp), self.vocabs, dists)
        pieces = [grow_piece(self.vocabs, [s[row] for s, _ in tables], [float(t[row]) for _, t in tables],
                             self.weights) for row in range(len(states))]
        return Round([self._advance(piece) for piece in pieces], dists)

    def _advance(self, piece: bytes | None) -> Advance:
        if piece is None:
            return STOP
        token = self.writer_ids.get(piece)
        return Advance(piece, (token,) if token is not None else None, 1)

    def feed(self, dists, states, advances: list[Advance]) -> list[torch.Tensor]:
        return each(self.members, lambda member, appender: give_text(member, appender, [[a.data] for a in advances]),
                    self.appenders)

    def result(self, state: RequestState, request: GenerationRequest) -> Generation:
        self.stats.steps += state.count
        self.stats.data_bytes += len(state.data)
        self.stats.characters += len(bytes(state.data).decode("utf-8", errors="replace"))
        return super().result(state, request)

    # --- scoring --------------------------------------------------------------------------------
    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Score]:
        per_member = score_with_members(self.members, requests, self.batch_size)
        return [Score(mix([s[k].logprob for s in per_member], self.weights), all(s[k].is_greedy for s in per_member))
                for k in range(len(requests))]

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        return [mix(values, self.weights) for values in zip(*rolling_with_members(self.members, texts, self.batch_size))]
