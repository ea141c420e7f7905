"""Sampling: what a request asks for (``SamplingParams``), the transforms that shape a distribution
before a draw (one small class each), the per-request generator, and the draw itself.

A method decides in a space of its own (GaC's union, UniTE's top-k union, the lead's vocabulary,
bytes: docs/sampling.md); wherever it would take the argmax of a distribution there, a request that
samples draws from that distribution instead, after its transforms, in this order (transformers'
order: temperature, top-k, top-p, min-p):

    Temperature   l'(x) = l(x) / T
    TopK          keep the k largest entries (ties with the k-th kept)
    TopP          keep the smallest set of most probable entries whose mass reaches p
    MinP          keep the entries with p(x) >= min_p * max_y p(y)

Every transform takes and returns a [rows, n] tensor of log-weights (log-probabilities up to one
constant per row; -inf: never drawn). A draw is inverse transform sampling: one uniform number per
row from the request's own generator (``request_generator``), seeded from the recipe's seed, the
request's identity and its repeat index, so that what a request draws does not depend on the batch
it is in, its neighbours, a resumed run or a replica.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

NOT_DRAWN = float("-inf")


# --- the transforms ----------------------------------------------------------------------------------
class Transform:
    """A change to a [rows, n] tensor of log-weights before a draw."""

    def __call__(self, logweights: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class Temperature(Transform):
    r"""Divides the log-weights by T (T > 0): :math:`l'(x) = l(x) / T`, the distribution
    :math:`p(x)^{1/T}` renormalised. T < 1 sharpens it, T > 1 flattens it."""

    def __init__(self, temperature: float):
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
        self.temperature = temperature

    def __call__(self, logweights: torch.Tensor) -> torch.Tensor:
        return logweights / self.temperature


class TopK(Transform):
    r"""Keeps each row's k largest entries: :math:`l'(x) = l(x)` if :math:`l(x) \ge l_{(k)}`, the k-th
    largest value of the row, else :math:`-\infty`. Entries tied with the k-th are kept."""

    def __init__(self, top_k: int):
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.top_k = top_k

    def __call__(self, logweights: torch.Tensor) -> torch.Tensor:
        if self.top_k >= logweights.shape[-1]:
            return logweights
        kth = logweights.topk(self.top_k, dim=-1).values[:, -1:]
        return logweights.masked_fill(logweights < kth, NOT_DRAWN)


class TopP(Transform):
    r"""Nucleus sampling: keeps the smallest set of most probable entries whose probability reaches p.
    With the entries sorted by probability, :math:`p_{(1)} \ge p_{(2)} \ge \dots`, entry :math:`(j)` is
    kept when :math:`\sum_{i<j} p_{(i)} < p`: the mass before it has not reached p yet (the most
    probable entry is always kept; ties keep the lower index first)."""

    def __init__(self, top_p: float):
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self.top_p = top_p

    def __call__(self, logweights: torch.Tensor) -> torch.Tensor:
        if self.top_p >= 1:
            return logweights
        probs = torch.softmax(logweights.double(), dim=-1)
        ordered, order = probs.sort(dim=-1, descending=True, stable=True)
        before = ordered.cumsum(dim=-1) - ordered
        drop = torch.zeros_like(before, dtype=torch.bool).scatter_(-1, order, before >= self.top_p)
        return logweights.masked_fill(drop, NOT_DRAWN)


class MinP(Transform):
    r"""Keeps the entries at least min_p times as probable as the row's most probable one:
    :math:`l'(x) = l(x)` if :math:`p(x) \ge \text{min\_p} \cdot \max_y p(y)`, else :math:`-\infty`."""

    def __init__(self, min_p: float):
        if not 0 <= min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {min_p}")
        self.min_p = min_p

    def __call__(self, logweights: torch.Tensor) -> torch.Tensor:
        if self.min_p <= 0:
            return logweights
        floor = logweights.amax(dim=-1, keepdim=True) + math.log(self.min_p)
        return logweights.masked_fill(logweights < floor, NOT_DRAWN)


