"""A span-length sweep in the layout of SweetSpan Table 7 (members, then Span-N rows, each score
with its difference to the best member), and the accuracy-vs-span-length plot."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ensemble_bench.report.summary import finished_recipe, row_scores
from ensemble_bench.tasks import get_benchmark


def sweep_records(run_dirs: list[Path]) -> list[dict]:
    """One record per single-member or SweetSpan row of the runs: label, span length (None for the
    members), scores, ms/token. Other rows are left out."""
    records = []
    for run_dir in run_dirs:
        recipe = finished_recipe(run_dir)
        benches = [get_benchmark(t.name, t.variant) for t in recipe.tasks]
        for timing_path in sorted(run_dir.glob("*/timing.json")):
            timing = json.loads(timing_path.read_text())
            if timing.get("method") not in ("single", "sweetspan"):
                continue
            scores = {name: 100 * value for name, (value, _) in row_scores(timing_path.parent, benches).items()}
            span = timing.get("params", {}).get("span_words") if timing.get("method") == "sweetspan" else None
            records.append({"label": f"Span-{span}" if span else timing["label"], "span_words": span,
                            "scores": scores, "ms_per_token": timing.get("decode_ms_per_token")})
    return records


def sweep_table(records: list[dict]) -> pd.DataFrame:
    """Members first, then Span-N by N; each cell 'score (+diff to the best member)'; the benchmarks
    the sweep covers."""
    benches = sorted({b for r in records if r["span_words"] is not None for b in r["scores"]})
    members = [r for r in records if r["span_words"] is None]
    spans = sorted((r for r in records if r["span_words"] is not None), key=lambda r: r["span_words"])
    best = {b: max((m["scores"][b] for m in members if b in m["scores"]), default=None) for b in benches}
    rows = []
    for record in members + spans:
        row = {"system": record["label"]}
        for bench in benches:
            value = record["scores"].get(bench)
            if value is None:
                row[bench] = ""
            elif record["span_words"] is None or best[bench] is None:
                row[bench] = f"{value:.2f}"
            else:
                row[bench] = f"{value:.2f} ({value - best[bench]:+.2f})"
        row["ms/token"] = f"{record['ms_per_token']:.1f}" if record["ms_per_token"] else ""
        rows.append(row)
    return pd.DataFrame(rows)


def plot_sweep(records: list[dict], path_stem: Path, title: str) -> list[Path]:
    """Accuracy vs span length per benchmark, the best member as a dashed line; PNG and SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spans = sorted((r for r in records if r["span_words"] is not None), key=lambda r: r["span_words"])
    members = [r for r in records if r["span_words"] is None]
    benches = sorted({b for r in spans for b in r["scores"]})
    figure, axis = plt.subplots(figsize=(5.5, 3.6))
    for bench in benches:
        xs = [r["span_words"] for r in spans if bench in r["scores"]]
        line, = axis.plot(xs, [r["scores"][bench] for r in spans if bench in r["scores"]], marker="o",
                          label=f"SweetSpan, {bench}")
        best = max((m["scores"][bench] for m in members if bench in m["scores"]), default=None)
        if best is not None:
            axis.axhline(best, linestyle="--", color=line.get_color(), linewidth=1, label=f"best member, {bench}")
    axis.set_xscale("log", base=2)
    axis.set_xticks([r["span_words"] for r in spans], [str(r["span_words"]) for r in spans])
    axis.set_xlabel("span length (words)")
    axis.set_ylabel("score (%)")
    axis.set_ylim(bottom=0)
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=7)
    figure.tight_layout()
    written = []
    for suffix in (".png", ".svg"):
        target = path_stem.with_suffix(suffix)
        target.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(target, dpi=150)
        written.append(target)
    plt.close(figure)
    return written
