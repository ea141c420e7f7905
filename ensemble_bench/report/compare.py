"""`ensbench compare RUN`: what the rows of one run did differently, example by example.

Per benchmark: each row's score with its 95% interval, the paired comparison (wins / losses / ties,
McNemar exact or paired bootstrap p-value, answers that differ), the members' oracle ceiling and
agreement; then the examples where the rows' answers differ (question, target, each row's answer
and whether it scored; target and answers as Python literals, so that whitespace shows); last, one
line per comparison, so the end of the output says what changed.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from ensemble_bench.errors import UserError
from ensemble_bench.methods import is_alone
from ensemble_bench.report.paired import (
    EnsembleComparison,
    Interval,
    aligned,
    compare_with_members,
    examples_score,
    interval_of,
    member_rows,
    p_text,
)
from ensemble_bench.report.run_files import RunRow
from ensemble_bench.report.samples import Example, require_examples
from ensemble_bench.report.summary import finished_recipe, recipe_benchmarks, run_rows
from ensemble_bench.tasks import Benchmark


@dataclass(frozen=True)
class BenchmarkView:
    bench: Benchmark
    rows: list[str]
    intervals: dict[str, tuple[float, Interval]]   # row -> (score, interval)
    comparisons: list[EnsembleComparison]
    differing: list[dict[str, Example]]               # examples where the rows' answers differ
    examples: int


@dataclass(frozen=True)
class CompareReport:
    run_dir: Path
    rows: list[str]
    views: list[BenchmarkView]


def _pick_rows(rows: list[RunRow], wanted: list[str]) -> list[RunRow]:
    by_label = {row.plan.label: row for row in rows}
    unknown = [label for label in wanted if label not in by_label]
    if unknown:
        raise UserError(f"unknown row {unknown[0]!r} (rows of this run: {', '.join(by_label)})")
    chosen = [by_label[label] for label in dict.fromkeys(wanted)] if wanted else rows
    if len(chosen) < 2:
        raise UserError("compare needs two rows or more (give --row twice, or none for all rows)")
    return chosen


def _pick_benchmarks(run_dir: Path, recipe, name: str | None) -> list[Benchmark]:
    benches = recipe_benchmarks(run_dir, recipe)
    if name is None:
        return benches
    found = [b for b in benches if b.name == name]
    if not found:
        known = ", ".join(b.name for b in benches)
        raise UserError(f"unknown benchmark {name!r} for this run (its benchmarks: {known})")
    return found


def _pairings(chosen: list[RunRow], explicit: bool) -> list[tuple[str, list[str]]]:
    """(row, rows it is compared with): with --row, the first against the others; otherwise every
    ensemble row against its members that are shown (or the first row against the rest)."""
    labels = [row.plan.label for row in chosen]
    if not explicit:
        alone = member_rows(chosen)
        pairs = [(row.plan.label, [alone[i] for i in row.plan.members if i in alone]) for row in chosen
                 if not is_alone(row.plan.method)]
        pairs = [(row, members) for row, members in pairs if members]
        if pairs:
            return pairs
    return [(labels[0], labels[1:])]


def _differing(by_row: dict[str, list[Example]]) -> list[dict[str, Example]]:
    """Examples (all rows have them) where the answers are not all the same; those where the
    scores differ too come first."""
    common = aligned(by_row)
    labels = list(common)
    per_example = [{label: common[label][k] for label in labels} for k in range(len(common[labels[0]]))]
    differing = [ex for ex in per_example if len({e.answer for e in ex.values()}) > 1]
    return sorted(differing, key=lambda ex: len({e.score for e in ex.values()}) == 1)


def _view(run_dir: Path, bench: Benchmark, labels: list[str], pairings) -> BenchmarkView:
    by_row = {label: require_examples(run_dir / label, bench) for label in labels}
    intervals = {label: (examples_score(ex, bench), interval_of(ex, bench)) for label, ex in by_row.items()}
    comparisons = [compare_with_members(row, others, by_row, bench) for row, others in pairings]
    return BenchmarkView(bench, labels, intervals, comparisons, _differing(by_row),
                         len(aligned(by_row)[labels[0]]))


def build_report(run_dir: Path, rows: list[str] | None = None, benchmark: str | None = None) -> CompareReport:
    recipe = finished_recipe(run_dir)
    chosen = _pick_rows(run_rows(run_dir, recipe), rows or [])
    benches = _pick_benchmarks(run_dir, recipe, benchmark)
    labels = [row.plan.label for row in chosen]
    pairings = _pairings(chosen, explicit=bool(rows))
    return CompareReport(run_dir, labels, [_view(run_dir, bench, labels, pairings) for bench in benches])


# --- rendering ----------------------------------------------------------------------------------
def _mark(example: Example) -> str:
    if example.score in (0, 1):
        return "right" if example.score == 1 else "wrong"
    return f"{100 * example.score:.1f}"


def _markdown_table(header: list[str], lines: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(cells) + " |" for cells in lines)]


def _stats_lines(view: BenchmarkView) -> list[str]:
    lines = _markdown_table(["row", "score % [95% interval]", "how"],
                            [[label, interval.cell(score), interval.how]
                             for label, (score, interval) in view.intervals.items()])
    for c in view.comparisons:
        lines += ["", *_markdown_table(
            [f"{c.row} vs", "wins", "losses", "ties", "p", "test", "answers differ"],
            [[m.member + (" (best)" if m.member == c.best_member else ""), str(m.paired.wins),
              str(m.paired.losses), str(m.paired.ties), p_text(m.paired.p_value), m.paired.test,
              f"{m.answers_differ} of {c.examples}"] for m in c.members])]
        lines += ["", f"oracle (some compared row right): {100 * c.oracle:.1f}%; "
                      f"they answer alike on {100 * c.agreement:.1f}% of the examples"]
    return lines


def _example_lines(view: BenchmarkView, show: int) -> list[str]:
    lines = ["", f"Rows answer differently on {len(view.differing)} of {view.examples} examples"
                 + (f"; the first {min(show, len(view.differing))}:" if show and view.differing else ".")]
    for example in view.differing[:show]:
        first = next(iter(example.values()))
        lines += ["", f"- {first.task} doc {first.doc_id}: {first.question}"]
        if first.target:
            lines.append(f"  target: {first.target!r}")
        lines += [f"  - {label}: {e.answer!r} ({_mark(e)})" for label, e in example.items()]
    return lines


def takeaway_lines(report: CompareReport) -> list[str]:
    """A few short lines per comparison: what the ensemble changed, and how sure the numbers are."""
    lines = []
    for view in report.views:
        for c in view.comparisons:
            score, interval = view.intervals[c.row]
            lines.append(f"{view.bench.name}: {c.row} {interval.cell(score)} on {c.examples} examples")
            for m in c.members:
                member_score, member_interval = view.intervals[m.member]
                best = " (best)" if m.member == c.best_member else ""
                lines.append(f"  vs {m.member}{best} {member_interval.cell(member_score)}: {m.answers_differ} "
                             f"answers differ, {m.paired.wins} won / {m.paired.losses} lost, "
                             f"p={p_text(m.paired.p_value)}")
            lines.append(f"  oracle (some of them right) {100 * c.oracle:.1f}%, "
                         f"they answer alike on {100 * c.agreement:.1f}%")
    return lines


def render_markdown(report: CompareReport, show: int) -> str:
    lines = [f"# compare {report.run_dir}", "", f"rows: {', '.join(report.rows)}"]
    for view in report.views:
        lines += ["", f"## {view.bench.name} ({view.bench.primary_metric.split(',')[0]}), "
                      f"{view.examples} examples", "", *_stats_lines(view), *_example_lines(view, show)]
    takeaways = takeaway_lines(report)
    if takeaways:
        lines += ["", "## In short", "", *takeaways]
    return "\n".join(lines) + "\n"


def render_csv(report: CompareReport) -> str:
    """Every differing example (not only the shown ones): one line each, each row's answer and score."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["benchmark", "task", "doc_id", "question", "target",
                     *[f"{label} {what}" for label in report.rows for what in ("answer", "score")]])
    for view in report.views:
        for example in view.differing:
            first = next(iter(example.values()))
            answers = [value for label in report.rows for value in (example[label].answer, example[label].score)]
            writer.writerow([view.bench.name, first.task, first.doc_id, first.question, first.target, *answers])
    return buffer.getvalue()
