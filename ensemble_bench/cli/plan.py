"""The plan ``ensbench run`` prints before it runs (and all that ``--dry-run`` prints): a heading, where
results go, the rows with their members and method parameters as resolved, the benchmarks, and notes."""

from __future__ import annotations

import json

from rich.table import Table
from rich.text import Text


def row_parameters(row) -> str:
    """A row's method parameters as the run resolves them (recipe, member weights, sweep point; the plan's
    ``row.params``), those that differ from the method's defaults: ``weights=[2.0, 1.0], threshold=0.5``;
    ``defaults`` when none do."""
    from ensemble_bench.methods import get_method

    if row.spec is None:
        return "-"
    resolved = row.params.model_dump(mode="json")
    try:
        defaults = get_method(row.method).Params().model_dump(mode="json")
    except ValueError:  # a method with a required parameter: every value is shown
        defaults = {}
    shown = [f"{name}={json.dumps(value)}" for name, value in resolved.items()
             if name not in defaults or defaults[name] != value]
    return ", ".join(shown) or "defaults"


def results_line(setup) -> Text:
    """Where the run writes: the unfinished run it resumes, or the new run folder."""
    if setup.run_dir is None:  # the problems the plan ends with say why
        return Text(f"results: output: {setup.recipe.output} (its run folders cannot be read)")
    return Text(f"results: {setup.run_dir}" + (" (resumes this unfinished run)" if setup.resumed else " (a new run)"))


def plan_tables(setup) -> list:
    """The plan of a resolved run (``run.setup.RunSetup``) as a heading line, where results go and two
    narrow tables (rows, then benchmarks), readable at 80 columns; then its notes."""
    from ensemble_bench.tasks.task_sampling import sampling_notes
    from ensemble_bench.tasks.whitespace import recipe_warnings

    recipe = setup.recipe
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
    for bench, shots, limit in setup.benchmarks:
        benches.add_row(bench.name, bench.task, str(shots if shots is not None else bench.default_shots),
                        str(limit or "all"))
    notes = [Text(f"note: {line}") for line in [*sampling_notes(recipe, setup.task_index), *task_code_notes(setup),
                                                 *reuse_notes(setup), *choice_notes(setup)]]
    notes += [Text(f"warning: {line}") for line in recipe_warnings(recipe, setup.task_index)]
    return [heading, results_line(setup), rows, benches, *notes]


def reuse_notes(setup) -> list[str]:
    """A line per row the run would not compute: kept from the run it resumes, or reused from another run
    (``RowState``). None when the setup wrote no task configs (``--fresh``, nothing to take, or the offline
    data not built yet: the run builds it, and decides then)."""
    from ensemble_bench.run.setup import KEPT, REUSED

    taken = {label: "kept from the unfinished run" if state.kind == KEPT else f"reused from {state.source_name}"
             for label, state in setup.states.items() if state.kind in (KEPT, REUSED)}
    return [f"row {label}: {how} (not computed)" for label, how in taken.items()]


def task_code_notes(setup) -> list[str]:
    """A line per module that the tasks import (``!function``, wherever it lies; installed code aside) and so run."""
    from ensemble_bench.tasks.recipe_tasks import recipe_task_code

    allowed = setup.recipe.allow_task_code
    return [f"task code: {code.shown()} runs when the tasks load ({code.origin()})"
            f"{'' if allowed else ' - not allowed: set allow_task_code: true'}"
            for code in recipe_task_code(setup.recipe, setup.task_index)]


def choice_notes(setup) -> list[str]:
    """A line per ensemble row that sets parameters its method does not use to score multiple-choice
    options (``Method.unused_on_choices``), when the recipe has multiple-choice benchmarks."""
    from ensemble_bench.methods import get_method
    from ensemble_bench.tasks.output_kinds import choice_benchmarks

    ensembles = [row for row in setup.recipe.plan if row.spec is not None]
    unused = [(row, names) for row in ensembles if (names := get_method(row.method).unused_on_choices(row.params))]
    choices = ", ".join(choice_benchmarks([bench for bench, _, _ in setup.benchmarks], setup.task_index)) \
        if unused else ""
    return [f"row {row.label}: {', '.join(names)} {'does' if len(names) == 1 else 'do'} nothing on the multiple-choice "
            f"benchmarks ({choices}): {get_method(row.method).choice_scoring}" for row, names in unused if choices]
