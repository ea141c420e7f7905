"""A table of ``ensbench table`` as text: CSV (numbers, one column per quantity, no notes), or Markdown and
LaTeX for reading (notes under the table): "ours / paper (difference)" in one cell with ``--paper``, each
benchmark's interval as one "<benchmark> 95%" column, its shots and examples as one "<benchmark> setup"
column (where rows differ), label columns left-aligned and number columns right-aligned.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ensemble_bench.report.latex import latex_table
from ensemble_bench.report.provenance import ROW_COLUMN, setup_text

Layout = Any  # a report.tables.Layout (its columns, benchmark_columns, title, name); not imported: no cycle

LABEL_COLUMNS = ("block", "paper row", ROW_COLUMN, "row", "method")  # left-aligned; every other column right


def _beside_paper(frame: pd.DataFrame, layout: Layout) -> pd.DataFrame:
    """One cell per column for reading: "ours / paper (Δ)" (CSV keeps three columns)."""
    def cell(ours, published, delta) -> str:
        ours = "" if ours is None or ours != ours else str(ours)
        if published is None or published != published:
            return ours
        return f"{ours or '–'} / {published:g}" + (f" ({delta:+.2f})" if delta == delta and delta is not None else "")

    merged = frame[["block", "paper row", ROW_COLUMN]].copy()
    for column in layout.columns:
        merged[column] = [cell(*values) for values in
                          zip(frame[column], frame[f"{column} (paper)"], frame[f"{column} Δ"])]
        for extra in (f"{column} low", f"{column} high", f"{column} shots", f"{column} n"):
            if extra in frame:
                merged[extra] = frame[extra]
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


def _setup_columns(frame: pd.DataFrame, layout: Layout) -> pd.DataFrame:
    """For reading: a benchmark's "shots" and "n" columns (there only where its rows differ) become one
    "<benchmark> setup" column (``2-shot, n=10``), right after its score and interval."""
    shown = frame
    for column in layout.benchmark_columns:
        shots, count = f"{column} shots", f"{column} n"
        if shots not in shown:
            continue
        cells = [None if s is None and n is None else setup_text(s, n) for s, n in zip(shown[shots], shown[count])]
        position = shown.columns.get_loc(shots)
        shown = shown.drop(columns=[shots, count])
        shown.insert(position, f"{column} setup", cells)
    return shown


def right_aligned(frame: pd.DataFrame) -> list[bool]:
    """Per column: True for a column of numbers (right-aligned), False for one of labels."""
    return [column not in LABEL_COLUMNS for column in frame.columns]


def render(frame: pd.DataFrame, layout: Layout, fmt: str) -> str:
    """The table as CSV (numbers, no notes), Markdown or LaTeX (notes under the table)."""
    notes = list(frame.attrs.get("notes", []))
    if fmt == "csv":
        return frame.to_csv(index=False)
    if f"{layout.columns[0]} (paper)" in frame.columns:
        frame = _beside_paper(frame, layout)
    frame = _setup_columns(_interval_columns(frame, layout), layout)
    right = right_aligned(frame)
    if fmt == "latex":
        return latex_table(frame, layout.title, f"tab:{layout.name}", notes, right)
    shown = frame.astype(object).where(frame.notna(), "")
    align = ["right" if is_right else "left" for is_right in right]
    under = "".join(f"\n- {note}" for note in notes)
    return (f"### {layout.title}\n\n" + shown.to_markdown(index=False, colalign=align) + "\n"
            + (f"{under}\n" if under else ""))


__all__ = ["LABEL_COLUMNS", "render", "right_aligned"]
