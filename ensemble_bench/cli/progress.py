"""What a run shows while it works: one bar (a terminal) or lines (a log) per row, from the moment the
row starts loading: the members being loaded and for how long, then the examples done of every task
(``piqa 10 of 10, nq 3 of 10``), the row's true elapsed time and an ETA. A row's clock starts when
the row starts loading (``loading``), not at an earlier line about it (a response cache it starts
from), so no row counts the rows computed before it; its rate counts its evaluation only (from
``evaluating``), so a long first load (EVA learning its map) does not read as 0.00 examples/s.

lm-eval asks a row's model once per request kind (a pass: every multiple-choice task, then every
generation task, ...); the adapter (lm.py) reports after each batch the examples it finished and the
examples of the pass, per task. The ETA is that of the pass in progress, at the pass's own rate. A long
first use after the members load (EVA learning its map) says its stage, the fraction done and an ETA at
that stage's rate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the display reads a stage's fields only: importing members would import torch
    from ensemble_bench.members.loading import Stage

STAGE_LINE_EVERY = 5.0  # seconds between two lines of one long stage in a log
FINISHED_STATES = ("reused from", "kept from")  # the runner's row states that end a row without computing it
Counts = Mapping[str, int]  # task name -> examples ("" for requests without a task name)


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes} min {seconds:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def rate(done: int, seconds: float) -> str:
    """``2.50 examples/s``, or below one a second ``6.7 s/example`` (``2 min 05 s/example``)."""
    if done >= seconds:
        return f"{done / seconds:.2f} examples/s"
    each = seconds / done
    return f"{each:.1f} s/example" if each < 60 else f"{duration(each)}/example"


def as_counts(value: Counts | int | None) -> dict[str, int]:
    """Per-task counts; a bare number (an untitled pass) counts for the task ``""``."""
    if value is None:
        return {}
    return {"": int(value)} if isinstance(value, int) else dict(value)


class RowClock:
    """One row's examples per task, its elapsed time since it started (loading included), its rate since
    its evaluation started and the ETA of the pass in progress."""

    def __init__(self, now: float):
        self.started = now
        self.evaluation_started = now  # until the row says it is evaluating
        self.last_report = now  # a new pass starts when the previous one reported its last batch
        self.tasks: dict[str, list[int]] = {}  # task -> [done, total]
        self.pass_started = now
        self.pass_done = 0
        self.pass_total: int | None = None

    @property
    def done(self) -> int:
        return sum(done for done, _ in self.tasks.values())

    @property
    def total(self) -> int | None:
        """The examples known so far (the passes that have begun), None while none is."""
        totals = [total for _, total in self.tasks.values()]
        return sum(totals) if totals and all(totals) else None

    def evaluating(self, now: float) -> None:
        """The members are loaded: the first pass starts now."""
        self.last_report = self.evaluation_started = now

    def add(self, done: Counts | int, total: Counts | int | None, now: float) -> None:
        done, total = as_counts(done), as_counts(total)
        if self.pass_total is None or self.pass_done >= self.pass_total:  # a new pass
            self.pass_started, self.pass_done = self.last_report, 0
            self.pass_total = sum(total.values()) or None
            for task, count in total.items():
                self.tasks.setdefault(task, [0, 0])[1] += count
        self.pass_done += sum(done.values())
        for task, count in done.items():
            entry = self.tasks.setdefault(task, [0, 0])
            entry[0] += count
            entry[1] = max(entry[1], entry[0]) if entry[1] else 0
        self.last_report = now

    def counts(self) -> str:
        """``piqa 10 of 10, nq 3 of 10 examples done`` (``8 examples done`` without totals)."""
        parts = [f"{task} " * bool(task) + (f"{done} of {total}" if total else f"{done}")
                 for task, (done, total) in self.tasks.items()]
        return f"{', '.join(parts) or '0'} examples done"

    def eta(self, now: float) -> float | None:
        """Seconds left in the pass in progress at its rate so far; None before its first batch."""
        spent = now - self.pass_started
        if not self.pass_total or not self.pass_done or spent <= 0:
            return None
        return spent / self.pass_done * max(0, self.pass_total - self.pass_done)

    def line(self, now: float) -> str:
        elapsed = now - self.started
        text = f"{self.counts()}, {duration(elapsed)} elapsed"
        eta = self.eta(now)
        if eta is not None:
            text += f", ETA {duration(eta)}"
        evaluated = now - self.evaluation_started
        return text + (f", {rate(self.done, evaluated)}" if evaluated > 0 and self.done else "")


class LoadClock:
    """The member being loaded and since when, for the line that says so; a long stage's start."""

    def __init__(self):
        self.started: dict[str, float] = {}
        self.stages: dict[str, float] = {}

    def text(self, member: str, event: str | Stage, now: float) -> str:
        """``loading qwen2.5``, ``converting qwen2.5's GGUF once ...``, ``qwen2.5 loaded in 0.9 s``,
        ``<stage>: 40%, 1 min 02 s elapsed, ETA 1 min 33 s``."""
        if not isinstance(event, str):  # a Stage
            spent = now - self.stages.setdefault(event.what, now)
            text = f"{event}, {duration(spent)} elapsed"
            if 0 < event.done < 1 and spent > 0:
                text += f", ETA {duration(spent / event.done * (1 - event.done))}"
            return text
        if event == "loading":
            self.started[member] = now
            return f"loading {member}"
        if event == "loaded":
            return f"{member} loaded in {now - self.started.pop(member, now):.1f} s"
        if event == "converting":
            return f"converting {member}'s GGUF once (first use; later runs load the converted weights)"
        return f"{member}: {event}"


