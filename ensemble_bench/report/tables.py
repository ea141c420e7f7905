"""`ensbench table RUN...`: the rows of any run by its benchmarks, or (``--layout NAME``) our results
in the layout of a paper's table.

Without a layout: one line per row of the runs, a column per benchmark (scores in %), their
average, ms/token (generation), ms/request and ms/scored token (multiple choice) and the row's wall
time. With a layout: the paper rows, their order and the published numbers come from
``paper_numbers.csv``; which of our result rows fills each paper row is the row's declared identity
(``paper_row:`` on a member or a method entry of the recipe), else a name ``layouts.yaml`` lists for
that paper row, else the same name; never a position. Notes under the table say which of the
layout's benchmarks and rows the runs lack and which of the runs' benchmarks the layout leaves out.
Runs are merged by row label (later runs fill cells the earlier ones lack), so one table can gather
several recipes (e.g. one recipe per benchmark). Every score has its 95% interval (report/paired.py:
from the per-example files, else Wilson from the score and its example count): columns
"<benchmark> low" and "<benchmark> high" in CSV, one "<benchmark> 95%" column in Markdown and LaTeX
(escaped: report/latex.py). What says whose number is whose (report/provenance.py): a legend under every
paper-layout table, the column "ensbench row" (our row's label) beside "paper row" (the paper's name),
shots and example counts where the rows of one benchmark differ, and no average over different metrics.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pandas as pd
import yaml

from ensemble_bench.errors import UserError
from ensemble_bench.methods import RunStats
from ensemble_bench.report.paired import row_intervals
from ensemble_bench.report.provenance import (
    NOT_RUN,
    ROW_COLUMN,
    add_setups,
    average_note,
    column_key,
    legend,
    mixed_metrics,
    run_shots,
    setup_frame,
)
from ensemble_bench.report.run_files import ms_per_token, row_wall_seconds, run_hardware
from ensemble_bench.report.summary import finished_recipe, recipe_benchmarks, run_rows
from ensemble_bench.report.table_text import render
from ensemble_bench.report.whitespace_notes import whitespace_warnings
from ensemble_bench.run.folder import is_finished, reading_once

HERE = Path(__file__).parent
EXTRA_BLOCK = "(ours, not in the paper)"
TIMING_COLUMNS = {  # layout column -> (RunStats field, scale)
    "latency_ms_per_token": ("decode_ms_per_token", 1.0),
    "ensembled_pct": ("ensembled_fraction", 100.0),
    "tokens_per_step": ("tokens_manipulated_per_step", 1.0),
}
RUN_TIMING_COLUMNS = {  # column of a table without a layout -> (RunStats field, scale)
    "ms/token": ("decode_ms_per_token", 1.0),
    "ms/request": ("loglikelihood_ms_per_request", 1.0),
    "ms/scored token": ("loglikelihood_ms_per_token", 1.0),
}
WALL_COLUMN = "wall s"
LATENCY_COLUMNS = ("latency_ms_per_token",)  # compared with the paper only on the paper's hardware
NOT_BENCHMARKS = {*TIMING_COLUMNS, *RUN_TIMING_COLUMNS, WALL_COLUMN, "avg", "threshold", "avg_perplexity"}


@dataclass
class OurRow:
    """One of our result rows, merged over runs: column key -> value."""

    label: str
    method: str
    paper_row: str | None = None  # the recipe's declared identity of the row (``paper_row:``)
    values: dict[str, float] = field(default_factory=dict)
    examples: dict[str, int] = field(default_factory=dict)
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)  # column -> (low, high) in %
    shots: dict[str, int | None] = field(default_factory=dict)  # column -> few-shot examples per prompt


@dataclass
class OurRuns:
    """Our rows by label, the benchmark columns of the runs (in recipe order) and the hardware they ran on."""

    rows: dict[str, OurRow] = field(default_factory=dict)
    benchmarks: list[str] = field(default_factory=list)
    hardware: set[str] = field(default_factory=set)
    kept_apart: list[str] = field(default_factory=list)  # one line per label two runs measured on one benchmark
    metrics: dict[str, str] = field(default_factory=dict)  # benchmark column -> its metric (acc, exact_match ...)
    warnings: list[str] = field(default_factory=list)  # the summaries' warnings (answers wrong by whitespace)

    def row_for(self, label: str, method: str, declared: str | None, run_dir: Path, columns: list[str]) -> OurRow:
        """The merged row a run's row goes into: the row of its label, unless an earlier run already
        holds one of its benchmarks; then a row of its own, labelled with its run (never mixed)."""
        merged = self.rows.get(label)
        if merged is not None and any(column in merged.examples for column in columns):
            apart = f"{label} ({run_dir.parent.name}/{run_dir.name})"
            self.kept_apart.append(f"'{label}' is in several runs with the same benchmarks: shown apart, as '{apart}'")
            label = apart
        return self.rows.setdefault(label, OurRow(label, method, declared))


@dataclass(frozen=True)
class Layout:
    name: str
    title: str
    columns: list[str]
    rows: dict[str, list[str]]
    hardware: str | None = None  # where the paper timed its latency, when the paper says

    @property
    def benchmark_columns(self) -> list[str]:
        return [c for c in self.columns if c not in NOT_BENCHMARKS]


@cache
def layouts() -> dict[str, Layout]:
    data = yaml.safe_load((HERE / "layouts.yaml").read_text())
    return {name: Layout(name, spec["title"], spec["columns"], spec.get("rows") or {}, spec.get("hardware"))
            for name, spec in data.items()}


def get_layout(name: str) -> Layout:
    if name not in layouts():
        raise UserError(f"unknown layout '{name}' (known: {', '.join(layouts())})")
    return layouts()[name]


@cache
def paper_numbers() -> pd.DataFrame:
    return pd.read_csv(HERE / "paper_numbers.csv", dtype={"block": str}).fillna({"block": ""})


def paper_rows(layout: Layout) -> list[tuple[str, str]]:
    """(block, row) of the paper's table, in the paper's order."""
    numbers = paper_numbers()
    found = numbers[numbers.layout == layout.name]
    return list(dict.fromkeys(zip(found.block, found.row)))


@cache
def _paper_cells() -> dict[tuple[str, str, str, str], float]:
    numbers = paper_numbers()
    return {(name, b, r, c): float(v) for name, b, r, c, v in
            zip(numbers.layout, numbers.block, numbers.row, numbers.column, numbers.value)}


def paper_value(layout: Layout, block: str, row: str, column: str) -> float | None:
    return _paper_cells().get((layout.name, block, row, column))


# --- our rows ---------------------------------------------------------------------------------
def resolve_run(path: Path) -> Path:
    """A finished run folder, or the newest finished run under a recipe's results folder."""
    if is_finished(path):
        return path
    runs = sorted(p for p in path.glob("*/") if is_finished(p)) if path.is_dir() else []
    if not runs:
        raise UserError(f"{path}: neither a finished ensbench run nor a folder holding one")
    return runs[-1]


