"""Which of a recipe's benchmarks score multiple-choice options (log-likelihood requests), from the
``output_type`` of their lm-eval task configs (a group: of any of its tasks). A benchmark the task
index does not hold (ensbench's own Flores configs) generates."""

from __future__ import annotations

from ensemble_bench.errors import UserError

SCORING_KINDS = frozenset({"multiple_choice", "loglikelihood", "loglikelihood_rolling"})


def choice_benchmarks(recipe) -> list[str]:
    """The names of the recipe's benchmarks whose tasks score options rather than generate (none when the
    task index cannot be read: the preflight names why)."""
    from ensemble_bench.tasks.lm_eval_tasks import leaf_configs, task_index
    from ensemble_bench.tasks.recipe_tasks import include_folders, task_benchmarks

    try:
        index = task_index(include_folders(recipe))
    except UserError:
        return []
    found = []
    for bench in task_benchmarks(recipe, index):
        entry = index.get(bench.task)
        kinds = {cfg.get("output_type") for cfg in leaf_configs(entry, index)} if entry is not None else set()
        if kinds & SCORING_KINDS:
            found.append(bench.name)
    return found
