"""The statistics behind every score ensbench reports (docs/statistics.md says why each one).

Pure functions over per-example values; nothing here reads files.

- :func:`wilson_interval`: 95% interval of a share (accuracy, exact match, pass@1: mean of 0/1 values).
- :func:`bootstrap_interval`: percentile bootstrap of any statistic (BLEU, chrF, means of
  continuous values), with a fixed seed so a report is the same every time it is written.
- :func:`mcnemar_exact`: two-sided exact McNemar test of two rows scored 0/1 on the same examples.
- :func:`paired_bootstrap`: two-sided paired bootstrap test of two rows on the same examples.
- :func:`paired_counts`, :func:`oracle_share`, :func:`agreement_share`: wins/losses/ties, the
  share of examples some member gets right, the share where members answer alike.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

CONFIDENCE = 0.95
BOOTSTRAP_SEED = 1234
BOOTSTRAP_ITERS = 1000


def z_value(confidence: float = CONFIDENCE, sides: int = 2) -> float:
    """The normal quantile of a ``sides``-sided interval at ``confidence`` (1.96 for 95%, two-sided)."""
    tail = (1 - confidence) / sides
    return NormalDist().inv_cdf(1 - tail)


def is_binary(values: Sequence[float]) -> bool:
    return all(v in (0, 1) for v in values)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def wilson_interval(successes: float, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of a proportion (stays inside [0, 1], sensible at 0/n and n/n)."""
    if n <= 0:
        return (math.nan, math.nan)
    z = z_value(confidence)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def difference_standard_error(p: float, n_first: int, n_second: int) -> float:
    """Standard error of the difference of two proportions that share the true value ``p``."""
    return math.sqrt(p * (1 - p) * (1 / n_first + 1 / n_second))


def _percentile(sorted_values: Sequence[float], share: float) -> float:
    """Linear-interpolated percentile of already sorted values (share in [0, 1])."""
    position = share * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def resampled_indices(n: int, iters: int, seed: int) -> list[list[int]]:
    """``iters`` resamples (with replacement) of range(n), the same for the same seed."""
    generator = random.Random(seed)
    return [[generator.randrange(n) for _ in range(n)] for _ in range(iters)]


def bootstrap_interval(items: Sequence, statistic: Callable[[Sequence], float] = mean,
                       confidence: float = CONFIDENCE, iters: int = BOOTSTRAP_ITERS,
                       seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` over ``items`` (fixed seed: reproducible)."""
    if not items:
        return (math.nan, math.nan)
    estimates = sorted(statistic([items[i] for i in picks]) for picks in resampled_indices(len(items), iters, seed))
    tail = (1 - confidence) / 2
    return (_percentile(estimates, tail), _percentile(estimates, 1 - tail))


def score_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson for 0/1 values, the bootstrap of the mean for anything else."""
    if is_binary(values):
        return wilson_interval(sum(values), len(values), confidence)
    return bootstrap_interval(values, mean, confidence)


def mcnemar_exact(only_first: int, only_second: int) -> float:
    """Two-sided exact McNemar p-value: a binomial(b + c, 1/2) test on the discordant pairs
    (b = examples only the first row gets right, c = only the second)."""
    discordant = only_first + only_second
    if discordant == 0:
        return 1.0
    tail = sum(math.comb(discordant, k) for k in range(min(only_first, only_second) + 1))
    return min(1.0, 2 * tail / 2 ** discordant)


def paired_bootstrap(first: Sequence, second: Sequence, statistic: Callable[[Sequence], float] = mean,
                     iters: int = BOOTSTRAP_ITERS, seed: int = BOOTSTRAP_SEED) -> float:
    """Two-sided paired bootstrap p-value of statistic(first) - statistic(second): resample the
    examples (the same indices for both rows) and count how often the difference lands on the
    other side of zero; p = 2 x the smaller share, at most 1."""
    if len(first) != len(second):
        raise ValueError("paired rows need the same examples")
    if not first:
        return 1.0
    at_most_zero = at_least_zero = 0
    for picks in resampled_indices(len(first), iters, seed):
        delta = statistic([first[i] for i in picks]) - statistic([second[i] for i in picks])
        at_most_zero += delta <= 0
        at_least_zero += delta >= 0
    return min(1.0, 2 * min(at_most_zero, at_least_zero) / iters)


@dataclass(frozen=True)
class Paired:
    """One row against another on the same examples."""
    wins: int     # examples where the row scores higher
    losses: int   # ... lower
    ties: int
    p_value: float
    test: str     # "McNemar exact" or "paired bootstrap"

    @property
    def examples(self) -> int:
        return self.wins + self.losses + self.ties


def paired_counts(first: Sequence[float], second: Sequence[float]) -> tuple[int, int, int]:
    """(wins, losses, ties) of ``first`` against ``second``, example by example."""
    wins = sum(a > b for a, b in zip(first, second))
    losses = sum(a < b for a, b in zip(first, second))
    return wins, losses, len(first) - wins - losses


def paired_test(first: Sequence[float], second: Sequence[float],
                statistic: Callable[[Sequence], float] | None = None,
                first_items: Sequence | None = None, second_items: Sequence | None = None) -> Paired:
    """Wins/losses/ties and a p-value: McNemar exact for 0/1 scores, the paired bootstrap otherwise
    (over ``*_items`` with ``statistic`` for corpus-level metrics such as BLEU, else the mean)."""
    wins, losses, ties = paired_counts(first, second)
    if statistic is None and is_binary(first) and is_binary(second):
        return Paired(wins, losses, ties, mcnemar_exact(wins, losses), "McNemar exact")
    p = paired_bootstrap(first_items if first_items is not None else first,
                         second_items if second_items is not None else second, statistic or mean)
    return Paired(wins, losses, ties, p, "paired bootstrap")


def oracle_share(member_scores: Sequence[Sequence[float]]) -> float:
    """The ceiling of picking the best member per example: the mean over examples of the best
    member's score (for 0/1 scores: the share of examples some member gets right)."""
    per_example = list(zip(*member_scores))
    return mean([max(scores) for scores in per_example])


def agreement_share(member_answers: Sequence[Sequence[object]]) -> float:
    """Share of examples where every member gives the same answer."""
    per_example = list(zip(*member_answers))
    return mean([float(len(set(map(repr, answers))) == 1) for answers in per_example])
