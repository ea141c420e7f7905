"""A span-length sweep in the layout of SweetSpan Table 7 (members, then Span-N rows, each score
with its difference to the best member), (the accuracy-vs-span-length plot is ``plots.plot_parameter``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ensemble_bench.methods import is_alone
from ensemble_bench.report.plots import parameter_records


def sweep_records(run_dirs: list[Path]) -> list[dict]:
    """The members alone and the rows that set ``span_words`` (SweetSpan's), those labelled Span-N."""
    records = [r for r in parameter_records(run_dirs, "span_words")
               if r["value"] is not None or is_alone(r["method"])]
    return [{**r, "label": f"Span-{r['value']}"} if r["value"] is not None else r for r in records]


def timed_by(records: list[dict], timing_records: list[dict]) -> list[dict]:
    """The records with ms/token taken from another run's rows of the same labels (None where that
    run lacks the row): for a sweep computed in several sittings, whose own timing covers only the
    last one, beside a short run that timed every row under the same conditions."""
    timed = {r["label"]: r["ms_per_token"] for r in timing_records}
    return [{**r, "ms_per_token": timed.get(r["label"])} for r in records]


def sweep_table(records: list[dict]) -> pd.DataFrame:
    """Members first, then Span-N by N; each cell 'score (+diff to the best member)' and beside it
    the score's 95% interval; the benchmarks the sweep covers."""
    benches = sorted({b for r in records if r["value"] is not None for b in r["scores"]})
    members = [r for r in records if r["value"] is None]
    spans = sorted((r for r in records if r["value"] is not None), key=lambda r: r["value"])
    best = {b: max((m["scores"][b] for m in members if b in m["scores"]), default=None) for b in benches}
    rows = []
    for record in members + spans:
        row = {"system": record["label"]}
        for bench in benches:
            value = record["scores"].get(bench)
            if value is None:
                row[bench] = ""
            elif record["value"] is None or best[bench] is None:
                row[bench] = f"{value:.2f}"
            else:
                row[bench] = f"{value:.2f} ({value - best[bench]:+.2f})"
            interval = record.get("intervals", {}).get(bench)
            row[f"{bench} 95%"] = f"[{interval[0]:.1f}, {interval[1]:.1f}]" if value is not None and interval else ""
        row["ms/token"] = f"{record['ms_per_token']:.1f}" if record["ms_per_token"] else ""
        rows.append(row)
    return pd.DataFrame(rows)
