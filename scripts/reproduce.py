"""Reproduce a paper table: run its recipes (finished runs are reused) and write the table.

    python scripts/reproduce.py table3 --scale offline     # packaged models, small limits, CPU
    python scripts/reproduce.py table3                     # the paper's models (GPUs, model hub)
    python scripts/reproduce.py table3 --dry-run --limit 5 --output /tmp/r   # preview; small; elsewhere

Writes results/tables/<layout>[-<block>][_offline].{md,tex,csv} with the paper's numbers beside ours
(<output>/tables/... with --output). The `make reproduce-*` targets call this (DRY_RUN=1 LIMIT=n OUTPUT=dir).
Each block of a table is headed by a line naming it and its recipes; a recipe that fills several blocks
runs (and is planned) once. A dry run prints each recipe's plan and an estimate of its run from measured
per-example costs (ensemble_bench/report/estimate.py), then the whole target's, and how it is computed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import yaml

from ensemble_bench.recipe import load_recipe
from ensemble_bench.recipe.overrides import option_overrides
from ensemble_bench.report.estimate import HOW, Estimate, combined, estimate, estimate_lines
from ensemble_bench.report.from_csv import table_stem

ROOT = Path(__file__).resolve().parents[1]

# target -> scale -> [(layout, block or None, [recipes])]; blocks of one paper table get one file each
PAPER_SWEETSPAN = [(f"sweetspan_table{n}", block, [f"sweetspan_{task}_{setting}" for task in tasks])
                   for n, tasks in ((2, ("mbpp", "gsm8k")), (3, ("nq", "flores_de_en")))
                   for block, setting in (("4 Good", "4good"), ("3 Good & 1 Bad", "3good1bad"),
                                          ("2 Good & 2 Bad", "2good2bad"))]
TARGETS = {
    "table3": {"paper": [("gac_table3", "openchat and SOLAR", ["gac_table3_openchat_solar"]),
                         ("gac_table3", "Mixtral and Yi", ["gac_table3_mixtral_yi"])],
               "offline": [("gac_table3", "openchat and SOLAR", ["gac_table3"])]},
    "table4": {"paper": [("gac_table4", None, ["gac_table4"])], "offline": [("gac_table4", None, ["gac_table4"])]},
    "table5": {"paper": [("gac_table5", None, ["gac_table5"])], "offline": [("gac_table5", None, ["gac_table5"])]},
    "unite-table3": {"paper": [("unite_table3", None, ["unite_table3_openchat_mistral", "unite_table3_three"])],
                     "offline": [("unite_table3", None, ["unite_table3"])]},
    "unite-table4": {"paper": [("unite_table4", None, ["unite_table4_llama3_qwen2", "unite_table4_three"])],
                     "offline": [("unite_table4", None, ["unite_table4"])]},
    "deepen-table1": {"paper": [("deepen_table1", None, sorted(p.stem for p in (ROOT / "recipes" / "paper").glob(
                                     "deepen_table1_*.yaml")))],
                      "offline": [("deepen_table1", None, ["deepen_table1"])]},
    "deepen-table3": {"paper": [("deepen_table3", None, ["deepen_table3"])],
                      "offline": [("deepen_table3", None, ["deepen_table3"])]},
    "sweetspan": {"paper": [("sweetspan_table7", None, ["sweetspan_nq_4good", "sweetspan_gsm8k_4good",
                                                        "sweetspan_mbpp_4good"]),
                            ("sweetspan_table8", None, [f"sweetspan_flores_{d}_4good"
                                                        for d in ("en_de", "de_en", "en_ro", "ro_en")])]
                           + PAPER_SWEETSPAN,
                  "offline": [("sweetspan_table7", None, ["sweetspan_nq", "sweetspan_gsm8k"])]},
    "safe": {"paper": [("safe_table2", None, [f"safe_table2_{pair}" for pair in (
                           "internlm3_qwen25", "qwen25_exaone35", "internlm3_exaone35", "three")]),
                       ("safe_table3", None, ["safe_table3_qwen2_llama31"]),
                       ("safe_table4", None, ["safe_table4_internlm3_qwen25_sharpen"]),
                       ("safe_table5", None, ["safe_table5_internlm3_qwen25_floor"]),
                       ("safe_table6", None, ["safe_table6_internlm3_qwen25_draft_len"])]},
    "core": {"paper": [("core_benchmark", block, [f"core_benchmark_{task}" for task in
                                                   ("gsm8k", "piqa", "triviaqa", "nq", "mmlu")])
                       for block in ("Top-2", "Top-3", "Base models")],
             "offline": [("core_benchmark", block, ["core_benchmark"]) for block in ("Top-2", "Top-3")]},
    "coolfusion": {"paper": [("coolfusion_table3", None, ["coolfusion_table3_cool2", "coolfusion_table3_cool3",
                                                          "coolfusion_table3_cool_align_off",
                                                          "coolfusion_table3_cool_rerank",
                                                          "coolfusion_table3_rerank3"])],
                   "offline": [("coolfusion_table3", None, ["coolfusion_table3"])]},
    "adafuse": {"paper": [("adafuse_table1", None, ["adafuse_table1"])],
                "offline": [("adafuse_table1", None, ["adafuse_table1"])]},
}


def ensbench(*args: str) -> None:
    command = [str(Path(sys.executable).with_name("ensbench")), *args]
    print("+", " ".join(command), flush=True)
    done = subprocess.run(command, cwd=ROOT)
    if done.returncode:
        sys.exit(done.returncode)


def block_heading(layout: str, block: str | None, recipes: list[str]) -> str:
    """The line above a block's recipes: which table, which block, from which recipes."""
    return f"== {layout}" + (f", block {block}" if block else "") + f": recipe{'s' * (len(recipes) > 1)} " \
        + ", ".join(recipes)


