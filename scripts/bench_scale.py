"""Scaling on this machine (issue 49): three tables, one sitting, ratios only. Every setup is one
`ensbench run` of GaC (average) over the packaged pair on the same requests.

(a) overlap: GaC with each member in its own Ray actor (1 thread each) against each member's plain step
    alone (a `singles` row in one process, 1 thread), decode ms per token, at each batch size; the ratio
    is to the slowest member alone (1.0: the ensemble step costs its slowest member).
(b) data parallel: 1 replica x 1 thread, 1 replica x 2 threads and 2 replicas x 1 thread
    (placement: {kind: ray, replicas: 2}); wall times, throughput ratios, and whether the samples are
    identical byte for byte.
(c) the same as (a) with both members on vLLM (backend: vllm): each member alone on its engine in one
    process against GaC with each engine in its own Ray actor (1 thread each), at each of
    ``--vllm-batch-sizes``. Needs vllm: run it in .venv-vllm (``make bench-scale-vllm``: table c alone).

    python scripts/bench_scale.py [--tables a b] [--members smollm2-135m qwen2.5-0.5b] [--task nq]
           [--limit 16] [--batch-size 1] [--overlap-batch-sizes 1 8] [--vllm-batch-sizes 1 8]
           [--output results/bench/scale.json]

The run's wall time counts everything a user waits for (lm-eval's start, model loading, Ray's start
for the replicas); the evaluation wall is lm-eval's own ``total_evaluation_time_seconds`` of the row
(from its evaluation tracker, made after the members, or the replicas, have loaded), and throughput is
compared on it. Run it under `timing` on a machine free of other work, and quote the load it ran under.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

SETUPS = (("1 replica x 1 thread", 1, 1), ("1 replica x 2 threads", 1, 2), ("2 replicas x 1 thread", 2, 1))
VLLM_ENGINE = {"max_model_len": 1024, "max_num_seqs": 8, "kv_cache_gib": 0.25}  # table (c): each member's engine


def recipe(args, name: str, batch_size: int, output: Path, replicas: int = 0, singles: bool = False,
           vllm: bool = False) -> dict:
    """The GaC recipe (or, with ``singles``, the members alone) in one process (``replicas`` 0), with each
    member in an actor of one thread (1), or as ``replicas`` copies of the ensemble (2 or more); with
    ``vllm``, every member on a vLLM engine."""
    found = {"name": name, "members": [{"model": m, "dtype": "float32", **({"num_cpus": 1} if replicas else {}),
                                        **({"backend": "vllm", "vllm": VLLM_ENGINE} if vllm else {})}
                                       for m in args.members],
             "tasks": [{"name": args.task, "limit": args.limit}], "batch_size": batch_size, "seed": 1234,
             "data": "offline", "output": str(output)}
    found["methods"] = ([{"name": "single", "label": m, "members": [m]} for m in args.members] if singles
                        else [{"name": "gac", "label": "gac", "weights": "average"}])
    if replicas:
        found["placement"] = {"kind": "ray", "num_cpus": 2, **({"replicas": replicas} if replicas > 1 else {})}
    return found


def ensbench_run(found: dict, folder: Path, threads: int) -> tuple[float, dict[str, Path]]:
    """Run the recipe fresh; (its wall seconds, each row's folder by label)."""
    path = folder / f"{found['name']}.yaml"
    path.write_text(yaml.safe_dump(found))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ensemble_bench.cli", "run", str(path), "--fresh", "--threads",
                           str(threads)], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{found['name']}: ensbench run failed: {done.stderr.strip().splitlines()[-1:]}")
    [run_dir] = (Path(found["output"]) / found["name"]).iterdir()
    return wall, {row.name: row for row in run_dir.iterdir() if (row / "timing.json").is_file()}


def ms_per_token(row: Path) -> float:
    return json.loads((row / "timing.json").read_text())["decode_ms_per_token"]


def overlap(args, folder: Path, batch_size: int, vllm: bool = False) -> dict:
    """Table (a) at one batch size (table (c) with ``vllm``): each member alone in one process, and GaC
    over members in actors."""
    name = f"{'vllm-' if vllm else ''}b{batch_size}"
    _, alone = ensbench_run(recipe(args, f"alone-{name}", batch_size, folder / f"alone-{name}", singles=True,
                                   vllm=vllm), folder, threads=1)
    _, actors = ensbench_run(recipe(args, f"actors-{name}", batch_size, folder / f"actors-{name}", replicas=1,
                                    vllm=vllm), folder, threads=1)
    members = {label: ms_per_token(row) for label, row in sorted(alone.items())}
    gac = ms_per_token(actors["gac"])
    return {"batch_size": batch_size, "alone_ms_per_token": members, "gac_actors_ms_per_token": gac,
            "ratio_to_slowest": gac / max(members.values())}


