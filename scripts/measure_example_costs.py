"""Measure what one example costs each packaged model alone, per benchmark: the figures from which
`make reproduce-* DRY_RUN=1` estimates a run (ensemble_bench/report/example_costs.csv).

    timing .venv/bin/python scripts/measure_example_costs.py --threads 2     # about 10 min on 2 cores

One `ensbench run` per benchmark: the three packaged models alone (method single), batch 8, offline
data, a fresh run in a temporary folder. A row's cost per example is lm-eval's evaluation time of the
row (model loading not counted) over its examples. The CSV records the date, the threads, the batch
size, the CPU and the load average at the start, so that a reader knows what the figures stand for.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "ensemble_bench" / "report" / "example_costs.csv"
MODELS = ("smollm2-135m", "qwen2.5-0.5b", "gemma3-270m")
# benchmark -> examples measured (one batch of 8 where an example generates hundreds of tokens)
LIMITS = {"piqa": 16, "arc_c": 16, "nq": 16, "triviaqa": 16, "gsm8k": 8, "flores_en-de": 8}
FIELDS = ("model", "benchmark", "shots", "examples", "seconds_per_example", "batch_size", "threads", "measured",
          "cpu", "load")


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), or "unknown"."""
    try:
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
    except OSError:
        found = None
    return found.group(1).strip() if found else "unknown"


def measure(bench: str, limit: int, threads: int, folder: Path) -> list[dict]:
    """One fresh run of the three models alone on ``bench``: a record per model."""
    from ensemble_bench.report.run_files import row_wall_seconds
    from ensemble_bench.report.tables import resolve_run
    from ensemble_bench.run.folder import read_json, results_files

    recipe = {"name": f"costs_{bench.replace('-', '_')}", "members": [{"model": m, "name": m} for m in MODELS],
              "method": "single", "tasks": [{"name": bench, "limit": limit}], "batch_size": 8, "seed": 1234,
              "data": "offline", "output": str(folder)}
    path = folder / f"{recipe['name']}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    load = os.getloadavg()[0]
    done = subprocess.run([str(Path(sys.executable).with_name("ensbench")), "run", str(path), "--fresh",
                           "--threads", str(threads)], cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"ensbench run failed on {bench}:\n{done.stderr[-2000:]}")
    run_dir = resolve_run(folder / recipe["name"])
    records = []
    for model in MODELS:
        [results] = [read_json(p) for p in results_files(run_dir / model)]
        [task] = [name for name in results["n-samples"]]
        examples = results["n-samples"][task]["effective"]
        records.append({"model": model, "benchmark": bench, "shots": results["n-shot"][task], "examples": examples,
                        "seconds_per_example": round(row_wall_seconds(run_dir / model) / examples, 3),
                        "batch_size": 8, "threads": threads, "measured": datetime.date.today().isoformat(),
                        "cpu": cpu_name(), "load": round(load, 2)})
        print(f"{model} {bench}: {records[-1]['seconds_per_example']} s/example ({examples} examples)", flush=True)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--benchmarks", nargs="*", default=list(LIMITS), choices=list(LIMITS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        records = [r for bench in args.benchmarks for r in measure(bench, LIMITS[bench], args.threads, Path(scratch))]
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(records)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
