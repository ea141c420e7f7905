"""What every method is: a decoding strategy over Members. Knows nothing of lm-eval."""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ensemble_bench.decoding.concurrent import each
from ensemble_bench.decoding.params import EQUAL_WEIGHTS_ALIAS as EQUAL_WEIGHTS_ALIAS
from ensemble_bench.decoding.params import MethodParams as MethodParams
from ensemble_bench.decoding.params import MethodSpec
from ensemble_bench.decoding.params import WindowParams as WindowParams
from ensemble_bench.decoding.params import checked_weights as checked_weights
from ensemble_bench.decoding.params import lead_field as lead_field
from ensemble_bench.decoding.params import normalised_weights as normalised_weights
from ensemble_bench.decoding.params import resolve_member as resolve_member
from ensemble_bench.decoding.params import weights_problem as weights_problem
from ensemble_bench.decoding.sampling import RequestSampling
from ensemble_bench.decoding.stats import MethodStats, RunStats
from ensemble_bench.errors import UserError
from ensemble_bench.members.base import SCORING, Member, Prompt, Score, flatten_messages, require


@dataclass(frozen=True)
class GenerationRequest:
    prompt: Prompt
    until: tuple[str, ...]
    max_new_tokens: int
    sampling: RequestSampling | None = None  # None: greedy; else what the request draws with (decoding/sampling.py)


@dataclass(frozen=True)
class Generation:
    text: str
    new_tokens: int
    finish: str  # "stop_id" | "until" | "length" | "no_continuation" (byte_level: no member can spell the text)


@dataclass(frozen=True)
class LoglikelihoodRequest:
    prompt: Prompt
    continuation: str


@dataclass
class Truncations:
    """Per member, the row's requests cut from the left to fit the member's window (HFLM's rule)."""

    contexts_truncated: list[int]


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
    first_round_steps: float = 0  # tokens per row of the first rounds (more than one for span-level rounds)
    _mark: float = field(default=0.0, repr=False)

    def start_batch(self) -> None:
        self.batches += 1
        self._mark = time.perf_counter()

    def first_token(self, steps: float = 1.0) -> None:
        now = time.perf_counter()
        self.first_token_seconds += now - self._mark
        self.first_round_steps += steps
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
            # a row whose requests all finish in their first round (one span) has no decode step: this is its ms/token
            "first_round_ms_per_token": (1000 * self.first_token_seconds / self.first_round_steps
                                         if self.first_round_steps else None),
            "tokens_generated": self.tokens_generated,
            "decode_steps": self.decode_steps,
            "generation_batches": self.batches,
        }


NON_FINITE_CAUSES = ("a NaN or infinite score is never counted; the usual causes are NaN or infinite weights "
                     "(the model's, or the method's) or an fp16 overflow: try dtype: float32 or bfloat16")


class NonFiniteScore(UserError):
    """A NaN or infinite log-likelihood or probability reached the scorer: the row stops with one
    line naming who gave it, the request and the step (exit 2), and no score is kept.

    ``row`` (set by the decoding loop: the request's row in its batch), ``prompt`` and
    ``continuation`` let the callers up the stack name the request better (``with_``): the loop
    knows only rows, the method its requests, lm.py the benchmark's document.
    """

    def __init__(self, who: str, value: float, step: str, excerpt: str, *, row: int | None = None,
                 prompt: Prompt | None = None, continuation: str | None = None, where: str = ""):
        self.parts = {"who": who, "value": value, "step": step, "excerpt": excerpt, "row": row, "prompt": prompt,
                      "continuation": continuation, "where": where}
        self.row, self.prompt, self.continuation = row, prompt, continuation
        super().__init__(self.message(**self.parts))

    @staticmethod
    def message(who, value, step, excerpt, where, **_) -> str:
        return f"{who} gave a non-finite score ({value}) {step}, for request{where}: {excerpt}; {NON_FINITE_CAUSES}"

    def with_(self, **changes) -> NonFiniteScore:
        """The same fault with some parts replaced (a better name for the request)."""
        return type(self)(**{**self.parts, **changes})

    def of_row(self, method: Method, label: str) -> NonFiniteScore:
        """The fault as the recipe's row ``label`` reports it: a member's names its member already."""
        return self


