"""Wall time of ``ensbench run recipes/offline/demo.yaml --dry-run`` and ``ensbench list`` in fresh
processes: this checkout, and (``--old PATH``) another checkout side by side, alternating, with the same
interpreter; the first round warms the file cache and is not counted. Prints each median and min, and the
ratio to the old checkout's median. Run it under ``timing`` on a shared machine (docs/performance.md)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, help="another checkout to time beside this one")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    trees = {"this": ROOT, **({"old": args.old.resolve()} if args.old else {})}
    out = tempfile.mkdtemp(prefix="bench_dry_run_")
    commands = {"dry-run": ["run", "recipes/offline/demo.yaml", "--dry-run", "--output", out], "list": ["list"]}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    times: dict[tuple[str, str], list[float]] = {(c, t): [] for c in commands for t in trees}
    for round_ in range(args.repeats + 1):
        for command, words in commands.items():
            for tree, root in trees.items():
                start = time.perf_counter()
                subprocess.run([sys.executable, "-m", "ensemble_bench.cli", *words], cwd=root, env=env,
                               capture_output=True, check=True)
                if round_:
                    times[(command, tree)].append(time.perf_counter() - start)
    print(f"load after: {Path('/proc/loadavg').read_text().strip()}")
    for command in commands:
        medians = {tree: statistics.median(times[(command, tree)]) for tree in trees}
        shown = ", ".join(f"{tree} median {m:.2f} s (min {min(times[(command, tree)]):.2f})"
                          for tree, m in medians.items())
        ratio = f", this/old {medians['this'] / medians['old']:.2f}" if "old" in medians else ""
        print(f"{command}: {shown}{ratio}")


if __name__ == "__main__":
    main()
