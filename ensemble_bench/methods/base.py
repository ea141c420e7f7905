"""What every method is: a decoding strategy over Members. Knows nothing of lm-eval."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from ensemble_bench.errors import UserError
from ensemble_bench.members.base import Member, Prompt, Score
from ensemble_bench.methods.concurrent import each


class MethodParams(BaseModel):
    """A method's hyper-parameters, validated from the recipe's ``method`` block."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


@dataclass(frozen=True)
class GenerationRequest:
    prompt: Prompt
    until: tuple[str, ...]
    max_new_tokens: int


@dataclass(frozen=True)
class Generation:
    text: str
    new_tokens: int
    finish: str  # "stop_id" | "until" | "length"


@dataclass(frozen=True)
class LoglikelihoodRequest:
    prompt: Prompt
    continuation: str


@dataclass
class Timing:
    """Wall-clock accounting of generation, the way the papers report latency.

    ``decode_ms_per_token`` is decode time per decoding step (one token for every live row);
    at batch size 1 it is the papers' ms/token. Time to first token is the prefill of a batch
    plus the choice of its first token.
    """

    first_token_seconds: float = 0.0
    decode_seconds: float = 0.0
    decode_steps: float = 0  # whole steps, or tokens per row for span-level rounds
    batches: int = 0
    tokens_generated: int = 0
    _mark: float = field(default=0.0, repr=False)

    def start_batch(self) -> None:
        self.batches += 1
        self._mark = time.perf_counter()

    def first_token(self) -> None:
        now = time.perf_counter()
        self.first_token_seconds += now - self._mark
        self._mark = now

    def step(self, steps: float = 1.0) -> None:
        """A decoding round: one token per live row, or (span methods) ``steps`` tokens on average."""
        now = time.perf_counter()
        self.decode_seconds += now - self._mark
        self.decode_steps += steps
        self._mark = now

    def summary(self) -> dict:
        return {
            "decode_ms_per_token": 1000 * self.decode_seconds / self.decode_steps if self.decode_steps else None,
            "time_to_first_token_ms": 1000 * self.first_token_seconds / self.batches if self.batches else None,
            "tokens_generated": self.tokens_generated,
            "decode_steps": self.decode_steps,
            "generation_batches": self.batches,
        }


def continuation_scores(member: Member, requests: Sequence[LoglikelihoodRequest],
                        batch_size: int) -> tuple[list[Score], list[int]]:
    """One member's score of each continuation (its own chat template and tokenisation, lm-eval's
    split) and the continuation's length in its tokens."""
    pairs = [member.encode_pair(member.render_text(r.prompt), r.continuation) for r in requests]
    return (member.score(pairs, batch_size=batch_size) if pairs else []), [len(cont) for _, cont in pairs]


def score_with_members(members: Sequence[Member], requests: Sequence[LoglikelihoodRequest],
                       batch_size: int) -> list[list[Score]]:
    """Every member's score of every continuation (members side by side): ``[member][request]``."""
    return [scores for scores, _ in each(members, lambda m: continuation_scores(m, requests, batch_size))]


def rolling_with_members(members: Sequence[Member], texts: Sequence[str], batch_size: int) -> list[list[float]]:
    """Every member's total log-likelihood of every whole text (perplexity tasks): ``[member][text]``."""
    return each(members, lambda m: [sum(s.logprob for s in m.score(m.rolling_pairs(t), batch_size=batch_size))
                                    for t in texts])


def resolve_member(value: int | str, labels: Sequence[str], field_name: str) -> int:
    """A member named by index or label in a method parameter -> its index (UserError if none)."""
    if isinstance(value, str):
        if value not in labels:
            raise UserError(f"method.{field_name}: '{value}' is not a member (members: {', '.join(labels)})")
        return list(labels).index(value)
    if not 0 <= value < len(labels):
        raise UserError(f"method.{field_name}: index {value} out of range for {len(labels)} members")
    return value


def normalised_weights(weights: Sequence[float], count: int) -> list[float]:
    """Explicit per-member weights, checked and scaled to sum to 1."""
    if len(weights) != count:
        raise UserError(f"method.weights: expected {count} values (one per member), got {len(weights)}")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise UserError(f"method.weights: weights must be >= 0 with a positive sum, got {list(weights)}")
    return [w / sum(weights) for w in weights]


class Method(ABC):
    """A decoding strategy over one or more members."""

    name: ClassVar[str]
    Params: ClassVar[type[MethodParams]] = MethodParams
    min_members: ClassVar[int] = 1
    max_members: ClassVar[int | None] = None

    @classmethod
    def check_members(cls, params: MethodParams, labels: Sequence[str]) -> None:
        """Checks that need the member list (counts of weights, gate names); raise UserError."""

    def __init__(self, members: Sequence[Member], params: MethodParams, batch_size: int = 1):
        self.members = list(members)
        self.params = params
        self.batch_size = batch_size
        self.timing = Timing()

    @abstractmethod
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Greedy generation for every request (each with its own stop strings and budget)."""

    @abstractmethod
    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Score]:
        """Log-likelihood of each continuation and whether it is the greedy choice."""

    @abstractmethod
    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        """Total log-likelihood of each whole text (perplexity tasks)."""

    def info(self) -> dict:
        """Hyper-parameters and timing, for the results file."""
        return {"method": self.name, "params": self.params.model_dump(), "batch_size": self.batch_size,
                **self.timing.summary()}