# --- what a request asks for ---------------------------------------------------------------------------
class SamplingParams(BaseModel):
    """How one request decodes, as lm-eval's ``generation_kwargs`` say it (``from_gen_kwargs``), with a
    recipe's ``sampling:`` applied over them (``SamplingOverride``). Greedy (``greedy``) unless
    ``do_sample`` and a temperature above 0, as lm-eval's own normalisation reads them."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
    do_sample: bool = False
    temperature: float = Field(default=1.0, ge=0.0, description="0: greedy, as in lm-eval and transformers")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="0: no top-k")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)

    @classmethod
    def from_gen_kwargs(cls, gen_kwargs: dict[str, Any]) -> SamplingParams:
        """lm-eval's reading (``lm_eval.models.utils.normalize_gen_kwargs``): a missing temperature is 0;
        a missing ``do_sample`` is true when the temperature is above 0; ``do_sample: false`` is greedy
        whatever the temperature. ValueError (one line) for a value out of range."""
        given = {key: gen_kwargs[key] for key in ("top_p", "top_k", "min_p") if gen_kwargs.get(key) is not None}
        temperature = float(gen_kwargs.get("temperature") or 0.0)
        do_sample = gen_kwargs.get("do_sample")
        do_sample = temperature > 0 if do_sample is None else bool(do_sample)
        return cls.model_validate({"do_sample": do_sample, "temperature": temperature,
                                   **{k: float(v) if k != "top_k" else int(v) for k, v in given.items()}},
                                  strict=False)

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0

    def transforms(self) -> list[Transform]:
        """The transforms that change anything, in transformers' order (none when greedy)."""
        if self.greedy:
            return []
        chosen: list[Transform] = [] if self.temperature == 1 else [Temperature(self.temperature)]
        chosen += [TopK(self.top_k)] if self.top_k else []
        chosen += [TopP(self.top_p)] if self.top_p < 1 else []
        return chosen + ([MinP(self.min_p)] if self.min_p > 0 else [])

    def shape(self, logweights: torch.Tensor) -> torch.Tensor:
        """The log-weights after every transform (float32 at least)."""
        shaped = logweights if logweights.dtype == torch.float64 else logweights.float()
        for transform in self.transforms():
            shaped = transform(shaped)
        return shaped

    def record(self) -> dict[str, Any]:
        """What a results file records: ``greedy``, or the settings drawn with."""
        if self.greedy:
            return {"do_sample": False}
        return self.model_dump()


