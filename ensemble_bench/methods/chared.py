"""CharED — "Character-wise Ensemble Decoding for Large Language Models" (Gu, Tuecke, Katz, Horesh,
Alvarez-Melis and Yurochkin, arXiv 2407.11009; docs/methods/token_level.md).

Each step every member gives its next-token distribution p_k once; the next piece of text s is then
grown one character c at a time from each member's marginal distribution of the next character,
conditioned on its next token starting with the characters chosen so far:

    P_k(c | s)   = sum_{t: t starts with s+c} p_k(t) / Z_k(s),   Z_k(s) = sum_{t: t starts with s} p_k(t)
    P_k(end | s) = sum_{t: t == s} p_k(t) / Z_k(s)               (the token ends here: the empty string)
    q(. | s)     = sum_k w_k P_k(. | s) / sum_k w_k              (weighted average; greedy choice)

until "end" wins; s is then given to every member as text (re-tokenised behind a look-behind window,
decoding/feeding.py) and the next step begins. At s = "" "end" is a stop token (generation ends). A
member with no token that continues s (Z_k(s) = 0) puts its whole vote on "end": its own token has
to end before s does. Characters here are bytes (identical for ASCII; a multi-byte character is
chosen byte by byte, which byte-level vocabularies need anyway). The tokens that start with s are one
range of each member's vocabulary sorted by bytes (vocab/covering.py), narrowed byte by byte; the
next-byte masses are one scatter-add over that range.

Log-likelihood of a continuation: sum_k w_k p_k(continuation) / sum_k w_k (sequence level, as GaC
scores); the paper scores no continuations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from pydantic import Field, field_validator

from ensemble_bench.decoding.concurrent import each
from ensemble_bench.decoding.decode import STOP, Advance, DecodingMethod, RequestState, Round
from ensemble_bench.decoding.feeding import give_text, text_appender, text_lookup
from ensemble_bench.decoding.method import (
    Generation,
    GenerationRequest,
    LoglikelihoodRequest,
    WindowParams,
    normalised_weights,
    rolling_with_members,
    score_with_members,
    weights_problem,
)
from ensemble_bench.decoding.sampling import Sampler, draw_rows
from ensemble_bench.decoding.stats import MethodStats, spread
from ensemble_bench.members.base import Member, Score
from ensemble_bench.methods.packllm import mix
from ensemble_bench.vocab.covering import END, SortedVocab


class CharEDParams(WindowParams):
    weights: list[float] | None = Field(default=None, description="per-member weights (null or average: equal, "
                                        "the paper's average)")

    @field_validator("weights")
    @classmethod
    def _positive_sum(cls, value):
        if value is not None and (problem := weights_problem(value)) is not None:
            raise ValueError(problem)
        return value


def no_token(prefix: bytes) -> torch.Tensor | None:
    """The vote of a member with no token (of positive probability) that starts with s."""
    if not prefix:
        return None
    vote = torch.zeros(END + 1, dtype=torch.float64)
    vote[END] = 1.0  # its own token has to end before s does
    return vote


@dataclass(frozen=True)
class Reader:
    """One member inside one row's growing piece s: its next-token probabilities in byte-sorted order
    and the range [lo, hi) of tokens that start with s (vocab/covering.py's sorted vocabulary)."""

    vocab: SortedVocab
    probs: torch.Tensor  # [sorted vocab] float64
    stop: float          # the member's stop probability (ending at s = "")
    lo: int
    hi: int

    def votes(self, prefix: bytes) -> torch.Tensor | None:
        """P_k(. | s) over the 256 next bytes and END ([257], host); None when the member has no say
        (Z_k = 0 at s = ""); all on END when no token of it continues s."""
        if self.hi == self.lo:
            return no_token(prefix)
        _, bytes_at = self.vocab.on(self.probs.device)
        mass = torch.zeros(END + 1, dtype=torch.float64, device=self.probs.device)
        mass.index_add_(0, bytes_at[self.lo:self.hi, len(prefix)], self.probs[self.lo:self.hi])  # END: tokens == s
        if not prefix:
            mass[END] = self.stop  # no token equals "": ending there is a stop
        total = float(mass.sum())
        if total <= 0:
            return no_token(prefix)
        return (mass / total).cpu()

    def narrowed(self, prefix: bytes) -> Reader:
        """The reader of the tokens that start with ``prefix`` (s grown by one byte)."""
        if self.hi == self.lo:
            return self
        return replace(self, **dict(zip(("lo", "hi"), self.vocab.narrow(self.lo, self.hi, prefix))))


def member_readers(vocab: SortedVocab, stop_ids: Sequence[int], logprobs: torch.Tensor) -> list[Reader]:
    """One reader per row of a member's next-token log-probs [rows, V]."""
    order, _ = vocab.on(logprobs.device)
    probs = logprobs.double().exp()
    stops = probs[:, list(stop_ids)].sum(1).tolist() if stop_ids else [0.0] * len(probs)
    return [Reader(vocab, row, stop, 0, vocab.size) for row, stop in zip(probs[:, order], stops)]


def grow_piece(readers: Sequence[Reader], weights: Sequence[float], sampler: Sampler | None = None) -> bytes | None:
    """One row's next piece, byte by byte from the weighted marginals (ties: END, then the lowest
    byte; a row that samples draws each byte or END from q(. | s)); None: a stop wins at s = ""."""
    prefix = b""
    drawing = [sampler] if sampler is not None and not sampler.params.greedy else None
    while True:
        total = torch.zeros(END + 1, dtype=torch.float64)
        for reader, weight in zip(readers, weights):
            votes = reader.votes(prefix)
            if votes is not None:
                total += weight * votes
        if drawing is not None and bool(total.sum() > 0):
            chosen = draw_rows(total.log()[None], drawing)[0]
        else:
            chosen = END if total[END] >= total.max() else int(total[:END].argmax())
        if chosen == END:
            return prefix or None
        prefix += bytes([chosen])
        readers = [reader.narrowed(prefix) for reader in readers]


@dataclass
class CharStats:
    steps: int = 0
    data_bytes: int = 0
    characters: int = 0

    def summary(self) -> dict:
        def per(count: int) -> float | None:
            return count / self.steps if self.steps else None

        return {"chared_steps": self.steps, "chared_characters_per_token": per(self.characters),
                "chared_bytes_per_token": per(self.data_bytes)}


@dataclass(frozen=True)
class CharReport(MethodStats):
    weights_resolved: list[float]
    steps: dict = spread()  # CharStats.summary()


class CharED(DecodingMethod):
    name = "chared"
    Params = CharEDParams
    choice_scoring = "CharED scores an option by the weighted average of its members' sequence probabilities"
    inert_on_choices = frozenset({"window"})
    samples = True
    min_members = 1  # one member alone decodes character-wise (the reference a member with itself equals)

    def __init__(self, members: Sequence[Member], params: CharEDParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        self.weights = normalised_weights(params.weights or [1.0] * len(members), len(members))
        self.vocabs = [SortedVocab(m.vocab.pieces, m.vocab.special_ids | m.stop_ids) for m in members]
        self.stop_ids = [sorted(m.stop_ids) for m in members]
        self.appenders = [text_appender(m, params.window) for m in members]
        self.lead_ids = text_lookup(members[self.lead])
        self.stats = CharStats()

    @classmethod
    def check_members(cls, params: CharEDParams, labels: Sequence[str]) -> None:
        if params.weights is not None:
            normalised_weights(params.weights, len(labels))

    def statistics(self) -> CharReport:
        return CharReport(weights_resolved=self.weights, steps=self.stats.summary())

    # --- generation: the loop's steps -------------------------------------------------------------
    def choose(self, dists: list[torch.Tensor], states: list[RequestState]) -> Round:
        readers = each(self.members, lambda m, vocab, stops, lp: member_readers(vocab, stops, lp),
                       self.vocabs, self.stop_ids, dists)
        pieces = [grow_piece([r[row] for r in readers], self.weights, state.sampler)
                  for row, state in enumerate(states)]
        return Round([self._advance(piece) for piece in pieces], dists)

    def _advance(self, piece: bytes | None) -> Advance:
        if piece is None:
            return STOP
        token = self.lead_ids.get(piece)
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
        per_member = rolling_with_members(self.members, texts, self.batch_size)
        return [mix(values, self.weights) for values in zip(*per_member)]
