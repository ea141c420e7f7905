"""Run-level statistics: the 95% interval of every row's score and the paired comparison of every
ensemble row with its members, on the per-example files of the same run (report/samples.py).

Without per-example files (a stored baseline keeps none) an interval still comes from the score
and its example count for 0/1 metrics (Wilson); paired statistics need the examples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ensemble_bench.methods import is_alone
from ensemble_bench.report import stats
from ensemble_bench.report.run_files import RunRow
from ensemble_bench.report.samples import Example, corpus_statistic, metric_parts, row_examples
from ensemble_bench.tasks import Benchmark

BINARY_METRICS = ("acc", "acc_norm", "exact_match", "pass_at_1", "pass@1", "pass_at_k", "em")


@dataclass(frozen=True)
class Interval:
    low: float     # 0..1
    high: float
    how: str       # "Wilson", "bootstrap"

    def cell(self, score: float) -> str:
        """``67.0 [57.3, 75.4]`` (in %)."""
        return f"{100 * score:.1f} [{100 * self.low:.1f}, {100 * self.high:.1f}]"


@dataclass(frozen=True)
class MemberComparison:
    member: str
    paired: stats.Paired
    answers_differ: int   # examples where the ensemble's answer is not this member's


@dataclass(frozen=True)
class EnsembleComparison:
    """One ensemble row against its members on one benchmark."""
    row: str
    benchmark: str
    examples: int
    members: list[MemberComparison]
    best_member: str
    oracle: float          # share (mean of the best member's score per example)
    agreement: float       # share of examples where all members answer alike
    # (with a single member: oracle and agreement of the row and that member)
    score: float

    def against(self, member: str) -> MemberComparison:
        return next(m for m in self.members if m.member == member)


def _corpus_items(examples: list[Example]) -> bool:
    return all(isinstance(e.item, list) and len(e.item) == 2 for e in examples)


def examples_score(examples: list[Example], bench: Benchmark) -> float:
    """The benchmark's score over these examples: the corpus statistic (BLEU ...) or the mean."""
    statistic = corpus_statistic(bench)
    if statistic is not None and _corpus_items(examples):
        return statistic([e.item for e in examples])
    return stats.mean([e.score for e in examples])


def interval_of(examples: list[Example], bench: Benchmark) -> Interval:
    statistic = corpus_statistic(bench)
    if statistic is not None and _corpus_items(examples):
        low, high = stats.bootstrap_interval([e.item for e in examples], statistic, iters=200)
        return Interval(low, high, "bootstrap")
    values = [e.score for e in examples]
    low, high = stats.score_interval(values)
    return Interval(low, high, "Wilson" if stats.is_binary(values) else "bootstrap")


def interval_from_score(score: float, n: int, bench: Benchmark) -> Interval | None:
    """Wilson from the aggregate alone (0/1 metrics only): for runs without per-example files."""
    if metric_parts(bench)[0] not in BINARY_METRICS or n <= 0:
        return None
    return Interval(*stats.wilson_interval(score * n, n), "Wilson")


def row_intervals(run_dir: Path, rows: list[RunRow], benches: list[Benchmark]) -> dict[tuple[str, str], Interval]:
    """(row label, benchmark name) -> the 95% interval of that score."""
    found = {}
    for row in rows:
        for bench in benches:
            if bench.name not in row.scores:
                continue
            examples = row_examples(run_dir / row.plan.label, bench)
            interval = (interval_of(examples, bench) if examples else
                        interval_from_score(*row.scores[bench.name], bench))
            if interval is not None:
                found[(row.plan.label, bench.name)] = interval
    return found


def aligned(by_row: dict[str, list[Example]]) -> dict[str, list[Example]]:
    """The rows' examples restricted to the documents every row has, in one order."""
    keys = set.intersection(*({e.key for e in examples} for examples in by_row.values()))
    return {label: sorted((e for e in examples if e.key in keys), key=lambda e: e.key)
            for label, examples in by_row.items()}


def compare_with_members(row: str, members: list[str], by_row: dict[str, list[Example]],
                         bench: Benchmark) -> EnsembleComparison:
    """``row`` against each of ``members`` on the examples all of them have."""
    common = aligned({label: by_row[label] for label in [row, *members]})
    statistic = corpus_statistic(bench) if _corpus_items(common[row]) else None
    scores = {label: [e.score for e in examples] for label, examples in common.items()}
    items = {label: [e.item for e in examples] for label, examples in common.items()}

    def row_score(label: str) -> float:
        return statistic(items[label]) if statistic else stats.mean(scores[label])

    comparisons = [MemberComparison(
        member, stats.paired_test(scores[row], scores[member], statistic, items[row], items[member]),
        sum(a.answer != b.answer for a, b in zip(common[row], common[member]))) for member in members]
    best = max(members, key=row_score)
    pool = members if len(members) > 1 else [row, *members]  # one member alone: the pair itself
    return EnsembleComparison(
        row, bench.name, len(common[row]), comparisons, best,
        stats.oracle_share([scores[m] for m in pool]),
        stats.agreement_share([[e.answer for e in common[m]] for m in pool]), row_score(row))


def member_rows(rows: list[RunRow]) -> dict[int, str]:
    """recipe member index -> the label of its row alone."""
    return {row.plan.members[0]: row.plan.label for row in rows if is_alone(row.plan.method)}


def ensemble_comparisons(run_dir: Path, rows: list[RunRow], benches: list[Benchmark]) -> list[EnsembleComparison]:
    """Every ensemble row against its members' rows, per benchmark with per-example files."""
    alone = member_rows(rows)
    found = []
    for row in rows:
        members = [alone[i] for i in row.plan.members if i in alone]
        if is_alone(row.plan.method) or not members:
            continue
        for bench in benches:
            by_row = {label: row_examples(run_dir / label, bench) for label in [row.plan.label, *members]}
            if any(not examples for examples in by_row.values()):
                continue
            found.append(compare_with_members(row.plan.label, members, by_row, bench))
    return found


def p_text(p: float) -> str:
    return "n/a" if math.isnan(p) else ("<0.001" if p < 0.001 else f"{p:.3f}")


def comparison_records(comparisons: list[EnsembleComparison]) -> list[dict]:
    """One record per (ensemble row, benchmark, member); the best member is marked "(best)"."""
    return [{"row": c.row, "benchmark": c.benchmark,
             "vs": m.member + (" (best)" if m.member == c.best_member else ""), "examples": c.examples,
             "wins": m.paired.wins, "losses": m.paired.losses, "ties": m.paired.ties,
             "p": round(m.paired.p_value, 4), "test": m.paired.test, "answers differ": m.answers_differ,
             "oracle %": round(100 * c.oracle, 1), "members agree %": round(100 * c.agreement, 1)}
            for c in comparisons for m in c.members]
