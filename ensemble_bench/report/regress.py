"""`ensbench regress`: compare a finished run with a stored baseline run of the same recipe.

Accuracy: for every row and benchmark, a drop counts as a regression when it exceeds z times the
standard error of the difference of two binomial proportions, z * sqrt(p (1 - p) (1/n_base +
1/n_now)) with p the baseline score (floored at 0.5/n so a perfect or zero score still has an
interval), z from the confidence level (default 0.95, one-sided: 1.645). Identical greedy runs
give identical scores and always pass.

Latency: absolute times are noise on shared machines, so each ensemble row's ms/token is divided
by the sum of the single-member rows' ms/token of the SAME run; a regression is a ratio above
the baseline's ratio x (1 + tolerance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

from ensemble_bench.report.summary import run_rows


@dataclass(frozen=True)
class RowFacts:
    method: str
    scores: dict[str, tuple[float, int]]  # benchmark -> (score 0..1, examples)
    ms_per_token: float | None


@dataclass(frozen=True)
class Check:
    row: str
    what: str          # a benchmark name, or "latency ratio"
    baseline: float
    current: float
    allowed: float     # the worst current value that still passes
    passed: bool


def load_rows(run_dir: Path) -> dict[str, RowFacts]:
    return {row.plan.label: RowFacts(row.plan.method, row.scores, row.timing.get("decode_ms_per_token"))
            for row in run_rows(run_dir)}


def latency_ratios(rows: dict[str, RowFacts]) -> dict[str, float]:
    """Each ensemble row's ms/token over the sum of the single rows' ms/token of the same run."""
    singles = [r.ms_per_token for r in rows.values() if r.method == "single" and r.ms_per_token]
    if not singles:
        return {}
    return {label: r.ms_per_token / sum(singles) for label, r in rows.items()
            if r.method != "single" and r.ms_per_token}


def accuracy_floor(baseline: float, n_base: int, n_now: int, confidence: float) -> float:
    z = NormalDist().inv_cdf(confidence)
    p = min(max(baseline, 0.5 / n_base), 1 - 0.5 / n_base)
    return baseline - z * math.sqrt(p * (1 - p) * (1 / n_base + 1 / n_now))


def compare(current: dict[str, RowFacts], baseline: dict[str, RowFacts], confidence: float = 0.95,
            latency_tolerance: float = 0.25) -> list[Check]:
    checks = []
    for label, base in baseline.items():
        now = current.get(label)
        for bench, (base_score, base_n) in base.scores.items():
            if now is None or bench not in now.scores:
                checks.append(Check(label, bench, base_score, math.nan, base_score, False))
                continue
            score, n = now.scores[bench]
            floor = accuracy_floor(base_score, base_n, n, confidence)
            checks.append(Check(label, bench, base_score, score, floor, score >= floor))
    base_ratios, now_ratios = latency_ratios(baseline), latency_ratios(current)
    for label, base_ratio in base_ratios.items():
        ratio = now_ratios.get(label, math.nan)
        ceiling = base_ratio * (1 + latency_tolerance)
        checks.append(Check(label, "latency ratio", base_ratio, ratio, ceiling, ratio <= ceiling))
    return checks
