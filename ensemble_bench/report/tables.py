"""`ensbench table RUN... --layout NAME`: our results in the layout of a paper's table.

The paper rows, their order and the published numbers come from ``paper_numbers.csv``; which of
our result rows fills each paper row comes from ``layouts.yaml``. Runs are merged by row label
(later runs fill cells the earlier ones lack), so one table can gather several recipes (e.g. one
recipe per benchmark). Scores are in %, latency in ms/token. Every score has its 95% interval
(report/paired.py: from the per-example files, else Wilson from the score and its example count):
columns "<benchmark> low" and "<benchmark> high" in CSV, one "<benchmark> 95%" column in Markdown
and LaTeX.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pandas as pd
import yaml

from ensemble_bench.errors import UserError
from ensemble_bench.report.paired import row_intervals
from ensemble_bench.report.summary import DONE_FILE, finished_recipe, run_rows
from ensemble_bench.tasks import get_benchmark

HERE = Path(__file__).parent
NOT_RUN = "not run"
EXTRA_BLOCK = "(ours, not in the paper)"
TIMING_COLUMNS = {  # layout column -> (timing.json key, scale)
    "latency_ms_per_token": ("decode_ms_per_token", 1.0),
    "ensembled_pct": ("ensembled_fraction", 100.0),
    "tokens_per_step": ("tokens_manipulated_per_step", 1.0),
}


@dataclass
class OurRow:
    """One of our result rows, merged over runs: column key -> value."""

    label: str
    method: str
    values: dict[str, float] = field(default_factory=dict)
    examples: dict[str, int] = field(default_factory=dict)
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)  # column -> (low, high) in %


@dataclass(frozen=True)
class Layout:
    name: str
    title: str
    columns: list[str]
    rows: dict[str, list[str]]

    @property
    def benchmark_columns(self) -> list[str]:
        return [c for c in self.columns if c not in TIMING_COLUMNS and c not in ("avg", "threshold", "avg_perplexity")]


@cache
def layouts() -> dict[str, Layout]:
    data = yaml.safe_load((HERE / "layouts.yaml").read_text())
    return {name: Layout(name, spec["title"], spec["columns"], spec.get("rows") or {}) for name, spec in data.items()}


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
    return {(l, b, r, c): float(v) for l, b, r, c, v in
            zip(numbers.layout, numbers.block, numbers.row, numbers.column, numbers.value)}


def paper_value(layout: Layout, block: str, row: str, column: str) -> float | None:
    return _paper_cells().get((layout.name, block, row, column))


# --- our rows ---------------------------------------------------------------------------------
def resolve_run(path: Path) -> Path:
    """A finished run folder, or the newest finished run under a recipe's results folder."""
    if (path / DONE_FILE).exists():
        return path
    runs = sorted(p for p in path.glob("*/") if (p / DONE_FILE).exists()) if path.is_dir() else []
    if not runs:
        raise UserError(f"{path}: neither a finished ensbench run nor a folder holding one")
    return runs[-1]


def _column_key(benchmark: str) -> str:
    return benchmark.replace("-", "_")


def collect_rows(run_dirs: list[Path]) -> tuple[dict[str, OurRow], dict[str, str]]:
    """Our rows by label (merged over runs), and the position aliases member:I / entry:I."""
    rows: dict[str, OurRow] = {}
    aliases: dict[str, str] = {}
    for run_dir in map(resolve_run, run_dirs):
        recipe = finished_recipe(run_dir)
        found = run_rows(run_dir, recipe)
        intervals = row_intervals(run_dir, found, [get_benchmark(t.name, t.variant) for t in recipe.tasks])
        for row in found:
            plan = row.plan
            ours = rows.setdefault(plan.label, OurRow(plan.label, plan.method))
            for name, (score, examples) in row.scores.items():
                ours.values[_column_key(name)] = 100 * score
                ours.examples[_column_key(name)] = examples
                interval = intervals.get((plan.label, name))
                if interval is not None:
                    ours.intervals[_column_key(name)] = (100 * interval.low, 100 * interval.high)
            for column, (key, scale) in TIMING_COLUMNS.items():
                if row.timing.get(key) is not None:
                    ours.values[column] = scale * row.timing[key]
            if plan.spec is not None:
                params = {**recipe.ensembles[plan.spec].params, **dict(plan.overrides)}
                if params.get("threshold") is not None:
                    ours.values["threshold"] = params["threshold"]
                aliases.setdefault(f"entry:{plan.spec}", plan.label)
            else:
                aliases.setdefault(f"member:{plan.members[0]}", plan.label)
    return rows, aliases


def _with_average(layout: Layout, row: OurRow) -> dict[str, float]:
    values = dict(row.values)
    benchmarks = [values.get(c) for c in layout.benchmark_columns]
    if "avg" in layout.columns and benchmarks and all(v is not None for v in benchmarks):
        values["avg"] = sum(benchmarks) / len(benchmarks)
    return values