class PlainProgress:
    """Progress for a log (stdout not a terminal): a line per row state and member load, and a line per
    finished batch with the examples done per task, the row's elapsed time, an ETA and the rate,
    instead of a live bar that a log shows only at the end."""

    def __init__(self, write=print, clock: Callable[[], float] | None = None):
        self.write = write
        self.clock = clock or time.perf_counter
        self.rows: dict[str, RowClock] = {}
        self.loads = LoadClock()
        self.current: str | None = None
        self.stage_line = -math.inf

    def _row(self, label: str) -> RowClock:
        return self.rows.setdefault(label, RowClock(self.clock()))

    def on_row(self, row, state: str) -> None:
        if state == "loading":  # the row starts now: earlier lines about it (a cache it starts from) do not count
            self.rows.pop(row.label, None)
        clock, self.current = self._row(row.label), row.label
        if state == "evaluating":  # how long the loading took
            clock.evaluating(self.clock())
            state += f", {duration(self.clock() - clock.started)} elapsed"
        self.write(f"{row.label}: {state}", flush=True)

    def on_load(self, member: str, event: str | Stage) -> None:
        now = self.clock()
        if not isinstance(event, str) and event.done < 1:  # a Stage: a line every few seconds, and its last
            if now - self.stage_line < STAGE_LINE_EVERY:
                self.loads.text(member, event, now)  # the stage's clock starts at its first report (0%)
                return
            self.stage_line = now
        self.write(f"{self.current or member}: {self.loads.text(member, event, now)}", flush=True)

    def on_progress(self, label: str, done, total) -> None:
        now = self.clock()
        row = self._row(label)
        row.add(done, total, now)
        self.write(f"{label}: {row.line(now)}", flush=True)


class BarProgress:
    """One rich bar per row on a terminal: what it is doing (loading a member, the examples done per
    task), the bar, the row's elapsed time (live, loading included) and the ETA of the pass."""

    def __init__(self, progress, clock: Callable[[], float] | None = None):
        self.progress = progress
        self.clock = clock or time.perf_counter
        self.bars: dict[str, int] = {}
        self.rows: dict[str, RowClock] = {}
        self.loads = LoadClock()
        self.current: str | None = None

    @staticmethod
    def columns():
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

        return (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), TextColumn("{task.fields[eta]}"))

    def on_row(self, row, state: str) -> None:
        label, self.current = row.label, row.label
        if label not in self.bars:
            self.bars[label] = self.progress.add_task(label, total=None, eta="")
            self.rows[label] = RowClock(self.clock())
        elif state == "loading":  # the row starts now: its bar's clock too
            self.progress.reset(self.bars[label])
            self.rows[label] = RowClock(self.clock())
        if state == "evaluating":
            self.rows[label].evaluating(self.clock())
        self.progress.update(self.bars[label], description=f"{label}: {state}")
        if state.startswith(FINISHED_STATES):  # nothing to compute: a full bar that stops its clock
            self.progress.update(self.bars[label], total=1, completed=1)
            self.progress.stop_task(self.bars[label])

    def on_load(self, member: str, event: str | Stage) -> None:
        if self.current in self.bars:
            text = self.loads.text(member, event, self.clock())
            self.progress.update(self.bars[self.current], description=f"{self.current}: {text}")

    def on_progress(self, label: str, done, total) -> None:
        now, row = self.clock(), self.rows[label]
        row.add(done, total, now)
        eta = row.eta(now)
        self.progress.update(self.bars[label], completed=row.done, total=row.total,
                             description=f"{label}: {row.counts()}",
                             eta=f"ETA {duration(eta)}" if eta is not None else "")