def excerpt(text: str, width: int = 40, end: bool = False) -> str:
    """A short quote of a text: its first (or, ``end``, its last) ``width`` characters."""
    if len(text) <= width:
        return repr(text)
    return repr("..." + text[-width:]) if end else repr(text[:width] + "...")


def request_excerpt(prompt: Prompt, continuation: str | None = None) -> str:
    """How a fault names a request: the end of its context, the start of its continuation."""
    context = flatten_messages(prompt.messages) if prompt.is_chat else prompt.text
    shown = f"context {excerpt(context, end=True)}"
    return shown if continuation is None else f"{shown}, continuation {excerpt(continuation)}"


def check_finite(values: Sequence[float], who: str, step: str, prompts: Sequence[Prompt],
                 continuations: Sequence[str | None]) -> None:
    """NonFiniteScore for the first value that is NaN or infinite (one ``isfinite`` per value,
    over floats already on the host)."""
    bad = next((k for k, value in enumerate(values) if not math.isfinite(value)), None)
    if bad is not None:
        raise NonFiniteScore(who, values[bad], step, request_excerpt(prompts[bad], continuations[bad]),
                             prompt=prompts[bad], continuation=continuations[bad])


def continuation_scores(member: Member, requests: Sequence[LoglikelihoodRequest],
                        batch_size: int) -> tuple[list[Score], list[int]]:
    """One member's score of each continuation (its own chat template and tokenisation, lm-eval's
    split) and the continuation's length in its tokens; NonFiniteScore if one is NaN or infinite."""
    require([member], SCORING, "scoring a continuation with one member")
    pairs = [member.encode_pair(member.render_text(r.prompt), r.continuation) for r in requests]
    scores = member.score(pairs, batch_size=batch_size) if pairs else []
    check_finite([s.logprob for s in scores], f"member '{member.name}'", "scoring a continuation",
                 [r.prompt for r in requests], [r.continuation for r in requests])
    return scores, [len(cont) for _, cont in pairs]


def score_with_members(members: Sequence[Member], requests: Sequence[LoglikelihoodRequest],
                       batch_size: int) -> list[list[Score]]:
    """Every member's score of every continuation (members side by side): ``[member][request]``."""
    return [scores for scores, _ in each(members, lambda m: continuation_scores(m, requests, batch_size))]


def rolling_with_members(members: Sequence[Member], texts: Sequence[str], batch_size: int) -> list[list[float]]:
    """Every member's total log-likelihood of every whole text (perplexity tasks): ``[member][text]``;
    NonFiniteScore if one is NaN or infinite."""
    def totals(member: Member) -> list[float]:
        require([member], SCORING, "scoring a whole text with one member")
        values = [sum(s.logprob for s in member.score(member.rolling_pairs(t), batch_size=batch_size)) for t in texts]
        check_finite(values, f"member '{member.name}'", "scoring a whole text", [Prompt(text=t) for t in texts],
                     [None] * len(texts))
        return values

    return each(members, totals)


def sequence_mixture(weights: Sequence[float], per_member: list[list[float]]) -> list[float]:
    """log(sum_i w_i exp(logp_i) / sum_i w_i) per sequence, from each member's log-probabilities
    (``per_member[i][k]``); a zero weight (a member kept for the gate only; GaC Table 5) has no share."""
    log_w = [math.log(w) if w > 0 else -math.inf for w in weights]
    log_total = math.log(sum(weights))
    return [float(torch.logsumexp(torch.tensor([lp + lw for lp, lw in zip(values, log_w)]), 0)) - log_total
            for values in zip(*per_member)]


