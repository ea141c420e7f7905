"""`ensbench compare RUN [RUN ...]`: what the rows of one run (or of several runs) did differently,
example by example.

Per benchmark: each row's score with its 95% interval, the paired comparison (wins / losses / ties,
McNemar exact or paired bootstrap p-value, answers that differ), the members' oracle ceiling and
agreement; then the examples where the rows' answers differ (question, target, each row's answer
and whether it scored; target and answers as Python literals, so that whitespace shows); last, one
line per comparison, so the end of the output says what changed.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field, replace
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
from ensemble_bench.report.whitespace_notes import whitespace_warnings
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
    run_dir: Path | list[Path]  # the run, or the runs compared
    rows: list[str]
    views: list[BenchmarkView]
    warnings: list[str] = field(default_factory=list)  # the summaries' whitespace warnings about these rows


def _pick_rows(rows: list[RunRow], wanted: list[str], runs: int = 1) -> list[RunRow]:
    by_label = {row.plan.label: row for row in rows}
    unknown = [label for label in wanted if label not in by_label]
    if unknown:
        raise UserError(f"unknown row {unknown[0]!r} (rows of {'these runs' if runs > 1 else 'this run'}: "
                        f"{', '.join(by_label)})")
    chosen = [by_label[label] for label in dict.fromkeys(wanted)] if wanted else rows
    if len(chosen) < 2:
        only = f"; this run has one row ({chosen[0].plan.label})" if len(rows) == 1 else ""
        raise UserError(f"compare needs two rows or more (give --row twice, or none for all rows){only}: to compare "
                        "rows of different runs, name each run: ensbench compare RUN OTHER_RUN")
    return chosen


@dataclass(frozen=True)
class RunRows:
    """The rows of the runs compared: each row's folder, by the label it is shown under (a label that
    two runs share is shown as ``<recipe>/<run id>/<label>``)."""

    rows: list[RunRow]
    folders: dict[str, Path]
    benches: list[Benchmark]


def _relabelled(row: RunRow, label: str) -> RunRow:
    return RunRow(replace(row.plan, label=label), row.timing, row.scores)


def _runs_rows(run_dirs: list[Path]) -> RunRows:
    """Every row of ``run_dirs`` and the benchmarks all of them scored (by name, in the first run's order)."""
    found = [(run_dir, run_rows(run_dir, recipe), recipe_benchmarks(run_dir, recipe))
             for run_dir, recipe in ((d, finished_recipe(d)) for d in run_dirs)]
    labels = [row.plan.label for _, rows, _ in found for row in rows]
    rows, folders = [], {}
    for run_dir, run_of, _ in found:
        for row in run_of:
            label = row.plan.label
            shown = label if labels.count(label) == 1 else f"{run_dir.parent.name}/{run_dir.name}/{label}"
            rows.append(_relabelled(row, shown) if shown != label else row)
            folders[shown] = run_dir / label
    names = set.intersection(*({b.name for b in benches} for _, _, benches in found))
    return RunRows(rows, folders, [b for b in found[0][2] if b.name in names])


def _pick_benchmarks(benches: list[Benchmark], name: str | None) -> list[Benchmark]:
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


def _view(folders: dict[str, Path], bench: Benchmark, labels: list[str], pairings) -> BenchmarkView:
    by_row = {label: require_examples(folders[label], bench) for label in labels}
    intervals = {label: (examples_score(ex, bench), interval_of(ex, bench)) for label, ex in by_row.items()}
    comparisons = [compare_with_members(row, others, by_row, bench) for row, others in pairings]
    return BenchmarkView(bench, labels, intervals, comparisons, _differing(by_row),
                         len(aligned(by_row)[labels[0]]))


def build_report(run_dir: Path | list[Path], rows: list[str] | None = None,
                 benchmark: str | None = None) -> CompareReport:
    """The comparison of the rows of one run (each ensemble against its members), or of several runs
    (the first row against the others; documents matched by task and doc id, benchmarks all runs have)."""
    run_dirs = list(dict.fromkeys(run_dir if isinstance(run_dir, list) else [run_dir]))
    found = _runs_rows(run_dirs)
    chosen = _pick_rows(found.rows, rows or [], len(run_dirs))
    benches = _pick_benchmarks(found.benches, benchmark)
    if not benches:
        raise UserError("these runs have no benchmark in common: nothing to compare")
    labels = [row.plan.label for row in chosen]
    pairings = _pairings(chosen, explicit=bool(rows) or len(run_dirs) > 1)
    views = [_view(found.folders, bench, labels, pairings) for bench in benches]
    return CompareReport(run_dirs[0] if len(run_dirs) == 1 else run_dirs, labels, views,
                         _warnings([found.folders[label] for label in labels]))


def _warnings(row_dirs: list[Path]) -> list[str]:
    """The summary's whitespace warnings about these rows, run by run."""
    by_run: dict[Path, list[str]] = {}
    for row_dir in row_dirs:
        by_run.setdefault(row_dir.parent, []).append(row_dir.name)
    return [line for run_dir, labels in by_run.items() for line in whitespace_warnings(run_dir, labels)]


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
    runs = report.run_dir if isinstance(report.run_dir, list) else [report.run_dir]
    lines = [f"# compare {', '.join(map(str, runs))}", "", f"rows: {', '.join(report.rows)}"]
    if report.warnings:
        lines += ["", "## Warnings", "", *(f"- warning: {line}" for line in report.warnings)]
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
