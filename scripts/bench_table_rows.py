"""How long ``ensbench table`` takes on a run of many rows (issue 47: 10,000 rows did not finish in 5 minutes).

Writes a finished fake run (tests/fake_runs.py: recipe.yaml, summary.md, each row's timing.json, a results
file of a real one's size and a samples file of ``--examples`` ARC documents, which the table's intervals
read; two members alone and a GaC threshold sweep for the rest) and times ``ensbench table`` on it in a
fresh process; with ``--profile`` the 25 costliest functions instead (cProfile).

    python scripts/bench_table_rows.py --rows 10000 [--examples 10] [--profile [tottime]]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fake_runs import BASE_RECIPE, fake_run  # noqa: E402
from tests.report.test_compare import arc_sample  # noqa: E402


def real_extras() -> dict:
    """What a real results file holds besides its scores (lm-eval's environment report, run config,
    versions: about 6 KiB), taken from the committed CI baseline, so that each row's file has a real size."""
    [path, *_] = sorted((ROOT / "results" / "baseline").rglob("results_*.json"))
    found = json.loads(path.read_text())
    return {key: value for key, value in found.items()
            if key not in ("results", "n-samples", "group_subtasks", "configs", "n-shot", "higher_is_better")}


def big_run(folder: Path, rows: int, examples: int) -> Path:
    """A finished run of ``rows`` rows: members a and b alone, then GaC at rows - 2 thresholds; each row
    with a samples file of ``examples`` ARC documents (every third answered right)."""
    thresholds = [round((k + 1) / rows, 8) for k in range(rows - 2)]
    recipe = {**BASE_RECIPE, "method": "gac", "sweep": {"threshold": thresholds}}
    fakes = {"a": ("single", {"arc_c": (0.30, 200)}, {"decode_ms_per_token": 100.0}),
             "b": ("single", {"arc_c": (0.40, 200)}, {"decode_ms_per_token": 200.0})}
    fakes.update({f"gac-threshold={t}": ("gac", {"arc_c": (0.3 + 0.1 * t, 200)}, {"decode_ms_per_token": 300.0})
                  for t in thresholds})
    run = fake_run(folder, fakes, recipe, results_extras=real_extras())
    samples = "".join(json.dumps(arc_sample(k, int(k % 3 == 0))) + "\n" for k in range(examples))
    for label in fakes:
        (run / label / "samples_arc_challenge_2026-01-01T00-00-00.0.jsonl").write_text(samples)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--examples", type=int, default=10, help="documents in each row's samples file")
    parser.add_argument("--profile", nargs="?", const="cumulative", choices=["cumulative", "tottime"],
                        help="profile in this process (sorted by cumulative or own time) instead of timing a fresh one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        run = big_run(Path(scratch) / "run", args.rows, args.examples)
        print(f"wrote a run of {args.rows} rows in {time.perf_counter() - started:.1f} s")
        if args.profile:
            from ensemble_bench.report.tables import make_table, render

            profile = cProfile.Profile()
            profile.runcall(lambda: render(*make_table([run], None), "markdown"))
            sort = "tottime" if args.profile == "tottime" else "cumulative"
            pstats.Stats(profile).sort_stats(sort).print_stats(25)
            return
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "ensemble_bench.cli", "table", str(run)], capture_output=True,
                              text=True, cwd=ROOT)
        took = time.perf_counter() - started
        lines = done.stdout.count("\n")
        print(f"ensbench table: exit {done.returncode}, {lines} lines, {took:.1f} s ({args.rows} rows, "
              f"{args.examples} examples each; load {Path('/proc/loadavg').read_text().split()[0]})")
        if done.returncode:
            print(done.stderr[-2000:])


if __name__ == "__main__":
    main()
