"""The plan ``ensbench run`` prints before it runs (and all that ``--dry-run`` prints): a heading, where
results go, the rows with their members and method parameters as resolved, the benchmarks, and notes."""

from __future__ import annotations

import json

from rich.table import Table
from rich.text import Text

from ensemble_bench.errors import UserError, lines_of


def row_parameters(row) -> str:
    """A row's method parameters as the run resolves them (recipe, member weights, sweep point; the plan's
    ``row.params``), those that differ from the method's defaults: ``weights=[2.0, 1.0], threshold=0.5``;
    ``defaults`` when none do."""
    from ensemble_bench.methods import method_spec

    if row.spec is None:
        return "-"
    resolved = row.params.model_dump(mode="json")
    try:
        defaults = method_spec(row.method).Params().model_dump(mode="json")
    except ValueError:  # a method with a required parameter: every value is shown
        defaults = {}
    shown = [f"{name}={json.dumps(value)}" for name, value in resolved.items()
             if name not in defaults or defaults[name] != value]
    return ", ".join(shown) or "defaults"


def results_line(recipe, fresh: bool) -> Text:
    """Where the run writes: the unfinished run it resumes, or the new run folder."""
    from ensemble_bench.run.runs import planned_run_dir

    try:
        folder, resumed = planned_run_dir(recipe, fresh)
    except (UserError, OSError) as err:  # the preflight says what is wrong with output:
        return Text(f"results: output: {recipe.output} ({lines_of(err)[0] if isinstance(err, UserError) else err})")
    return Text(f"results: {folder}" + (" (resumes this unfinished run)" if resumed else " (a new run)"))


def plan_tables(recipe, fresh: bool = False) -> list:
    """The plan as a heading line, where results go and two narrow tables (rows, then benchmarks),
    readable at 80 columns."""
    from ensemble_bench.recipe import selected_benchmarks
    from ensemble_bench.tasks.task_sampling import sampling_notes
    from ensemble_bench.tasks.whitespace import recipe_warnings

    heading = Text(f"plan: {recipe.name} ({recipe.data} data, batch {recipe.batch_size}, seed {recipe.seed})")
    rows = Table(title="rows")
    for column in ("row", "method", "members", "parameters"):
        rows.add_column(column, no_wrap=column in ("row", "method"))
    for row in recipe.plan:
        rows.add_row(row.label, row.method, " + ".join(recipe.members[i].label for i in row.members),
                     Text(row_parameters(row)))
    benches = Table(title="benchmarks")
    for column in ("benchmark", "lm-eval task", "shots", "limit"):
        benches.add_column(column, no_wrap=True, overflow="fold")
    for bench, shots, limit in selected_benchmarks(recipe):
        benches.add_row(bench.name, bench.task, str(shots if shots is not None else bench.default_shots),
                        str(limit or "all"))
    notes = [Text(f"note: {line}") for line in [*sampling_notes(recipe), *task_code_notes(recipe),
                                                 *reuse_notes(recipe, fresh)]]
    notes += [Text(f"warning: {line}") for line in recipe_warnings(recipe)]
    return [heading, results_line(recipe, fresh), rows, benches, *notes]


def reuse_notes(recipe, fresh: bool) -> list[str]:
    """A line per row the run would not compute: kept from the run it resumes, or reused from another run."""
    from ensemble_bench.run.runner import planned_reuse

    try:
        states = planned_reuse(recipe, fresh)
    except (UserError, OSError):  # the preflight names what is wrong
        return []
    return [f"row {label}: {state} (not computed)" for label, state in states.items()]


def task_code_notes(recipe) -> list[str]:
    """A line per module of an include_path folder that the tasks import (``!function``) and so run."""
    from ensemble_bench.tasks.recipe_tasks import recipe_task_code

    try:
        found = recipe_task_code(recipe)
    except UserError:  # the preflight names what is wrong with the folders
        return []
    return [f"task code: {code.module} runs when the tasks load (!function {code.reference} in {code.task_yaml.name})"
            f"{'' if recipe.allow_task_code else ' - not allowed: set allow_task_code: true'}" for code in found]