class Method(MethodSpec, ABC):
    """A decoding strategy over one or more members: what its declaration (``MethodSpec``) says, and
    the work."""

    lead: int = 0  # the lead member's index: its decode renders the text (set from ``lead_param``)
    stats: Any = None       # the method's own counters (a dataclass), where it keeps some: ``carried``
    feed_stats: Any = None  # the re-tokenisation counters (decoding/feeding.FeedStats) where members take text

    def __init__(self, members: Sequence[Member], params: MethodParams, batch_size: int = 1):
        self.members = list(members)
        self.params = params
        self.batch_size = batch_size
        self.timing = Timing()
        self.truncations = Truncations([0] * len(self.members))
        self._truncations_seen = [m.contexts_truncated for m in self.members]  # members serve several rows

    @abstractmethod
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Generation for every request (each with its own stop strings, budget and sampling)."""

    def refuse_sampling(self, requests: Sequence[GenerationRequest]) -> None:
        """UserError when a request samples and this method cannot (the dry run says so first:
        tasks/task_sampling.py); no request falls back to greedy decoding."""
        asked = next((r.sampling.params for r in requests if r.sampling and not r.sampling.params.greedy), None)
        if asked is None:
            return
        if not self.samples:
            raise UserError(f"method '{self.name}' decodes greedily only, but a request samples ({asked.record()}): "
                            "use a method that samples (docs/sampling.md) or set sampling: {do_sample: false}")
        if getattr(self, "speculation", None) is not None and (
                problem := self.speculative_sampling_problem(self.params)) is not None:
            raise UserError(f"method '{self.name}' {problem}, but a request samples: "
                            "set speculative: 0, or sampling: {do_sample: false}")

    @abstractmethod
    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Score]:
        """Log-likelihood of each continuation and whether it is the greedy choice."""

    @abstractmethod
    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        """Total log-likelihood of each whole text (perplexity tasks)."""

    def statistics(self) -> MethodStats | dict[str, Any]:
        """The method's own statistics, a ``MethodStats`` dataclass it declares (serialised under its name;
        ``ensembled_fraction`` and ``tokens_manipulated_per_step`` fill those fields of ``RunStats``); a
        method with none of its own reports an empty dict."""
        return {}

    def run_stats(self) -> RunStats:
        """Hyper-parameters, timing, the method's counters and, per member, the requests of this
        method cut from the left to fit the member's window."""
        truncated = dict(zip((m.name for m in self.members), self.counted_truncations().contexts_truncated))
        shared = {"method": self.name, "params": self.params.model_dump(mode="json"), "batch_size": self.batch_size,
                  **self.timing.summary(), "contexts_truncated": truncated}
        return RunStats.of_method(shared, self.statistics())

    def counted_truncations(self) -> Truncations:
        """``truncations`` with the members' cuts since the last look added in: a member's own counter
        runs across every row it serves, and a resumed row's holder starts from its earlier sittings'."""
        now = [m.contexts_truncated for m in self.members]
        self.truncations.contexts_truncated = [held + count - seen for held, count, seen in
                                               zip(self.truncations.contexts_truncated, now, self._truncations_seen)]
        self._truncations_seen = now
        return self.truncations

    def carried(self) -> dict[str, object]:
        """The accumulators of the row's statistics (dataclasses of counters and sums), carried across the
        sittings of a resumed row (``sittings``): the timing, the method's ``stats`` and ``feed_stats`` where
        it has them; a method adds the accumulators its parts keep (speculation, CoRE). How each field joins
        the earlier sittings' its dataclass declares (decoding/stats.py: added unless ``peak``; the records
        of a ``per_request`` list follow the earlier sittings')."""
        held = {"timing": self.timing, "stats": self.stats, "feed": self.feed_stats,
                "truncations": self.counted_truncations()}
        return {key: holder for key, holder in held.items() if holder is not None}

    def info(self) -> dict:
        """The run statistics' JSON form, for the results files."""
        return self.run_stats().to_json()
