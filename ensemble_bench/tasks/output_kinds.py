"""Which of a recipe's benchmarks score multiple-choice options (log-likelihood requests), from the
``output_type`` of their lm-eval task configs (a group: of any of its tasks). A benchmark the task
index does not hold (ensbench's own Flores configs) generates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ensemble_bench.tasks import Benchmark
    from ensemble_bench.tasks.lm_eval_tasks import Found

SCORING_KINDS = frozenset({"multiple_choice", "loglikelihood", "loglikelihood_rolling"})


def choice_benchmarks(benchmarks: Sequence[Benchmark], index: Mapping[str, Found] | None) -> list[str]:
    """The names of ``benchmarks`` (a run's selected benchmarks) whose tasks score options rather than
    generate. ``index``: lm-eval's task index with the recipe's include_path folders
    (``recipe_tasks.task_index_of``; None when every task is built in: lm-eval's own index then)."""
    from ensemble_bench.tasks.lm_eval_tasks import leaf_configs, stock_index

    index = stock_index() if index is None else index
    found = []
    for bench in benchmarks:
        entry = index.get(bench.task)
        kinds = {cfg.get("output_type") for cfg in leaf_configs(entry, index)} if entry is not None else set()
        if kinds & SCORING_KINDS:
            found.append(bench.name)
    return found