def collect_rows(run_dirs: list[Path]) -> OurRuns:
    """Our rows by label (merged over runs), the runs' benchmarks and hardware."""
    ours = OurRuns()
    with reading_once():
        for run_dir in map(resolve_run, run_dirs):
            _collect_run(ours, run_dir)
    return ours


def _collect_run(ours: OurRuns, run_dir: Path) -> None:
    """Add one run's rows, benchmarks and hardware to ``ours``."""
    recipe = finished_recipe(run_dir)
    benches = recipe_benchmarks(run_dir, recipe)
    found = run_rows(run_dir, recipe)
    intervals = row_intervals(run_dir, found, benches)
    ours.warnings += [f"warning: {line}" for line in whitespace_warnings(run_dir, [row.plan.label for row in found])]
    ours.benchmarks += [key for key in map(column_key, (b.name for b in benches)) if key not in ours.benchmarks]
    ours.metrics.update({column_key(b.name): b.primary_metric.split(",")[0] for b in benches})
    shots = run_shots(run_dir, recipe, benches)
    ours.hardware.add(run_hardware(run_dir, recipe))
    for row in found:
        plan = row.plan
        declared = recipe.members[plan.members[0]].paper_row if plan.spec is None else \
            recipe.ensembles[plan.spec].paper_row
        merged = ours.row_for(plan.label, plan.method, declared, run_dir, list(map(column_key, row.scores)))
        _add_scores(merged, row, intervals)
        merged.shots.update({column: shots.get(column) for column in map(column_key, row.scores)})
        _add_timing(merged, row.stats, run_dir / plan.label)
        if plan.spec is not None:
            params = {**recipe.ensembles[plan.spec].params, **dict(plan.overrides)}
            if params.get("threshold") is not None:
                merged.values["threshold"] = params["threshold"]


def _add_scores(merged: OurRow, row, intervals: dict) -> None:
    for name, (score, examples) in row.scores.items():
        merged.values[column_key(name)] = 100 * score
        merged.examples[column_key(name)] = examples
        interval = intervals.get((row.plan.label, name))
        if interval is not None:
            merged.intervals[column_key(name)] = (100 * interval.low, 100 * interval.high)


def _add_timing(merged: OurRow, stats: RunStats, row_dir: Path) -> None:
    values = {**vars(stats), "decode_ms_per_token": ms_per_token(stats)}  # a row of one round: that round's
    for column, (key, scale) in {**TIMING_COLUMNS, **RUN_TIMING_COLUMNS}.items():
        if values.get(key) is not None:
            merged.values[column] = scale * values[key]
    wall = row_wall_seconds(row_dir)
    if wall is not None:
        merged.values[WALL_COLUMN] = wall