def data_parallel(setup: tuple[str, int, int], args, folder: Path) -> dict:
    """Table (b), one setup."""
    name, replicas, threads = setup
    found = recipe(args, f"r{replicas}t{threads}", args.batch_size, folder / f"r{replicas}t{threads}",
                   replicas=replicas if replicas > 1 else 0)
    wall, rows = ensbench_run(found, folder, threads)
    row = rows["gac"]
    timing = json.loads((row / "timing.json").read_text())
    [results] = row.glob("results_*.json")
    evaluated = float(json.loads(results.read_text())["total_evaluation_time_seconds"])
    samples = sorted(row.glob("samples_*.jsonl"))
    resps = [[(r["doc_id"], r["resps"]) for r in map(json.loads, p.read_text().splitlines())] for p in samples]
    return {"setup": name, "replicas": replicas, "threads": threads, "run_wall_s": wall,
            "eval_wall_s": evaluated, "replica_stats": timing.get("replicas"),
            "decode_ms_per_token": timing.get("decode_ms_per_token"), "samples": resps}


def print_overlap(args, found: list[dict], table: str = "(a) overlap") -> None:
    labels = list(found[0]["alone_ms_per_token"])
    print(f"{table}: GaC, {args.task} {args.limit} requests, each member in a Ray actor x 1 thread, "
          "against each member alone (1 thread); decode ms/token")
    print(f"{'batch':>5}" + "".join(f"{label + ' alone':>22}" for label in labels)
          + f"{'GaC, members in actors':>24}{'ratio to slowest':>18}")
    for r in found:
        print(f"{r['batch_size']:>5}" + "".join(f"{r['alone_ms_per_token'][label]:>22.1f}" for label in labels)
              + f"{r['gac_actors_ms_per_token']:>24.1f}{r['ratio_to_slowest']:>17.2f}x")


def print_data_parallel(args, found: list[dict]) -> None:
    base = found[0]
    print(f"(b) data parallel: GaC, {args.task} {args.limit} requests, batch {args.batch_size}")
    print(f"{'setup':<24}{'run wall s':>11}{'eval wall s':>12}{'throughput vs 1x1':>19}  samples")
    for r in found:
        same = "identical" if r["samples"] == base["samples"] else "DIFFERENT"
        ratio = base["eval_wall_s"] / r["eval_wall_s"]
        print(f"{r['setup']:<24}{r['run_wall_s']:>11.1f}{r['eval_wall_s']:>12.1f}{ratio:>18.2f}x  {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", nargs="+", choices=["a", "b", "c"], default=["a", "b"])
    parser.add_argument("--members", nargs=2, default=["smollm2-135m", "qwen2.5-0.5b"])
    parser.add_argument("--task", default="nq")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--overlap-batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--vllm-batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--output", type=Path, default=Path("results/bench/scale.json"))
    args = parser.parse_args()
    if "c" in args.tables and importlib.util.find_spec("vllm") is None:
        sys.exit("table c needs vllm: run it in .venv-vllm (make bench-scale-vllm)")
    found: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as scratch:
        if "a" in args.tables:
            found["overlap"] = [overlap(args, Path(scratch), b) for b in args.overlap_batch_sizes]
        if "b" in args.tables:
            parallel = [data_parallel(setup, args, Path(scratch)) for setup in SETUPS]
        if "c" in args.tables:
            found["vllm_overlap"] = [overlap(args, Path(scratch), b, vllm=True) for b in args.vllm_batch_sizes]
    before, after = found["load_before"], os.getloadavg()
    found["load_after"] = after
    print(f"load (1, 5, 15 min) before {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, "
          f"after {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}")
    if "a" in args.tables:
        print_overlap(args, found["overlap"])
    if "b" in args.tables:
        print_data_parallel(args, parallel)
        found["data_parallel"] = [{k: v for k, v in r.items() if k != "samples"} for r in parallel]
        found["identical"] = all(r["samples"] == parallel[0]["samples"] for r in parallel)
    if "c" in args.tables:
        print_overlap(args, found["vllm_overlap"], "(c) overlap, members on vLLM engines")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
