"""A paper-layout table rendered again from its own CSV, by today's code: the committed tables in
docs/tables/ come from reproduction runs that are no longer at hand, so their numbers are read from the
CSV ``ensbench table --paper`` wrote then, and everything else (the paper's rows and numbers, the
legend, the column names, which differences are shown, the notes) from report/tables.py as it is now.

    python -m ensemble_bench.report.from_csv [CSV ...] [--check]      # default: docs/tables/*.csv

writes each CSV's ``.md``, ``.tex`` and ``.csv`` (the CSV in today's columns; ``--check``: write
nothing, list what is out of date, exit 1 if anything is). The file name says the layout and block, as
scripts/reproduce.py names them (:func:`table_stem`). Each row of ours keeps the paper row the CSV put
it in (its declared identity, as a recipe's ``paper_row:``). What a CSV does not hold (the runs'
hardware, shots and example counts, intervals where it has none, metrics) is named in a note, never
filled in; without the hardware no latency difference to the paper is shown.
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

from ensemble_bench.cache import atomic_write_text
from ensemble_bench.errors import UserError
from ensemble_bench.report.provenance import NOT_RUN, ROW_COLUMN
from ensemble_bench.report.table_text import render
from ensemble_bench.report.tables import Layout, OurRow, OurRuns, layout_table, layouts, paper_rows

TABLES = Path(__file__).resolve().parents[2] / "docs" / "tables"
OFFLINE = "_offline"
FORMATS = {".md": "markdown", ".tex": "latex", ".csv": "csv"}
OLD_ROW_COLUMN = "ours"  # what ensbench table called ROW_COLUMN before it was renamed


def table_stem(layout: str, block: str | None, offline: bool) -> str:
    """``<layout>[-<block>][_offline]``: the name of a reproduced table's files (``gac_table3-openchat_and_solar``)."""
    named = layout + (f"-{re.sub(r'[^a-z0-9]+', '_', block.lower()).strip('_')}" if block else "")
    return named + (OFFLINE if offline else "")


def layout_of(path: Path) -> tuple[Layout, str | None]:
    """The layout and block a table's file name (:func:`table_stem`) names."""
    for name, layout in layouts().items():
        for block in [None, *dict.fromkeys(b for b, _ in paper_rows(layout) if b)]:
            if path.stem in (table_stem(name, block, False), table_stem(name, block, True)):
                return layout, block
    raise UserError(f"{path}: the name names no layout (and block): <layout>[-<block>][{OFFLINE}].csv")


def _number(text: str | None) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):  # empty, or "not run"
        return None


def _our_row(line: dict[str, str], layout: Layout) -> OurRow:
    """One of our rows as the CSV line holds it, its paper row (or the block of ours) its declared identity."""
    label = line.get(ROW_COLUMN) or line[OLD_ROW_COLUMN]
    block, paper_row = line["block"], line["paper row"]
    declared = (f"{block} / {paper_row}" if block else paper_row) if paper_row else block
    row = OurRow(label, method="", paper_row=declared)
    for column in layout.columns:
        if (value := _number(line.get(column))) is not None:
            row.values[column] = value
    for column in layout.benchmark_columns:
        low, high = _number(line.get(f"{column} low")), _number(line.get(f"{column} high"))
        if low is not None and high is not None:
            row.intervals[column] = (low, high)
        examples = _number(line.get(f"{column} n"))
        if examples is not None:
            row.examples[column] = int(examples)
            shots = _number(line.get(f"{column} shots"))
            row.shots[column] = None if shots is None else int(shots)
    return row


def read_rows(path: Path, layout: Layout) -> tuple[OurRuns, bool]:
    """Our rows as the CSV holds them, and whether it has the paper's numbers (written with ``--paper``)."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            lines = list(csv.DictReader(handle))
    except OSError as err:
        raise UserError(f"{path}: cannot read ({err.strerror})") from None
    header = lines[0].keys() if lines else []
    if not {"block", "paper row"} <= set(header) or not {ROW_COLUMN, OLD_ROW_COLUMN} & set(header):
        raise UserError(f"{path}: not a table of ensbench table --layout (no 'block', 'paper row', '{ROW_COLUMN}')")
    found = [_our_row(line, layout) for line in lines if (line.get(ROW_COLUMN) or line[OLD_ROW_COLUMN]) != NOT_RUN]
    ours = OurRuns(rows={row.label: row for row in found}, hardware={f"not recorded in {path.name}"})
    ours.benchmarks = [c for c in layout.benchmark_columns if any(c in row.values for row in found)]
    return ours, any(f"{column} (paper)" in header for column in layout.columns)


def _lacking(path: Path, ours: OurRuns) -> list[str]:
    """The note naming what the CSV does not hold."""
    setups = "shots and example counts" if not any(row.examples for row in ours.rows.values()) else \
        "the shots and example counts of a benchmark whose rows agree"
    missing = ["the runs' hardware", "each benchmark's metric", "the benchmarks the runs had beyond this layout",
               setups]
    if not any(row.intervals for row in ours.rows.values()):
        missing.append("95% intervals")
    return [f"rendered from {path.name} (the numbers of an earlier ensbench table --paper), which does not "
            f"record {', '.join(missing[:-1])} or {missing[-1]}: python -m ensemble_bench.report.from_csv"]


def rendered(path: Path) -> dict[Path, str]:
    """Each file of the table (``.md``, ``.tex``, ``.csv`` beside ``path``) as today's code renders the CSV."""
    layout, block = layout_of(path)
    ours, with_paper = read_rows(path, layout)
    frame = layout_table(layout, ours, with_paper, block)
    frame.attrs["notes"] = [*frame.attrs["notes"], *_lacking(path, ours)]
    return {path.with_suffix(suffix): render(frame, layout, fmt) for suffix, fmt in FORMATS.items()}


def main(argv: list[str]) -> int:
    paths = [Path(arg) for arg in argv if arg != "--check"] or sorted(TABLES.glob("*.csv"))
    try:
        fresh = {target: text for path in paths for target, text in rendered(path).items()}
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stale = [target for target, text in fresh.items()
             if not target.is_file() or target.read_text(encoding="utf-8") != text]
    if "--check" in argv:
        for target in stale:
            print(f"{target}: out of date: run python -m ensemble_bench.report.from_csv")
        return 1 if stale else 0
    for target in stale:
        atomic_write_text(target, fresh[target])
    print(f"rewrote {len(stale)} of {len(fresh)} files")
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
