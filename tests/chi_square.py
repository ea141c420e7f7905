"""A chi-square goodness-of-fit check for the sampling tests: observed counts of categories against
expected probabilities, categories expected fewer than 5 times lumped into one, compared with the
0.999 quantile of the chi-square distribution (Wilson-Hilferty's approximation; no scipy)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping

Z_999 = 3.090232306  # the standard normal's 0.999 quantile


def quantile_999(degrees: int) -> float:
    """chi^2 quantile 0.999 with ``degrees`` degrees of freedom: k (1 - 2/(9k) + z sqrt(2/(9k)))^3."""
    spread = 2 / (9 * degrees)
    return degrees * (1 - spread + Z_999 * math.sqrt(spread)) ** 3


def statistic(observed: Counter, expected: Mapping[Hashable, float]) -> tuple[float, int]:
    """(chi^2, degrees of freedom) of ``observed`` counts against ``expected`` probabilities (summing to 1).
    A category never expected but observed makes chi^2 infinite."""
    draws = sum(observed.values())
    if any(category not in expected or expected[category] <= 0 for category in observed):
        return math.inf, 1
    big = [c for c, p in expected.items() if p * draws >= 5]
    cells = [(observed[c], expected[c] * draws) for c in big]
    rest_expected = draws - sum(e for _, e in cells)
    if rest_expected > 1e-9:
        cells.append((draws - sum(o for o, _ in cells), rest_expected))
    chi2 = sum((o - e) ** 2 / e for o, e in cells)
    return chi2, max(1, len(cells) - 1)


def fits(observed: Counter, expected: Mapping[Hashable, float]) -> bool:
    """Whether the counts pass the test at level 0.001."""
    chi2, degrees = statistic(observed, expected)
    return chi2 < quantile_999(degrees)


def two_sample(first: Counter, second: Counter) -> tuple[float, int]:
    """(chi^2, degrees of freedom) of the hypothesis that two samples come from one distribution:
    sum over categories of (a sqrt(m/n) - b sqrt(n/m))^2 / (a + b), n and m the sample sizes, categories
    seen fewer than 10 times in both together lumped into one."""
    n, m = sum(first.values()), sum(second.values())
    cells: list[tuple[int, int]] = []
    rest = [0, 0]
    for category in set(first) | set(second):
        a, b = first[category], second[category]
        if a + b >= 10:
            cells.append((a, b))
        else:
            rest[0] += a
            rest[1] += b
    if sum(rest):
        cells.append((rest[0], rest[1]))
    chi2 = sum((a * math.sqrt(m / n) - b * math.sqrt(n / m)) ** 2 / (a + b) for a, b in cells)
    return chi2, max(1, len(cells) - 1)


def same_distribution(first: Counter, second: Counter) -> bool:
    """Whether two samples pass the two-sample test at level 0.001."""
    chi2, degrees = two_sample(first, second)
    return chi2 < quantile_999(degrees)
