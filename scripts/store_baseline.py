"""Store a finished run as the committed regression baseline: only what `ensbench regress` reads
(recipe, summary, per-row timing and lm-eval scores) and text-free per-example scores
(``scores_<task>.jsonl``: doc id and hash, metric values, the row's answer, for `ensbench compare`),
never the samples (benchmark text) or caches.

    python scripts/store_baseline.py results/ci_regress results/baseline/ci_regress
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from ensemble_bench.report.samples import write_extracts
from ensemble_bench.report.tables import resolve_run

KEPT = ("recipe.yaml", "summary.md", "summary.csv", "paired.csv", "*/timing.json", "*/results_*.json")


def main() -> None:
    run, destination = resolve_run(Path(sys.argv[1])), Path(sys.argv[2])
    shutil.rmtree(destination, ignore_errors=True)
    target = destination / run.name
    for pattern in KEPT:
        for source in run.glob(pattern):
            (target / source.relative_to(run)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / source.relative_to(run))
    for row in (p.parent for p in run.glob("*/timing.json")):
        write_extracts(row, target / row.name)
    print(f"baseline: {target}")


if __name__ == "__main__":
    main()
