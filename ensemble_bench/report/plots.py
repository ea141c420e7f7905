"""`ensbench plot`: accuracy vs latency per row, and accuracy vs one swept method parameter (GaC's
threshold with % ensembled, SweetSpan's span length, UniTE's k). PNG and SVG via matplotlib.
Every score carries its 95% interval as an error bar (report/paired.py). Latency is ms/token
(generation), or ms/request for runs of multiple-choice rows; a row left out of a plot is named in
one warning line on stderr, as are the runs' summary warnings (answers wrong only by whitespace)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

from ensemble_bench.errors import UserError
from ensemble_bench.methods import is_alone
from ensemble_bench.report.out_files import checked_files, write_with
from ensemble_bench.report.paired import row_intervals
from ensemble_bench.report.run_files import ms_per_token
from ensemble_bench.report.summary import finished_recipe, recipe_benchmarks, run_rows
from ensemble_bench.report.tables import resolve_run
from ensemble_bench.report.whitespace_notes import whitespace_warnings
from ensemble_bench.run.folder import reading_once

LOG2_PARAMETERS = ("span_words", "k")
PLOT_SUFFIXES = (".png", ".svg")
LATENCIES = {"ms_per_token": "ms/token", "ms_per_request": "ms/request, multiple choice"}  # preferred first


def warn_on_stderr(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr)


def parameter_records(run_dirs: list[Path], param: str | None = None,
                      warn: Callable[[str], None] = warn_on_stderr) -> list[dict]:
    """One record per row: label, method, the value of ``param`` (None for rows without it, e.g.
    the members alone), scores in % with their 95% intervals, ms/token, ms/request and % ensembled.
    The runs' summary warnings about answers wrong only by whitespace go to ``warn``."""
    records = []
    for run_dir in map(resolve_run, run_dirs):
        recipe = finished_recipe(run_dir)
        with reading_once():
            rows = run_rows(run_dir, recipe)
            intervals = row_intervals(run_dir, rows, recipe_benchmarks(run_dir, recipe))
            for line in whitespace_warnings(run_dir, [row.plan.label for row in rows]):
                warn(line)
        for row in rows:
            stats = row.stats
            fraction = stats.ensembled_fraction
            records.append({
                "label": row.plan.label, "method": row.plan.method,
                "value": stats.params.get(param) if param and not is_alone(row.plan.method) else None,
                "scores": {name: 100 * v for name, (v, _) in row.scores.items()},
                "intervals": {name: (100 * i.low, 100 * i.high) for (label, name), i in intervals.items()
                              if label == row.plan.label},
                "ms_per_token": ms_per_token(stats),
                "ms_per_request": stats.loglikelihood_ms_per_request,
                "ensembled_pct": 100 * fraction if fraction is not None else None})
    return records


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def error_bar(score: float, interval: tuple[float, float] | None) -> tuple[float, float]:
    """(below, above) the score: the distances to its interval's ends (0, 0 without one)."""
    if interval is None:
        return (0.0, 0.0)
    return (max(0.0, score - interval[0]), max(0.0, interval[1] - score))


def mean_error_bar(record: dict, benchmarks: list[str]) -> tuple[float, float]:
    """Error bar of the mean over benchmarks: each side's half-widths combined as independent
    normal errors, sqrt(sum w_i^2) / k."""
    bars = [error_bar(record["scores"][b], record.get("intervals", {}).get(b)) for b in benchmarks]
    return tuple(math.sqrt(sum(bar[side] ** 2 for bar in bars)) / len(bars) for side in (0, 1))


def _save(figure, path_stem: Path) -> list[Path]:
    """``<stem>.png`` and ``<stem>.svg``, both checked before either is written, each atomically."""
    written = checked_files(path_stem, PLOT_SUFFIXES)
    for target in written:
        kind = target.suffix[1:]  # the temporary name ends in .partial: say the format
        write_with(target, lambda partial, kind=kind: figure.savefig(partial, dpi=150, format=kind))
    return written


