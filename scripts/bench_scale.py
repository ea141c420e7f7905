"""Data parallel on this machine (issue 49, table (b)): the same GaC row over the same requests as
1 replica x 1 thread, 1 replica x 2 threads and 2 replicas x 1 thread (placement: {kind: ray, replicas: 2}),
one `ensbench run` each, in one sitting; wall times, throughput ratios, and whether the samples are
identical byte for byte.

    python scripts/bench_scale.py [--members smollm2-135m qwen2.5-0.5b] [--task nq] [--limit 16]
           [--batch-size 1] [--output results/bench/scale.json]

The run's wall time counts everything a user waits for (lm-eval's start, model loading, Ray's start
for the replicas); the evaluation wall is lm-eval's own ``total_evaluation_time_seconds`` of the row
(from its evaluation tracker, made after the members, or the replicas, have loaded), and throughput is
compared on it. Run it under `timing` on a machine free of other work, and quote the load it ran under.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

SETUPS = (("1 replica x 1 thread", 1, 1), ("1 replica x 2 threads", 1, 2), ("2 replicas x 1 thread", 2, 1))


def recipe(members: list[str], task: str, limit: int, batch_size: int, replicas: int, output: Path) -> dict:
    found = {"name": "scale", "members": [{"model": m, "dtype": "float32", **({"num_cpus": 1} if replicas > 1 else {})}
                                          for m in members],
             "method": {"name": "gac", "weights": "average"}, "tasks": [{"name": task, "limit": limit}],
             "batch_size": batch_size, "seed": 1234, "data": "offline", "output": str(output)}
    if replicas > 1:
        found["placement"] = {"kind": "ray", "replicas": replicas, "num_cpus": replicas}
    return found


def run(setup: tuple[str, int, int], args, folder: Path) -> dict:
    name, replicas, threads = setup
    output = folder / f"r{replicas}t{threads}"
    path = folder / f"r{replicas}t{threads}.yaml"
    path.write_text(yaml.safe_dump(recipe(args.members, args.task, args.limit, args.batch_size, replicas, output)))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ensemble_bench.cli", "run", str(path), "--fresh", "--threads",
                           str(threads)], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{name}: ensbench run failed: {done.stderr.strip().splitlines()[-1:]}")
    [run_dir] = (output / "scale").iterdir()
    row = run_dir / "gac"
    timing = json.loads((row / "timing.json").read_text())
    [results] = row.glob("results_*.json")
    evaluated = float(json.loads(results.read_text())["total_evaluation_time_seconds"])
    samples = sorted(row.glob("samples_*.jsonl"))
    resps = [[(r["doc_id"], r["resps"]) for r in map(json.loads, p.read_text().splitlines())] for p in samples]
    return {"setup": name, "replicas": replicas, "threads": threads, "run_wall_s": wall,
            "eval_wall_s": evaluated, "replica_stats": timing.get("replicas"),
            "decode_ms_per_token": timing.get("decode_ms_per_token"), "samples": resps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", nargs=2, default=["smollm2-135m", "qwen2.5-0.5b"])
    parser.add_argument("--task", default="nq")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--output", type=Path, default=Path("results/bench/scale.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        found = [run(setup, args, Path(scratch)) for setup in SETUPS]
    base = found[0]
    print(f"(b) data parallel: GaC, {args.task} {args.limit} requests, batch {args.batch_size}, "
          f"load before {os.getloadavg()[0]:.2f}")
    print(f"{'setup':<24}{'run wall s':>11}{'eval wall s':>12}{'throughput vs 1x1':>19}  samples")
    for r in found:
        same = "identical" if r["samples"] == base["samples"] else "DIFFERENT"
        ratio = base["eval_wall_s"] / r["eval_wall_s"]
        print(f"{r['setup']:<24}{r['run_wall_s']:>11.1f}{r['eval_wall_s']:>12.1f}{ratio:>18.2f}x  {same}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                       "load_after": os.getloadavg(),
                                       "runs": [{k: v for k, v in r.items() if k != "samples"} for r in found],
                                       "identical": all(r["samples"] == base["samples"] for r in found)}, indent=1))


if __name__ == "__main__":
    main()
