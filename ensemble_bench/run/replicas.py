"""Data-parallel replicas: R copies of the whole ensemble, each in its own Ray actor (``placement:
{kind: ray, replicas: R}``).

The driver forms a task's chunks exactly as one process forms them (``EnsembleLM._chunks`` over the full
request list) and hands whole chunks to free replicas (run/replica_server.py); each chunk's answers are
cached (``cache_chunk``) as they arrive, in any order. So every sample and score equals the one-process
run's at the same batch size, and a killed run resumes with the chunks it finished, whichever replica
computed them: a finished chunk ends where the context changes, so greedy chunking of the requests left
forms exactly the chunks left (tests/run/test_replicas.py proves it for any set of finished chunks).

A replica that dies (actor killed, out of memory) loses its chunk in flight only: the chunk goes back to
the queue for the others; when none is left, the run stops in one line and resumes from the cache.

Statistics are joined as one process would report them: counters added (or the largest kept, ``peak``),
request records and span traces put in chunk order, then the method's report is made by one replica over
those joined counters (``ReplicaServer.report``). timing.json's ``replicas`` says how the work was spread.
The lm-eval model of such a row is run/lm.py's ``ReplicatedLM``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ensemble_bench.decoding.method import NonFiniteScore
from ensemble_bench.errors import EnvironmentFault
from ensemble_bench.members.remote import connect, launch, wait_placed
from ensemble_bench.recipe import Recipe
from ensemble_bench.run.replica_server import ReplicaServer, replica_options
from ensemble_bench.run.sittings import joined

log = logging.getLogger(__name__)


class Replicas:
    """The replica actors of a run: launched on first use (all together, so they load side by side),
    shared by its rows, killed by ``close``."""

    def __init__(self, recipe: Recipe):
        self.recipe = recipe
        self.actors: list = []
        self.live: list[int] = []

    def begin(self, label: str, lm_class: type) -> dict[str, Any]:
        """Every live replica builds the method of row ``label`` in an ``lm_class`` (run/lm.py's model of
        the row's method); replica 0's description of it."""
        if not self.actors:
            placement = self.recipe.placement
            connect(placement.address, placement.num_cpus, placement.num_gpus)
            options = replica_options(self.recipe)
            self.actors = [launch(self.recipe, options, server=ReplicaServer) for _ in range(placement.replicas)]
            self.live = list(range(len(self.actors)))
            wait_placed({f"replica {r + 1}": a for r, a in enumerate(self.actors)}, placement.schedule_timeout,
                        what="replica")
        import ray

        described = []
        for replica in list(self.live):
            try:
                described.append(self._get(self.actors[replica].begin.remote(label, lm_class)))
            except ray.exceptions.RayActorError as err:
                self._lost(replica, err)
        return described[0]

    def call(self, name: str, *args):
        """``name(*args)`` on the first live replica."""
        return self._get(getattr(self.actors[self.live[0]], name).remote(*args))

    @staticmethod
    def _get(ref):
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as err:  # the replica's own error (a UserError, a NaN score): as raised
            cause = getattr(err, "cause", None)
            raise (cause if isinstance(cause, Exception) else err) from None

    def answer(self, kind: str, batches: list[list[tuple]]) -> Iterator[tuple[int, int, dict]]:
        """(replica, batch number, reply) for every batch, in the order they finish; a batch whose replica
        died goes to another."""
        import ray

        queue, flying = deque(range(len(batches))), {}
        idle = list(self.live)
        while queue or flying:
            while queue and idle:
                replica, number = idle.pop(0), queue.popleft()
                flying[self.actors[replica].answer.remote(kind, batches[number])] = (replica, number)
            [ref], _ = ray.wait(list(flying), num_returns=1)
            replica, number = flying.pop(ref)
            try:
                reply = self._get(ref)
            except ray.exceptions.RayActorError as err:
                self._lost(replica, err)
                queue.appendleft(number)
                continue
            except NonFiniteScore as err:
                raise Located(number, err) from None
            idle.append(replica)
            yield replica, number, reply

    def _lost(self, replica: int, err: Exception) -> None:
        self.live.remove(replica)
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        if not self.live:
            raise EnvironmentFault(f"all {len(self.actors)} replicas died (the last: {first}); the batches they "
                                   "finished are cached: run the same command again to resume")
        log.warning("replica %d died (%s): its batch goes to the %d left", replica + 1, first, len(self.live))

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors, self.live = [], []


class Located(Exception):
    """A replica's NonFiniteScore with the number of its batch (named by the driver, ``_located``)."""

    def __init__(self, number: int, err: NonFiniteScore):
        super().__init__(str(err))
        self.number, self.err = number, err


@dataclass
class ReplicaClock:
    """How the row's work was spread: each replica's busy seconds and batches, the driver's wall seconds."""

    busy_seconds: list[float]
    batches: list[int]
    wall_seconds: float = 0.0

    def summary(self) -> dict:
        busiest = max(self.busy_seconds)
        mean = sum(self.busy_seconds) / len(self.busy_seconds)
        return {"count": len(self.busy_seconds), "wall_seconds": self.wall_seconds,
                "busy_seconds": self.busy_seconds, "batches": self.batches,
                "balance": mean / busiest if busiest else None,  # 1: every replica as busy as the busiest
                "busy_fraction": sum(self.busy_seconds) / (len(self.busy_seconds) * self.wall_seconds)
                if self.wall_seconds else None}


@dataclass
class Joined:
    """The row's counters per replica and earlier sittings, its request records and traces by batch."""

    joins: dict[str, dict[str, str]]
    earlier: dict = field(default_factory=dict)
    counts: dict[int, dict] = field(default_factory=dict)
    records: dict[tuple[int, int], dict] = field(default_factory=dict)  # (pass, batch) -> records it added
    traces: dict[tuple[int, int], list] = field(default_factory=dict)

    def snapshot(self) -> dict:
        """One process's counters (sittings.snapshot's form): earlier sittings' records first, then by batch."""
        records: dict[str, dict[str, list]] = {}
        for key, fields_ in self.joins.items():
            for name, rule in fields_.items():
                if rule == "records":
                    earlier = (self.earlier.get(key) or {}).get(name) or []
                    later = [r for k in sorted(self.records) for r in self.records[k].get(key, {}).get(name, [])]
                    records.setdefault(key, {})[name] = [*earlier, *later]
        return joined(self.joins, [self.earlier, *self.counts.values()], records)