def _with_average(layout: Layout, row: OurRow, metrics: dict[str, str]) -> dict[str, float]:
    """The row's values and, when the layout has ``avg`` and every benchmark of it is measured with one
    metric, their mean."""
    values = dict(row.values)
    benchmarks = [values.get(c) for c in layout.benchmark_columns]
    if "avg" in layout.columns and benchmarks and all(v is not None for v in benchmarks) \
            and not mixed_metrics(layout.benchmark_columns, metrics):
        values["avg"] = sum(benchmarks) / len(benchmarks)
    return values


def _normalised(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _match(layout: Layout, block: str, row: str, rows: dict[str, OurRow]) -> str | None:
    """Our row for a paper row: the one declaring it (``paper_row:``, as "ROW" or "BLOCK / ROW"), else
    the first of the layout's names for it that we have, else one of the same name."""
    declared = [label for label, ours in rows.items() if ours.paper_row in (row, f"{block} / {row}")]
    if declared:
        return declared[0]
    candidates = layout.rows.get(f"{block} / {row}") or layout.rows.get(row) or []
    named = [label for label in candidates if label in rows and rows[label].paper_row is None]
    if named:
        return named[0]
    same = [label for label, ours in rows.items() if _normalised(label) == _normalised(row) and ours.paper_row is None]
    return same[0] if same else None


# --- the table ----------------------------------------------------------------------------------
def build_table(layout: Layout, run_dirs: list[Path], with_paper: bool = False,
                block: str | None = None) -> pd.DataFrame:
    """One line per paper row (ours beside it, or "not run"), then our unmatched rows; the notes
    (``frame.attrs["notes"]``) say what the runs lack and what the layout leaves out."""
    return layout_table(layout, collect_rows(run_dirs), with_paper, block)


def layout_table(layout: Layout, ours: OurRuns, with_paper: bool = False, block: str | None = None) -> pd.DataFrame:
    """The table of :func:`build_table` from rows already gathered (from runs, or from a table's CSV:
    report/from_csv.py)."""
    rows = ours.rows
    slots = [(b, r) for b, r in paper_rows(layout) if block is None or b == block]
    if block is not None and not slots:
        blocks = sorted({b for b, _ in paper_rows(layout)})
        raise UserError(f"layout '{layout.name}' has no block '{block}' (blocks: {', '.join(blocks)})")
    same_hardware = _same_hardware(layout, ours.hardware)
    used: set[str] = set()
    records = []
    for slot_block, paper_row in slots:
        label = _match(layout, slot_block, paper_row, rows)
        if label in used:
            label = None  # one of our rows fills one paper row
        used.add(label)
        values = _with_average(layout, rows[label], ours.metrics) if label else {}
        intervals = rows[label].intervals if label else {}
        records.append(_record(layout, slot_block, paper_row, label, values, with_paper, intervals, same_hardware))
    for label, row in rows.items():
        if label not in used:
            records.append(_record(layout, EXTRA_BLOCK, "", label, _with_average(layout, row, ours.metrics), False,
                                   row.intervals))
    labels = [record[ROW_COLUMN] for record in records]
    setup_notes = add_setups(records, layout.benchmark_columns, [rows.get(label) for label in labels])
    frame = setup_frame(records)
    averaged = average_note(layout.benchmark_columns, ours.metrics) if "avg" in layout.columns else []
    frame.attrs["notes"] = [legend(with_paper), *_layout_notes(layout, ours, frame, with_paper and not same_hardware,
                                                               [*setup_notes, *averaged])]
    return frame


def _same_hardware(layout: Layout, hardware: set[str]) -> bool:
    """Whether every run timed its rows on the hardware the paper names (unknown: no)."""
    return layout.hardware is not None and all(layout.hardware.lower() in h.lower() for h in hardware)


def _layout_notes(layout: Layout, ours: OurRuns, frame: pd.DataFrame, latency_apart: bool,
                  setup: list[str]) -> list[str]:
    """One line each: the layout's benchmarks and rows the runs lack, the runs' benchmarks the
    layout leaves out, the ``setup`` lines (shots, examples, the average), and a latency difference left out."""
    measured = {key for row in ours.rows.values() for key in row.values}
    lacking = [c for c in layout.benchmark_columns if c not in measured]
    missing = [(block, row) for block, row, label in zip(frame["block"], frame["paper row"], frame[ROW_COLUMN])
               if label == NOT_RUN]
    blocks = {block for block in frame["block"] if block != EXTRA_BLOCK}
    not_run = [f"{block} / {row}" if len(blocks) > 1 else row for block, row in missing]
    dropped = [b for b in ours.benchmarks if b not in layout.columns]
    notes = [f"benchmarks of this layout the runs lack: {', '.join(lacking)}" if lacking else "",
             f"rows of this layout the runs lack: {', '.join(not_run)}" if not_run else "",
             f"benchmarks of the runs this layout leaves out: {', '.join(dropped)}" if dropped else "", *setup]
    if latency_apart and any(c in layout.columns for c in LATENCY_COLUMNS):
        paper = layout.hardware or "hardware this layout does not record"
        notes.append(f"latency: no difference to the paper's, which was timed on {paper}; these runs: "
                     f"{', '.join(sorted(ours.hardware))}")
    return [note for note in notes if note] + ours.kept_apart + ours.warnings


def _record(layout: Layout, block: str, paper_row: str, label: str | None, values: dict, with_paper: bool,
            intervals: dict[str, tuple[float, float]], same_hardware: bool = False) -> dict:
    record = {"block": block, "paper row": paper_row, ROW_COLUMN: label or NOT_RUN}
    for column in layout.columns:
        ours = values.get(column)
        record[column] = round(ours, 2) if ours is not None else (None if label else NOT_RUN)
        if column in layout.benchmark_columns:
            record.update(_interval_cells(column, intervals))
        if with_paper:
            published = paper_value(layout, block, paper_row, column) if paper_row else None
            comparable = ours is not None and published is not None and (same_hardware or column not in LATENCY_COLUMNS)
            record[f"{column} (paper)"] = published
            record[f"{column} Δ"] = round(ours - published, 2) if comparable else None
    return record


def _interval_cells(column: str, intervals: dict[str, tuple[float, float]]) -> dict[str, float | None]:
    low, high = intervals.get(column, (None, None))
    return {f"{column} low": round(low, 1) if low is not None else None,
            f"{column} high": round(high, 1) if high is not None else None}


def run_layout(ours: OurRuns, title: str) -> Layout:
    """The columns of a table without a paper layout: the runs' benchmarks, their average (two or
    more), and the timing columns some row has."""
    measured = {key for row in ours.rows.values() for key in row.values}
    timing = [c for c in (*RUN_TIMING_COLUMNS, WALL_COLUMN) if c in measured]
    average = ["avg"] if len(ours.benchmarks) > 1 and not mixed_metrics(ours.benchmarks, ours.metrics) else []
    return Layout("run", title, [*ours.benchmarks, *average, *timing], {})


def build_run_table(run_dirs: list[Path]) -> tuple[pd.DataFrame, Layout]:
    """Every row of the runs by every benchmark of theirs, with intervals and latency; its layout."""
    ours = collect_rows(run_dirs)
    names = [resolve_run(run).parent.name for run in run_dirs]
    layout = run_layout(ours, "Results of " + ", ".join(dict.fromkeys(names)))
    records = []
    for label, row in ours.rows.items():
        values = _with_average(layout, row, ours.metrics)
        record = {"row": label, "method": row.method}
        for column in layout.columns:
            record[column] = round(values[column], 2) if values.get(column) is not None else None
            if column in layout.benchmark_columns:
                record.update(_interval_cells(column, row.intervals))
        records.append(record)
    setup_notes = add_setups(records, layout.benchmark_columns, list(ours.rows.values()))
    frame = setup_frame(records)
    averaged = average_note(ours.benchmarks, ours.metrics) if len(ours.benchmarks) > 1 else []
    frame.attrs["notes"] = _run_notes(layout) + setup_notes + averaged + ours.kept_apart + ours.warnings
    return frame, layout


def _run_notes(layout: Layout) -> list[str]:
    notes = {"ms/token": "ms/token: decode time per generated token (per step at the run's batch size)",
             "ms/request": "ms/request, ms/scored token: time to score one multiple-choice option, and per token "
                           "of the options (the first member's tokens)",
             WALL_COLUMN: "wall s: the row's evaluation time, every benchmark together"}
    return [note for column, note in notes.items() if column in layout.columns]


def make_table(run_dirs: list[Path], layout_name: str | None, with_paper: bool = False,
               block: str | None = None) -> tuple[pd.DataFrame, Layout]:
    """The table ``ensbench table`` writes, and the layout it is in (a paper's, or the runs' own)."""
    if layout_name is None:
        if with_paper or block is not None:
            raise UserError("--paper and --block need a paper layout (--layout NAME)")
        return build_run_table(run_dirs)
    layout = get_layout(layout_name)
    return build_table(layout, run_dirs, with_paper=with_paper, block=block), layout


__all__ = ["EXTRA_BLOCK", "NOT_RUN", "ROW_COLUMN", "Layout", "OurRow", "OurRuns", "build_run_table",
           "build_table", "collect_rows", "get_layout", "layout_table", "layouts", "make_table", "paper_numbers",
           "paper_rows", "render", "resolve_run"]
