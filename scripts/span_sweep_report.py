"""SweetSpan Table 7-style table and accuracy-vs-span-length plot from finished runs (a sweep
run and a run with the members alone). ``--latency RUN`` takes every row's ms/token from RUN, a
run of the same rows timed in one sitting, instead of from the sweep runs.

    python scripts/span_sweep_report.py results/sweetspan_nq/<id> results/unite_demo/<id> \
        --out docs/figures/sweetspan_nq --title "SweetSpan, SmolLM2 + Qwen2.5, NQ (100)"
    python scripts/span_sweep_report.py results/sweetspan_gsm8k/<id> \
        --latency results/sweetspan_gsm8k_latency/<id> --out docs/figures/sweetspan_gsm8k
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ensemble_bench.report.plots import plot_parameter
from ensemble_bench.report.span_sweep import sweep_records, sweep_table, timed_by


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="path stem for .md, .png, .svg")
    parser.add_argument("--title", default="SweetSpan span-length sweep")
    parser.add_argument("--latency", type=Path, help="a run of the same rows whose ms/token to report")
    args = parser.parse_args()
    records = sweep_records(args.runs)
    if args.latency:
        records = timed_by(records, sweep_records([args.latency]))
    table = sweep_table(records).to_markdown(index=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(table + "\n")
    print(table)
    for path in plot_parameter(records, "span_words", args.out, args.title):
        print(path)


if __name__ == "__main__":
    main()
