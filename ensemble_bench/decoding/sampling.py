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
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from ensemble_bench.decoding.sampling_params import RequestSampling as RequestSampling
from ensemble_bench.decoding.sampling_params import SamplingOverride as SamplingOverride
from ensemble_bench.decoding.sampling_params import SamplingParams
from ensemble_bench.decoding.sampling_params import request_key as request_key

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


# --- per-request generators ----------------------------------------------------------------------------
def request_generator(seed: int, request_key: str, repeat: int) -> torch.Generator:
    """A CPU generator of its own for one sample of one request: seeded from the recipe's ``seed``,
    the request's identity (``request_key``) and which of its repeats this is (lm-eval's ``repeats``)."""
    digest = hashlib.sha256(f"{seed}\0{request_key}\0{repeat}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


@dataclass
class Sampler:
    """One request's settings and its generator, while it is decoded (``RequestState.sampler``)."""

    params: SamplingParams
    generator: torch.Generator

    @classmethod
    def of(cls, sampling: RequestSampling) -> Sampler:
        """A fresh sampler of a request: its settings, and its generator at its start."""
        return cls(sampling.params, request_generator(sampling.seed, sampling.key, sampling.repeat))


def transforms(params: SamplingParams) -> list[Transform]:
    """The transforms of a request's settings that change anything, in transformers' order (none when greedy)."""
    if params.greedy:
        return []
    chosen: list[Transform] = [] if params.temperature == 1 else [Temperature(params.temperature)]
    chosen += [TopK(params.top_k)] if params.top_k else []
    chosen += [TopP(params.top_p)] if params.top_p < 1 else []
    return chosen + ([MinP(params.min_p)] if params.min_p > 0 else [])


def shape(params: SamplingParams, logweights: torch.Tensor) -> torch.Tensor:
    """The log-weights after every transform of ``params`` (float32 at least)."""
    shaped = logweights if logweights.dtype == torch.float64 else logweights.float()
    for transform in transforms(params):
        shaped = transform(shaped)
    return shaped


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


def bernoulli(probability: float, generator: torch.Generator) -> bool:
    """True with ``probability``: a uniform u ~ U[0, 1) from ``generator`` falls below it."""
    return bool(torch.rand((), dtype=torch.float64, generator=generator) < probability)


def draw(logprobs: torch.Tensor, params: SamplingParams, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One index per row of ``logprobs`` [rows, n] (log-probabilities, or log-weights of any scale per
    row): the argmax for greedy ``params`` (the first of equal values), else a draw from the shaped
    distribution (``shape``), each row with its own generator."""
    if params.greedy:
        return logprobs.argmax(dim=-1)
    shaped = shape(params, logprobs)
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
