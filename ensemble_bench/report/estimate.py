"""How long a recipe's run would take from scratch, estimated from measured per-example costs: what
`make reproduce-* DRY_RUN=1` prints under each plan.

    row seconds = sum over the row's tasks of  examples x f(method) x sum over its members of s(member, benchmark)

s(member, benchmark) is the member's seconds per example alone: lm-eval's evaluation time of a row over
its examples, batch 8, measured by ``scripts/measure_example_costs.py`` on the packaged models
(``example_costs.csv``, which records the date, threads, CPU and load). f(method) is the method's decode
time over its members' summed time, measured with every row in one process (``method_costs.csv``, each
figure with its source); a method without a measured figure counts as 1 and the estimate says so. Model
loading, shots other than the measured ones and batch sizes other than 8 are not modelled: the estimate
gives the order of a run's length, not a promise.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

HERE = Path(__file__).parent
EXAMPLE_COSTS = HERE / "example_costs.csv"
METHOD_COSTS = HERE / "method_costs.csv"
HOW = ("estimate = sum over rows and tasks of examples x the members' measured seconds per example alone "
       "(ensemble_bench/report/example_costs.csv: packaged models, batch 8) x the method's measured cost over its "
       "members' (method_costs.csv; 1 where unmeasured); loading not counted")


@cache
def member_costs() -> dict[tuple[str, str], float]:
    """(model, benchmark) -> seconds per example of the model alone."""
    with EXAMPLE_COSTS.open(newline="") as handle:
        return {(r["model"], r["benchmark"]): float(r["seconds_per_example"]) for r in csv.DictReader(handle)}


@cache
def method_factors() -> dict[str, float]:
    """method -> its cost over its members' summed cost."""
    with METHOD_COSTS.open(newline="") as handle:
        return {r["method"]: float(r["factor"]) for r in csv.DictReader(handle)}


def measured_as(benchmark: str) -> str:
    """The benchmark whose measured cost stands for ``benchmark``: every Flores direction and version is
    measured as en-de (the same fixture sentences, the same prompt shape)."""
    return "flores_en-de" if benchmark.startswith("flores_") else benchmark


@dataclass
class Estimate:
    rows: dict[str, float] = field(default_factory=dict)  # row label -> seconds
    unmeasured: list[str] = field(default_factory=list)   # no measured cost: a model, a model on a benchmark, a task
    assumed: list[str] = field(default_factory=list)      # methods counted at 1x their members

    @property
    def seconds(self) -> float:
        return sum(self.rows.values())


def estimate(recipe) -> Estimate:
    """The estimate of ``recipe`` (a loaded Recipe, overrides applied) run from scratch."""
    from ensemble_bench.recipe import selected_benchmarks
    from ensemble_bench.tasks.recipe_tasks import include_folders, task_index_of

    found = Estimate()
    tasks = selected_benchmarks(recipe, task_index_of(recipe, include_folders(recipe)))
    factors = method_factors()
    measured = {model for model, _ in member_costs()}
    for row in recipe.plan:
        if row.method not in factors and row.method not in found.assumed:
            found.assumed.append(row.method)
        factor = factors.get(row.method, 1.0)
        models = [recipe.members[i].model for i in row.members]
        seconds = 0.0
        for bench, _, limit in tasks:
            costs = [member_costs().get((model, measured_as(bench.name))) for model in models]
            missing = [model if model not in measured else f"{model} on {bench.name}"
                       for model, cost in zip(models, costs) if cost is None]
            missing += [f"{bench.name} without a limit (every example)"] if limit is None else []
            found.unmeasured += [what for what in missing if what not in found.unmeasured]
            if not missing:
                seconds += limit * factor * sum(costs)
        found.rows[row.label] = seconds
    return found


def duration_text(seconds: float) -> str:
    """``40 s``, ``12 min``, ``2 h 05 min``."""
    minutes = round(seconds / 60)
    if seconds < 60:
        return f"{round(seconds)} s"
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def combined(estimates: dict[str, Estimate]) -> Estimate:
    """Several recipes' estimates (by recipe name) as one, its rows named ``<recipe>/<row>``."""
    total = Estimate()
    for name, one in estimates.items():
        total.rows.update({f"{name}/{label}": seconds for label, seconds in one.rows.items()})
        total.unmeasured += [what for what in one.unmeasured if what not in total.unmeasured]
        total.assumed += [method for method in one.assumed if method not in total.assumed]
    return total


def estimate_lines(found: Estimate, title: str = "estimate", costliest: int = 3) -> list[str]:
    """A line with the total (and the ``costliest`` rows), and a line each for what it leaves out."""
    if not found.rows or (found.unmeasured and not found.seconds):
        shown = ", ".join(found.unmeasured[:4]) + (", ..." if len(found.unmeasured) > 4 else "")
        return [f"{title}: none (no measured cost for {shown})"]
    top = sorted(found.rows.items(), key=lambda item: -item[1])[:costliest]
    rows = f"{len(found.rows)} rows" + ("; costliest " + ", ".join(f"{label} {duration_text(seconds)}"
                                                                   for label, seconds in top) if top else "")
    lines = [f"{title}: about {duration_text(found.seconds)} from scratch ({rows})"]
    if found.unmeasured:
        lines.append(f"{title} leaves out (no measured cost): {', '.join(found.unmeasured)}")
    if found.assumed:
        lines.append(f"{title} counts {', '.join(found.assumed)} at 1x their members (no measured figure)")
    return lines