def plot_parameter(records: list[dict], param: str, path_stem: Path, title: str,
                   warn: Callable[[str], None] = warn_on_stderr) -> list[Path]:
    """Score vs the parameter per benchmark, the best member dashed; % ensembled (if recorded and
    not always 100) on a second axis."""
    for record in records:
        if record["value"] is not None and not record["scores"]:
            warn(f"row {record['label']} is left out of the plot: it has no score")
    swept = sorted((r for r in records if r["value"] is not None and r["scores"]), key=lambda r: r["value"])
    if not swept:
        raise UserError(f"no row of the runs sets '{param}' (sweep it in a recipe: sweep: {{{param}: [...]}})")
    members = [r for r in records if is_alone(r["method"])]
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(5.5, 3.6))
    for bench in sorted({b for r in swept for b in r["scores"]}):
        having = [r for r in swept if bench in r["scores"]]
        bars = [error_bar(r["scores"][bench], r.get("intervals", {}).get(bench)) for r in having]
        line = axis.errorbar([r["value"] for r in having], [r["scores"][bench] for r in having],
                             yerr=list(zip(*bars)), marker="o", capsize=3,
                             label=f"{swept[0]['method']}, {bench} (95% interval)").lines[0]
        best = max((m["scores"][bench] for m in members if bench in m["scores"]), default=None)
        if best is not None:
            axis.axhline(best, linestyle="--", color=line.get_color(), linewidth=1, label=f"best member, {bench}")
    values = [r["value"] for r in swept]
    if param in LOG2_PARAMETERS:
        axis.set_xscale("log", base=2)
        axis.set_xticks(values, [str(v) for v in values])
    axis.set_xlabel(param)
    axis.set_ylabel("score (%)")
    axis.set_ylim(bottom=0)
    shares = [(r["value"], r["ensembled_pct"]) for r in swept if r["ensembled_pct"] is not None]
    if shares and any(share < 100 for _, share in shares):
        second = axis.twinx()
        second.plot(*zip(*shares), color="grey", linestyle=":", marker="s", label="% ensembled")
        second.set_ylabel("% of tokens ensembled")
        second.set_ylim(0, 100)
        second.legend(fontsize=7, loc="lower right")
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    written = _save(figure, path_stem)
    plt.close(figure)
    return written


def latency_measure(records: list[dict]) -> str:
    """The latency the most rows have (ms/token on a tie): a plot never mixes two."""
    return max(LATENCIES, key=lambda key: sum(bool(r.get(key)) for r in records))


def plotted_rows(records: list[dict], measure: str, warn: Callable[[str], None] = warn_on_stderr) -> list[dict]:
    """The rows with a score and the latency ``measure``; one warning line for each row left out."""
    points = []
    for record in records:
        if not record["scores"]:
            warn(f"row {record['label']} is left out of the plot: it has no score")
        elif not record.get(measure):
            warn(f"row {record['label']} is left out of the plot: it has no {LATENCIES[measure]}")
        else:
            points.append(record)
    return points


def plot_accuracy_latency(records: list[dict], path_stem: Path, title: str,
                          warn: Callable[[str], None] = warn_on_stderr) -> list[Path]:
    """Mean score over the benchmarks every plotted row has vs latency (ms/token, or ms/request where
    the rows are multiple choice), one labelled point per row."""
    measure = latency_measure(records)
    points = plotted_rows(records, measure, warn)
    shared = set.intersection(*(set(r["scores"]) for r in points)) if points else set()
    if not shared:
        raise UserError(f"no rows with {LATENCIES[measure]} and a benchmark in common to plot")
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(5.5, 3.8))
    benchmarks = sorted(shared)
    for record in points:
        score = sum(record["scores"][b] for b in shared) / len(shared)
        below, above = mean_error_bar(record, benchmarks)
        axis.errorbar(record[measure], score, yerr=[[below], [above]], capsize=3,
                      marker="o" if is_alone(record["method"]) else "^")
        axis.annotate(record["label"], (record[measure], score), fontsize=7, xytext=(3, 3),
                      textcoords="offset points")
    axis.set_xlabel(f"latency ({LATENCIES[measure]})")
    axis.set_ylabel(f"mean score over {', '.join(benchmarks)} (%, 95% interval)")
    axis.set_title(title, fontsize=9)
    figure.tight_layout()
    written = _save(figure, path_stem)
    plt.close(figure)
    return written
