"""One replica of the ensemble: a Ray actor holding every member and the method (placement replicas > 1).

The driver (run/replicas.py) forms the chunks of a task's requests exactly as one process forms them and
sends each whole chunk to a free replica; the replica answers it with the lm-eval adapter's own code
(``EnsembleLM.answer``), so a chunk's answers do not depend on which replica computed it. With each
answer go the replica's busy seconds, its counters so far (run/sittings.py's form) and the request
records and span traces that chunk added, which the driver puts back in request order.

Members load in the replica's own process (local placement inside it): a member on ``cuda`` (or
``cuda:i``) gets the GPUs Ray gave the replica, numbered member after member by their ``num_gpus``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from ensemble_bench.decoding.request_sampling import row_policy
from ensemble_bench.recipe import Recipe
from ensemble_bench.recipe.schema import PlacementSpec
from ensemble_bench.run.build import MemberPool, build_method
from ensemble_bench.run.sittings import counters, joins, overwrite, record_counts, records_since, snapshot


def in_process(recipe: Recipe) -> Recipe:
    """The recipe a replica builds: every member in the replica's process, GPU members on the replica's
    GPUs one after another (a member's ``cuda:i`` is its own i-th GPU)."""
    members, first = [], 0
    for spec in recipe.members:
        device = spec.device
        if device == "cuda" or device.startswith("cuda:"):
            device = f"cuda:{first + int(device.partition(':')[2] or 0)}"
        members.append(spec.model_copy(update={"device": device}))
        first += math.ceil(spec.num_gpus)
    return recipe.model_copy(update={"members": members, "placement": PlacementSpec()})


def replica_options(recipe: Recipe) -> dict[str, Any]:
    """A replica's Ray resources: its members' GPUs and custom resources summed; the CPUs of its
    largest member (members in one process step one after another), 1 by default."""
    resources: dict[str, float] = {}
    for spec in recipe.members:
        for name, amount in (spec.resources or {}).items():
            resources[name] = resources.get(name, 0) + amount
    cpus = max((spec.num_cpus for spec in recipe.members if spec.num_cpus is not None), default=1)
    return {"num_cpus": cpus, "num_gpus": sum(spec.num_gpus for spec in recipe.members), "resources": resources}


class ReplicaServer:
    """The actor: a MemberPool of the recipe's members and, for the row being evaluated, its EnsembleLM."""

    def __init__(self, recipe: Recipe, threads: int | None = None):
        self._args, self._failure = (recipe, threads), None
        self.lm = None  # run/lm.py's EnsembleLM of the row (begin)

    def placed(self) -> bool:
        return True

    def start(self) -> None:
        """Load every member (called once, right after launch, so that replicas load side by side)."""
        if self._args is None:
            return
        (recipe, threads), self._args = self._args, None
        if threads:
            torch.set_num_threads(threads)
        self.recipe = in_process(recipe)
        self.pool = MemberPool(self.recipe)
        try:
            for index in sorted({i for row in self.recipe.plan for i in row.members}):
                self.pool.get(index)
        except Exception as err:  # raised again by begin(), where the driver waits
            self._failure = err

    def begin(self, label: str, lm_class: type) -> dict[str, Any]:
        """Build the method of row ``label`` in ``lm_class`` (the row's lm-eval model, run/lm.py, with the
        row's sampling policy: a request draws here as in one process); what the driver needs of it: the
        members' names and chat templates, and how each carried counter joins another replica's."""
        self.start()
        if self._failure is not None:
            raise self._failure
        row = next(row for row in self.recipe.plan if row.label == label)
        self.lm = lm_class(build_method(self.recipe, row, self.pool), row.label, sampling=row_policy(self.recipe, row))
        members = [(m.name, m.uses_chat_template) for m in self.lm.method.members]
        return {"members": members, "joins": joins(self.lm.carried())}

    def answer(self, kind: str, batch: list[tuple]) -> dict[str, Any]:
        """A chunk's answers, with this replica's busy seconds, its counters so far and what the chunk added
        to its request records and span traces."""
        before = record_counts(self.lm.carried())
        traces_before = len(self.lm.span_traces())
        started = time.perf_counter()
        answers = self.lm.answer(kind, batch)
        busy = time.perf_counter() - started
        holders = self.lm.carried()
        return {"answers": answers, "busy": busy, "counts": counters(holders),
                "records": records_since(holders, before),
                "traces": self.lm.span_traces()[traces_before:]}

    def render(self, chat_history) -> str:
        return self.lm.apply_chat_template(chat_history)

    def report(self, counts: dict) -> dict[str, Any]:
        """The row's statistics as one process holding ``counts`` (all replicas' joined) reports them; this
        replica's own counters are put back after."""
        holders = self.lm.carried()
        own = snapshot(holders)
        overwrite(holders, counts)
        try:
            return {"info": self.lm.method.info(), "scoring": self.lm.scoring.summary(),
                    "rendered": self.lm.rendered.info()}
        finally:
            overwrite(self.lm.carried(), own)
