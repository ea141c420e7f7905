"""How far two float computations of one quantity may differ in a test: stated once, here.

Two float32 computations of a value agree bit for bit only when they run the same kernels over the
same shapes in the same order. Anything else reorders sums: another batch shape or padding (the
matmul is blocked differently), a cached prefix against a recomputed one, another thread count,
another CPU's kernels (AVX-512 adds 16 lanes at a time where AVX2 adds 8). A float32 sum of n terms
can move by up to about n * 2**-24 * sum(|terms|) when reordered (typically far less). Each
constant below says what differs between its two sides and the largest difference measured over the
tests that use it, on a 2-core AVX2 machine at 1 thread, at 2 threads and with ATen's kernels forced
to their plain build (ATEN_CPU_CAPABILITY=default: other matmul and log-softmax rounding, as another
CPU's vector width gives); each leaves about ten times that for CPUs not measured (docs/ci.md#float-tolerances).

Exact where both sides run one path (no tolerance: ``torch.equal`` or ``==``): the same member asked
twice, a member against its Ray actor (the same kernels in another process at the same thread count:
conftest.py sets 1, the actor its num_cpus), the optimised member step against the plain one on the
same shapes, speculative against every-token decoding, greedy texts and token ids on every path.

A value computed once against its closed form (a few float64 operations) uses ``pytest.approx()``'s
default (relative 1e-6): nothing but the last bits of those operations can differ.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

HANG_GUARD_S = 300  # the one time limit tests use: it ends a hung wait, it is never a speed target


@dataclass(frozen=True)
class Tolerance:
    """``|got - want| <= abs + rel * |want|`` for every element; NaN matches NaN, inf matches inf."""

    name: str
    abs: float
    rel: float = 0.0

    def holds(self, got: float, want: float) -> bool:
        if math.isnan(want) or math.isinf(want):
            return got == want or (math.isnan(got) and math.isnan(want))
        return abs(got - want) <= self.abs + self.rel * abs(want)

    def widened(self, by: float, name: str) -> Tolerance:
        return Tolerance(f"{self.name} + {name}", self.abs + by, self.rel)


# A tiny random model's log-probs (per token, or a continuation's sum or mixture over a few tokens) from
# two paths: a cached prefix against recomputation, a batch against one row, padded against unpadded,
# block or tree reads against steps, a fast path against tests/naive.py; a tiny reward model's scores.
# Measured up to 9.5e-6 (the tiny T5's cached steps; 3.8e-6 for the causal members and the methods).
# The mistakes these tests catch move log-probs far more: a token masked out by mistake 5.7, an old
# byte-level scoring rule 1e-2 to 0.14.
TINY_MODEL = Tolerance("TINY_MODEL", abs=1e-4)

# The real packaged models (SmolLM2 135M: 30 layers, Qwen2.5 0.5B) through two paths: lm-eval's HFLM
# against our member (other padding and batch shapes), the byte-level tree read against the byte loop.
# Deeper and wider sums than the tiny models': measured up to 3.6e-5 (1 thread, AVX2 and plain kernels).
REAL_MODEL = Tolerance("REAL_MODEL", abs=5e-4)

# One model on two engines: vLLM's CPU kernels (fused attention, its own matmuls) against transformers'
# (make test-vllm; not measured with the others, the value its tests had).
OTHER_ENGINE = Tolerance("OTHER_ENGINE", abs=1e-3)

# float32 values of size up to 1 (probabilities, byte masses, mixed distributions, relative-space rows,
# similarity scores) computed with their sums in another order: vectorised against row by row, a cached
# block against a fresh one, another batch. Measured up to 2.4e-7 absolute, 2.3e-6 relative (EVA's
# similarity scores at 2 threads).
FLOAT32_SUMS = Tolerance("FLOAT32_SUMS", abs=1e-6, rel=1e-5)

# PackLLM's prompt weights (a softmax of the members' prompt perplexities over tau, or the weights that
# minimise the mixed perplexity) from two paths: prompts scored in batches or chunks against alone, the
# cached batched method against tests/naive.py. Measured up to 8e-8 beyond a report's rounding.
PROMPT_WEIGHTS = Tolerance("PROMPT_WEIGHTS", abs=1e-5)

# A probability (exp of a log-prob, or a perplexity exp(-mean log-prob)) whose log-prob is within
# TINY_MODEL: exp turns an absolute error d of the log into a relative error of about d. Measured up
# to 9.5e-7 relative.
PROBABILITY_OF_LOGPROB = Tolerance("PROBABILITY_OF_LOGPROB", abs=0.0, rel=1e-4)

# float64 computations on two paths (a resumed run's statistics against one sitting's, a fused
# distribution against the equations by hand): 2**-52 per operation, a few hundred operations.
# Measured up to 5.6e-14 absolute, 3.9e-13 relative.
FLOAT64_SUMS = Tolerance("FLOAT64_SUMS", abs=1e-12, rel=1e-12)


def rounding(digits: int) -> Tolerance:
    """Values each rounded to ``digits`` decimals (a paper's table): half a unit in the last place."""
    return Tolerance(f"rounding to {digits} decimals", abs=0.5 * 10.0 ** -digits + FLOAT64_SUMS.abs)


def assert_close(got, want, tolerance: Tolerance, *, same_argmax: bool = False, what: str = "") -> None:
    """``got`` equals ``want`` within ``tolerance``: tensors (same shape and dtype), floats, or nested
    sequences of floats of the same shape. ``same_argmax``: tensors also pick the same entry per row."""
    label = f"{what}: " if what else ""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype, \
            f"{label}{tuple(got.shape)} {got.dtype} against {tuple(want.shape)} {want.dtype}"
        torch.testing.assert_close(got, want, atol=tolerance.abs, rtol=tolerance.rel, equal_nan=True,
                                   msg=lambda text: f"{label}outside {tolerance.name}: {text}")
        if same_argmax:
            assert torch.equal(got.nan_to_num().argmax(-1), want.nan_to_num().argmax(-1)), f"{label}other argmax"
        return
    pairs = list(_leaves(got, want))
    worst = max(pairs, key=lambda pair: _excess(tolerance, *pair), default=None)
    if worst is not None and not tolerance.holds(*worst):
        raise AssertionError(f"{label}{worst[0]!r} against {worst[1]!r}: outside {tolerance.name} "
                             f"(abs {tolerance.abs:g}, rel {tolerance.rel:g}), {len(pairs)} values compared")


def assert_rounded(reported, want, digits: int, tolerance: Tolerance) -> None:
    """``reported`` is a value the code rounded to ``digits`` decimals for a report; ``want`` the same value
    recomputed on another path (within ``tolerance``). Rounding moves a value by up to half a unit in its
    last place, and two values a hair apart can round apart, so the two are compared within both."""
    assert_close(reported, want, tolerance.widened(rounding(digits).abs, f"rounding to {digits} decimals"))


def _leaves(got, want):
    if isinstance(want, (int, float)):
        assert isinstance(got, (int, float)), f"{got!r} against the number {want!r}"
        yield float(got), float(want)
        return
    assert isinstance(want, Sequence) and isinstance(got, Sequence) and len(got) == len(want), \
        f"{got!r} against {want!r}: not sequences of one length"
    for a, b in zip(got, want):
        yield from _leaves(a, b)


def _excess(tolerance: Tolerance, got: float, want: float) -> float:
    if tolerance.holds(got, want):
        return -1.0
    return math.inf if math.isnan(got - want) else abs(got - want)

# The probability of a short continuation (a product of a few step probabilities, summed over the paths
# that give it) from two decodes of the same text: speculative sampling's block reads against every-token
# sampling's one-token steps (tests/decoding/test_speculative_exact.py). Each of its 3 steps moves as
# PROBABILITY_OF_LOGPROB allows. Measured up to 4.6e-7 relative; a wrong acceptance rule moves them by 0.17-0.19.
CONTINUATION_PROBABILITY = Tolerance("CONTINUATION_PROBABILITY", abs=0.0, rel=3e-4)