def _normalised(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _match(layout: Layout, block: str, row: str, rows: dict[str, OurRow], aliases: dict[str, str]) -> str | None:
    candidates = layout.rows.get(f"{block} / {row}") or layout.rows.get(row) or []
    for candidate in candidates:
        label = aliases.get(candidate, candidate)
        if label in rows:
            return label
    same = [label for label in rows if _normalised(label) == _normalised(row)]
    return same[0] if same else None


# --- the table ----------------------------------------------------------------------------------
def build_table(layout: Layout, run_dirs: list[Path], with_paper: bool = False,
                block: str | None = None) -> pd.DataFrame:
    """One line per paper row (ours beside it, or "not run"), then our unmatched rows."""
    rows, aliases = collect_rows(run_dirs)
    slots = [(b, r) for b, r in paper_rows(layout) if block is None or b == block]
    if block is not None and not slots:
        blocks = sorted({b for b, _ in paper_rows(layout)})
        raise UserError(f"layout '{layout.name}' has no block '{block}' (blocks: {', '.join(blocks)})")
    used: set[str] = set()
    records = []
    for slot_block, paper_row in slots:
        label = _match(layout, slot_block, paper_row, rows, aliases)
        if label in used:
            label = None  # one of our rows fills one paper row
        used.add(label)
        values = _with_average(layout, rows[label]) if label else {}
        intervals = rows[label].intervals if label else {}
        records.append(_record(layout, slot_block, paper_row, label, values, with_paper, intervals))
    for label, row in rows.items():
        if label not in used:
            records.append(_record(layout, EXTRA_BLOCK, "", label, _with_average(layout, row), False, row.intervals))
    return pd.DataFrame.from_records(records)


def _record(layout: Layout, block: str, paper_row: str, label: str | None, values: dict, with_paper: bool,
            intervals: dict[str, tuple[float, float]]) -> dict:
    record = {"block": block, "paper row": paper_row, "ours": label or NOT_RUN}
    for column in layout.columns:
        ours = values.get(column)
        record[column] = round(ours, 2) if ours is not None else (None if label else NOT_RUN)
        if column in layout.benchmark_columns:
            low, high = intervals.get(column, (None, None))
            record[f"{column} low"] = round(low, 1) if low is not None else None
            record[f"{column} high"] = round(high, 1) if high is not None else None
        if with_paper:
            published = paper_value(layout, block, paper_row, column) if paper_row else None
            record[f"{column} (paper)"] = published
            record[f"{column} Δ"] = round(ours - published, 2) if ours is not None and published is not None else None
    return record


def _beside_paper(frame: pd.DataFrame, layout: Layout) -> pd.DataFrame:
    """One cell per column for reading: "ours / paper (Δ)" (CSV keeps three columns)."""
    def cell(ours, published, delta) -> str:
        ours = "" if ours is None or ours != ours else str(ours)
        if published is None or published != published:
            return ours
        return f"{ours or '–'} / {published:g}" + (f" ({delta:+.2f})" if delta == delta and delta is not None else "")

    merged = frame[["block", "paper row", "ours"]].copy()
    for column in layout.columns:
        merged[column] = [cell(*values) for values in
                          zip(frame[column], frame[f"{column} (paper)"], frame[f"{column} Δ"])]
        if column in layout.benchmark_columns:
            merged[f"{column} low"], merged[f"{column} high"] = frame[f"{column} low"], frame[f"{column} high"]
    return merged


def _interval_columns(frame: pd.DataFrame, layout: Layout) -> pd.DataFrame:
    """For reading: each benchmark's low and high columns become one "<benchmark> 95%" column."""
    shown = frame.astype(object).where(frame.notna(), None)
    for column in layout.benchmark_columns:
        low, high = f"{column} low", f"{column} high"
        if low not in shown:
            continue
        cells = [f"[{lo:.1f}, {hi:.1f}]" if lo is not None and hi is not None else None
                 for lo, hi in zip(shown[low], shown[high])]
        shown = shown.drop(columns=[low, high])
        if any(cells):
            shown.insert(shown.columns.get_loc(column) + 1, f"{column} 95%", cells)
    return shown


def render(frame: pd.DataFrame, layout: Layout, fmt: str) -> str:
    if fmt == "csv":
        return frame.to_csv(index=False)
    if f"{layout.columns[0]} (paper)" in frame.columns:
        frame = _beside_paper(frame, layout)
    frame = _interval_columns(frame, layout)
    shown = frame.astype(object).where(frame.notna(), "")
    if fmt == "latex":
        return shown.to_latex(index=False, caption=layout.title, label=f"tab:{layout.name}")
    return f"### {layout.title}\n\n" + shown.to_markdown(index=False) + "\n"