class SamplingOverride(BaseModel):
    """A recipe's ``sampling:`` (a method entry's, else the recipe's): the settings it gives replace the
    task's own, for every generating request of the rows it applies to. ``do_sample: false`` decodes
    greedily whatever the task asks."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
    do_sample: bool | None = None
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _says_something(self):
        if not self.model_fields_set:
            raise ValueError("give at least one of do_sample, temperature, top_p, top_k, min_p")
        return self

    def over(self, params: SamplingParams) -> SamplingParams:
        """``params`` with the settings given here; a temperature above 0 given without ``do_sample``
        samples (as in ``from_gen_kwargs``)."""
        given = self.model_dump(exclude_none=True)
        if "temperature" in given and "do_sample" not in given:
            given["do_sample"] = given["temperature"] > 0
        return params.model_copy(update=given)

    def merged(self, under: SamplingOverride | None) -> SamplingOverride:
        """This override over another (a method entry's over the recipe's)."""
        if under is None:
            return self
        return SamplingOverride(**{**under.model_dump(exclude_none=True), **self.model_dump(exclude_none=True)})


# --- per-request generators ----------------------------------------------------------------------------
def request_key(context: str, gen_kwargs: dict[str, Any]) -> str:
    """A request's identity: SHA-256 of its context and generation settings (JSON with sorted keys),
    the same in every process (never Python's ``hash``)."""
    text = json.dumps([context, gen_kwargs], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def request_generator(seed: int, request_key: str, repeat: int) -> torch.Generator:
    """A CPU generator of its own for one sample of one request: seeded from the recipe's ``seed``,
    the request's identity (``request_key``) and which of its repeats this is (lm-eval's ``repeats``)."""
    digest = hashlib.sha256(f"{seed}\0{request_key}\0{repeat}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


@dataclass(frozen=True)
class RequestSampling:
    """What one generation request draws with: its settings and the seed of its generator."""

    params: SamplingParams
    seed: int
    key: str
    repeat: int = 0

    def sampler(self) -> Sampler:
        """A fresh sampler: the settings, and the generator at its start."""
        return Sampler(self.params, request_generator(self.seed, self.key, self.repeat))


@dataclass
class Sampler:
    """One request's settings and its generator, while it is decoded (``RequestState.sampler``)."""

    params: SamplingParams
    generator: torch.Generator


# --- the draw --------------------------------------------------------------------------------------------
def inverse_cdf(weights: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One index per row of ``weights`` [rows, n] (>= 0, any scale) with probability proportional to its
    weight: the first index whose cumulative weight exceeds u x the row's total, u ~ U[0, 1) from the
    row's own generator (one number per row, drawn on the host; the sums in float64 where the weights
    are). An entry of weight 0 is never drawn."""
    uniform = torch.stack([torch.rand((), dtype=torch.float64, generator=g) for g in generators])
    cumulative = weights.cumsum(dim=-1, dtype=torch.float64)
    total = cumulative[:, -1:].contiguous()
    drawn = torch.searchsorted(cumulative, uniform.to(weights.device)[:, None] * total, right=True)
    last = torch.searchsorted(cumulative, total)  # the last entry of positive weight (u x total rounded up)
    return torch.minimum(drawn, last).flatten()


def draw(logprobs: torch.Tensor, params: SamplingParams, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One index per row of ``logprobs`` [rows, n] (log-probabilities, or log-weights of any scale per
    row): the argmax for greedy ``params`` (the first of equal values), else a draw from the shaped
    distribution (``SamplingParams.shape``), each row with its own generator."""
    if params.greedy:
        return logprobs.argmax(dim=-1)
    shaped = params.shape(logprobs)
    weights = (shaped - shaped.amax(dim=-1, keepdim=True)).exp_()
    return inverse_cdf(weights, generators)


def draw_rows(logprobs: torch.Tensor, samplers: Sequence[Sampler]) -> list[int]:
    """``draw`` for rows that may ask for different settings (a batch holding several tasks' requests):
    each group of rows with the same settings in one call."""
    chosen = [0] * len(samplers)
    groups: dict[SamplingParams, list[int]] = {}
    for row, sampler in enumerate(samplers):
        groups.setdefault(sampler.params, []).append(row)
    for params, rows in groups.items():
        picked = logprobs if len(rows) == len(samplers) else logprobs[torch.tensor(rows, device=logprobs.device)]
        for row, index in zip(rows, draw(picked, params, [samplers[r].generator for r in rows]).tolist()):
            chosen[row] = index
    return chosen


def draw_blocks(blocks: Iterable[tuple[slice, torch.Tensor]], samplers: Sequence[Sampler]) -> list[int]:
    """``draw_rows`` over a distribution given a block of rows at a time: (the block's rows, their log-weights)
    pairs, such as vocab/mixture.py's ``log_blocks`` of GaC's q."""
    drawn: list[int] = []
    for rows, logweights in blocks:
        drawn += draw_rows(logweights, samplers[rows])
    return drawn


def sampling_rows(samplers: Sequence[Sampler | None]) -> list[int]:
    """The rows that draw (their sampler is not greedy)."""
    return [row for row, sampler in enumerate(samplers) if sampler is not None and not sampler.params.greedy]


def rows_of(values: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """These rows of a [rows, n] tensor (no copy when they are all of them, in order)."""
    if list(rows) == list(range(values.shape[0])):
        return values
    return values.index_select(0, torch.tensor(list(rows), dtype=torch.long, device=values.device))


def decide(samplers: Sequence[Sampler | None], greedy: Callable[[list[int]], list[int]],
           sample: Callable[[list[int], list[Sampler]], list[int]]) -> list[int]:
    """Each row's choice: the method's ``greedy(rows)`` for the rows that decode greedily (every row, as
    before sampling existed, when none samples), ``sample(rows, their samplers)`` for the rows that draw."""
    drawn = sampling_rows(samplers)
    if not drawn:
        return greedy(list(range(len(samplers))))
    chosen = [0] * len(samplers)
    if kept := sorted(set(range(len(samplers))) - set(drawn)):
        for row, choice in zip(kept, greedy(kept)):
            chosen[row] = choice
    for row, choice in zip(drawn, sample(drawn, [samplers[row] for row in drawn])):
        chosen[row] = choice
    return chosen


def decide_on(values: torch.Tensor, samplers: Sequence[Sampler | None], greedy: Callable[[torch.Tensor], list[int]],
              probabilities: bool = False) -> list[int]:
    """``decide`` over one [rows, n] tensor: the method's ``greedy`` of the greedy rows' values, a draw
    (``draw_rows``) for the others. ``values`` are log-weights, or with ``probabilities`` weights >= 0 of any
    scale (a fusion's output; drawn from their logarithm, 0 never drawn)."""
    def sample(rows: list[int], drawing: list[Sampler]) -> list[int]:
        chosen = rows_of(values, rows)
        return draw_rows(chosen.clamp(min=0).log() if probabilities else chosen, drawing)

    return decide(samplers, lambda rows: greedy(rows_of(values, rows)), sample)
