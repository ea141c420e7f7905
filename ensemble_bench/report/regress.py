"""`ensbench regress`: compare a finished run with a stored baseline run of the same recipe.

Accuracy: for every row and benchmark, a drop counts as a regression when it exceeds z times the
standard error of the difference of two binomial proportions, z * sqrt(p (1 - p) (1/n_base +
1/n_now)) with p the baseline score (floored at 0.5/n so a perfect or zero score still has an
interval), z from the confidence level (default 0.95, one-sided: 1.645). Identical greedy runs
give identical scores and always pass. The z, the standard error and the 95% Wilson interval shown
beside each score come from report/stats.py, the code behind every other table's intervals.

Latency: absolute times are noise on shared machines, so each ensemble row's ms/token is divided
by the sum of the single-member rows' ms/token of the SAME run; a regression is a ratio above
the baseline's ratio x (1 + tolerance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ensemble_bench.methods import is_alone
from ensemble_bench.report import stats
from ensemble_bench.report.summary import run_rows

# recipe fields that do not change the numbers: names, the output folder, where members run
NEUTRAL_FIELDS = {"name", "description", "output", "placement"}
NEUTRAL_MEMBER_FIELDS = {"num_gpus", "num_cpus", "resources", "paper_row"}
NEUTRAL_ENTRY_FIELDS = {"paper_row"}  # of a method entry


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
    n_baseline: int = 0  # examples behind an accuracy (0 for latency)
    n_current: int = 0

    def interval(self, which: str) -> tuple[float, float] | None:
        """95% Wilson interval of the baseline's or the current accuracy (None for latency)."""
        score, n = (self.baseline, self.n_baseline) if which == "baseline" else (self.current, self.n_current)
        if n <= 0 or math.isnan(score):
            return None
        return stats.wilson_interval(score * n, n)


def _flat(value, path: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items()
                for k, v in _flat(item, f"{path}.{key}" if path else str(key)).items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in _flat(item, f"{path}[{i}]").items()}
    return {path: value}


def _numbers_fields(recipe) -> dict[str, object]:
    """Every field of a recipe that can change a score or a timing, flattened (members[0].dtype: ...)."""
    dumped = recipe.model_dump(mode="json", exclude=NEUTRAL_FIELDS)
    dumped["members"] = [{k: v for k, v in m.items() if k not in NEUTRAL_MEMBER_FIELDS} for m in dumped["members"]]
    for entry in [dumped.get("method") or {}, *(dumped.get("methods") or [])]:
        for key in NEUTRAL_ENTRY_FIELDS:
            entry.pop(key, None)
    dumped["tasks"] = [{**t, "limit": recipe.task_limit(task)} for t, task in zip(dumped.pop("tasks"), recipe.tasks)]
    dumped.pop("limit")
    return _flat(dumped)


def recipe_difference(current, baseline) -> str | None:
    """The first field in which two recipes differ in a way that changes the numbers, or None."""
    now, base = _numbers_fields(current), _numbers_fields(baseline)
    differing = [k for k in list(dict.fromkeys([*base, *now])) if base.get(k, "(absent)") != now.get(k, "(absent)")]
    if not differing:
        return None
    field = differing[0]
    return f"{field}: {now.get(field, '(absent)')!r} vs the baseline's {base.get(field, '(absent)')!r}"


def load_rows(run_dir: Path) -> dict[str, RowFacts]:
    return {row.plan.label: RowFacts(row.plan.method, row.scores, row.stats.decode_ms_per_token)
            for row in run_rows(run_dir)}


def latency_ratios(rows: dict[str, RowFacts]) -> dict[str, float]:
    """Each ensemble row's ms/token over the sum of the single rows' ms/token of the same run."""
    singles = [r.ms_per_token for r in rows.values() if is_alone(r.method) and r.ms_per_token]
    if not singles:
        return {}
    return {label: r.ms_per_token / sum(singles) for label, r in rows.items()
            if not is_alone(r.method) and r.ms_per_token}


def accuracy_floor(baseline: float, n_base: int, n_now: int, confidence: float) -> float:
    p = min(max(baseline, 0.5 / n_base), 1 - 0.5 / n_base)
    return baseline - stats.z_value(confidence, sides=1) * stats.difference_standard_error(p, n_base, n_now)


def compare(current: dict[str, RowFacts], baseline: dict[str, RowFacts], confidence: float = 0.95,
            latency_tolerance: float = 0.25) -> list[Check]:
    checks = []
    for label, base in baseline.items():
        now = current.get(label)
        for bench, (base_score, base_n) in base.scores.items():
            if now is None or bench not in now.scores:
                checks.append(Check(label, bench, base_score, math.nan, base_score, False, base_n))
                continue
            score, n = now.scores[bench]
            floor = accuracy_floor(base_score, base_n, n, confidence)
            checks.append(Check(label, bench, base_score, score, floor, score >= floor, base_n, n))
    base_ratios, now_ratios = latency_ratios(baseline), latency_ratios(current)
    for label, base_ratio in base_ratios.items():
        ratio = now_ratios.get(label, math.nan)
        ceiling = base_ratio * (1 + latency_tolerance)
        checks.append(Check(label, "latency ratio", base_ratio, ratio, ceiling, ratio <= ceiling))
    return checks