def recipe_estimate(path: Path, limit: int | None) -> Estimate:
    """The estimate of one recipe as `ensbench run --limit` would run it (report/estimate.py)."""
    return estimate(load_recipe(path, option_overrides(limit, None, None, None, None)))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", choices=sorted(TARGETS))
    parser.add_argument("--scale", choices=("paper", "offline"), default="paper")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--dry-run", action="store_true", help="check each recipe and print its plan and an estimate "
                                                               "of the run; run nothing")
    parser.add_argument("--limit", type=int, help="at most this many examples per task (ensbench run --limit)")
    parser.add_argument("--output", help="results folder instead of each recipe's output: (ensbench run --output)")
    args = parser.parse_args(argv)
    args.output = args.output and os.path.expanduser(os.path.expandvars(args.output))  # as ensbench reads it
    if args.scale not in TARGETS[args.target]:
        sys.exit(f"error: {args.target} has no {args.scale} stand-in; every method on the packaged models: "
                 "ensbench run recipes/offline/compare_all.yaml")
    return args


def run_block(args, recipes: list[str], where: str, planned: dict[str, str], estimates: dict, run) -> list[str]:
    """Run (or plan and estimate) a block's recipes, each recipe once over all blocks; their results folders."""
    folder = "offline" if args.scale == "offline" else "paper"
    overrides = [*(["--dry-run"] if args.dry_run else []), *(["--limit", str(args.limit)] if args.limit else []),
                 *(["--output", args.output] if args.output else [])]
    runs = []
    for name in recipes:
        path = ROOT / "recipes" / folder / f"{name}.yaml"
        if name in planned:  # one recipe fills several blocks: it runs (and is planned) once
            print(f"{name}: {'planned' if args.dry_run else 'run'} above, under {planned[name]}", flush=True)
        else:
            run("run", str(path), "--reuse", "--threads", str(args.threads), *overrides)
            planned[name] = where
            if args.dry_run:
                estimates[name] = recipe_estimate(path, args.limit)
                print("\n".join(estimate_lines(estimates[name], f"estimate of {name}")), flush=True)
        recipe = yaml.safe_load(path.read_text())
        runs.append(str(ROOT / (args.output or recipe.get("output", "results")) / recipe["name"]))
    return runs


def main(argv: list[str] | None = None, run=ensbench) -> None:
    args = parse_args(argv)
    planned: dict[str, str] = {}  # recipe -> the block it was first run (or planned) under
    estimates: dict[str, Estimate] = {}
    for layout, block, recipes in TARGETS[args.target][args.scale]:
        print(block_heading(layout, block, recipes), flush=True)
        runs = run_block(args, recipes, layout + (f", block {block}" if block else ""), planned, estimates, run)
        if args.dry_run:
            continue
        out = ROOT / (args.output or "results") / "tables" / table_stem(layout, block, args.scale == "offline")
        out.parent.mkdir(parents=True, exist_ok=True)
        block_args = ["--block", block] if block else []
        run("table", *runs, "--layout", layout, "--paper", "--out", str(out), *block_args)
        print(out.with_name(out.name + ".md").read_text())
    if args.dry_run:
        print("\n".join([*estimate_lines(combined(estimates), f"estimate of {args.target}", costliest=0), HOW]))


if __name__ == "__main__":
    main()
