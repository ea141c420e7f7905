"""A long first use after the members load (EVA learning its map) in the progress display (progress.py):
its stage, the fraction done, the time taken and an ETA, a line every few seconds in a log."""

from __future__ import annotations

from types import SimpleNamespace

from ensemble_bench.cli.progress import STAGE_LINE_EVERY, BarProgress, PlainProgress
from ensemble_bench.members.loading import Stage


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_stage_says_its_fraction_elapsed_time_and_eta_every_few_seconds():
    lines, clock = [], Clock()
    progress = PlainProgress(write=lambda text, flush=False: lines.append(text), clock=clock)
    progress.on_row(SimpleNamespace(label="eva"), "loading")
    for step in range(41):  # a report every half second, 20 s in all
        clock.now = 100.0 + step / 2
        progress.on_load("smollm2", Stage("map, similarity", step / 40))
    assert lines[0] == "eva: loading"
    assert lines[1] == "eva: map, similarity: 0%, 0 s elapsed"
    assert lines[2] == f"eva: map, similarity: {STAGE_LINE_EVERY / 20:.0%}, 5 s elapsed, ETA 15 s"
    assert lines[-1] == "eva: map, similarity: 100%, 20 s elapsed"  # the last report is always said
    assert len(lines) == 2 + 20 // STAGE_LINE_EVERY


def test_a_bar_shows_every_report_of_a_stage():
    described = []
    bars = SimpleNamespace(add_task=lambda *a, **k: 0, update=lambda task, **fields: described.append(fields))
    clock = Clock()
    progress = BarProgress(bars, clock=clock)
    progress.on_row(SimpleNamespace(label="eva"), "loading")
    progress.on_load("smollm2", Stage("map, similarity", 0.0))
    clock.now = 30.0
    progress.on_load("smollm2", Stage("map, similarity", 0.25))
    assert described[-1]["description"] == "eva: map, similarity: 25%, 30 s elapsed, ETA 1 min 30 s"
