"""What a run shows while it works (progress.py): per-task counts, the row's true elapsed time, an ETA,
and the members loading."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ensemble_bench.cli.progress import BarProgress, PlainProgress, rate

ROW = SimpleNamespace(label="gac")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def plain():
    lines, clock = [], Clock()
    return PlainProgress(write=lambda text, flush=False: lines.append(text), clock=clock), lines, clock


def start(progress, clock, row, loading: float, evaluating: float) -> None:
    """The row starts loading at ``loading`` and evaluates from ``evaluating``."""
    clock.now = loading
    progress.on_row(row, "loading")
    clock.now = evaluating
    progress.on_row(row, "evaluating")


def test_elapsed_counts_from_the_row_start_not_from_its_first_batch(plain):
    """One batch holding every example, after 7 minutes: the line says 7 minutes, not 0 s."""
    progress, lines, clock = plain
    start(progress, clock, ROW, 0.0, 60.0)
    assert lines[-1] == "gac: evaluating, 1 min 00 s elapsed"
    clock.now = 420.0
    progress.on_progress("gac", {"nq": 6}, {"nq": 6})
    assert lines[-1].startswith("gac: nq 6 of 6 examples done, 7 min 00 s elapsed, ETA 0 s")


def test_counts_are_per_task_across_passes(plain):
    """A multiple-choice pass then a generation pass: each task keeps its own count (not 11 of 20)."""
    progress, lines, clock = plain
    progress.on_row(ROW, "evaluating")
    clock.now = 10.0
    progress.on_progress("gac", {"piqa": 10}, {"piqa": 10})
    clock.now = 110.0
    progress.on_progress("gac", {"nq": 1}, {"nq": 10})
    assert lines[-2].startswith("gac: piqa 10 of 10 examples done, 10 s elapsed")
    # the second pass started at the first one's last batch (10 s): 100 s for 1 example, 9 to go
    assert lines[-1].startswith("gac: piqa 10 of 10, nq 1 of 10 examples done, 1 min 50 s elapsed, ETA 15 min 00 s")


def test_a_pass_announced_before_its_first_batch_times_from_its_start(plain):
    """The adapter reports a pass's examples when it starts (nothing done yet): the ETA is timed from
    there, and the line shows the totals at once."""
    progress, lines, clock = plain
    clock.now = 5.0
    progress.on_progress("gac", {}, {"nq": 4})
    clock.now = 25.0
    progress.on_progress("gac", {"nq": 1}, {"nq": 4})
    assert lines[0].startswith("gac: nq 0 of 4 examples done, 0 s elapsed")
    assert lines[1].startswith("gac: nq 1 of 4 examples done, 20 s elapsed, ETA 1 min 00 s")


def test_a_pass_of_several_tasks_counts_each(plain):
    progress, lines, clock = plain
    progress.on_row(ROW, "evaluating")
    clock.now = 20.0
    progress.on_progress("gac", {"nq": 2, "triviaqa": 1}, {"nq": 4, "triviaqa": 4})
    assert lines[-1] == ("gac: nq 2 of 4, triviaqa 1 of 4 examples done, 20 s elapsed, ETA 33 s, "
                         "6.7 s/example")


def test_a_later_row_counts_only_its_own_time(plain):
    """Issue 47: every row's response-cache line came before the first row ran, and the last row's first
    example read "5 min 08 s elapsed, 0.05 examples/s" (the earlier rows' time)."""
    progress, lines, clock = plain
    later = SimpleNamespace(label="adafuse")
    progress.on_row(ROW, "answers cached in run/cache/gac_rank0.db are reused")
    progress.on_row(later, "answers cached in run/cache/adafuse_rank0.db are reused")
    start(progress, clock, ROW, 0.0, 0.0)
    clock.now = 300.0
    progress.on_progress("gac", {"nq": 4}, {"nq": 4})
    start(progress, clock, later, 300.0, 302.0)
    assert lines[-1] == "adafuse: evaluating, 2 s elapsed"
    clock.now = 308.0
    progress.on_progress("adafuse", {"nq": 1}, {"nq": 4})
    assert lines[-1] == "adafuse: nq 1 of 4 examples done, 8 s elapsed, ETA 18 s, 6.0 s/example"


def test_the_rate_counts_the_evaluation_not_a_long_first_load(plain):
    """Issue 47: EVA learning its map for 19 minutes showed 0.00 examples/s once it evaluated."""
    progress, lines, clock = plain
    start(progress, clock, ROW, 0.0, 1140.0)
    clock.now = 1170.0
    progress.on_progress("gac", {"nq": 1}, {"nq": 10})
    assert lines[-1] == "gac: nq 1 of 10 examples done, 19 min 30 s elapsed, ETA 4 min 30 s, 30.0 s/example"
    clock.now = 1180.0
    progress.on_progress("gac", {"nq": 9}, {"nq": 10})
    assert lines[-1] == "gac: nq 10 of 10 examples done, 19 min 40 s elapsed, ETA 0 s, 4.0 s/example"
    assert [rate(5, 2.0), rate(1, 125.0)] == ["2.50 examples/s", "2 min 05 s/example"]


def test_loading_says_which_member_and_how_long(plain):
    progress, lines, clock = plain
    progress.on_row(ROW, "loading")
    progress.on_load("qwen2.5", "loading")
    progress.on_load("qwen2.5", "converting")
    clock.now = 12.5
    progress.on_load("qwen2.5", "loaded")
    assert lines == ["gac: loading", "gac: loading qwen2.5",
                     "gac: converting qwen2.5's GGUF once (first use; later runs load the converted weights)",
                     "gac: qwen2.5 loaded in 12.5 s"]


class FakeBars:
    """rich.progress.Progress's add_task / update, recorded."""

    def __init__(self):
        self.tasks: dict[int, dict] = {}

    def add_task(self, description, total=None, **fields):
        self.tasks[len(self.tasks)] = {"description": description, "total": total, **fields}
        return len(self.tasks) - 1

    def update(self, task, **fields):
        self.tasks[task].update(fields)

    def stop_task(self, task):
        self.tasks[task]["stopped"] = True

    def reset(self, task):
        self.tasks[task]["resets"] = self.tasks[task].get("resets", 0) + 1


def test_one_bar_per_row_with_per_task_counts_and_eta():
    bars, clock = FakeBars(), Clock()
    progress = BarProgress(bars, clock=clock)
    progress.on_row(ROW, "loading")
    progress.on_load("smollm2", "loading")
    assert bars.tasks[0]["description"] == "gac: loading smollm2" and bars.tasks[0]["total"] is None
    clock.now = 30.0
    progress.on_row(ROW, "evaluating")
    clock.now = 40.0
    progress.on_progress("gac", {"piqa": 5}, {"piqa": 10})
    assert bars.tasks[0] | {} == {"description": "gac: piqa 5 of 10 examples done", "total": 10, "completed": 5,
                                  "eta": "ETA 10 s"}
    progress.on_progress("gac", {"piqa": 5}, {"piqa": 10})
    progress.on_progress("gac", {"nq": 1}, {"nq": 4})
    assert len(bars.tasks) == 1 and bars.tasks[0]["description"] == "gac: piqa 10 of 10, nq 1 of 4 examples done"
    assert (bars.tasks[0]["completed"], bars.tasks[0]["total"]) == (11, 14)


def test_a_reused_row_gets_a_full_stopped_bar():
    bars = FakeBars()
    BarProgress(bars, clock=Clock()).on_row(ROW, "reused from other-run/gac")
    assert bars.tasks[0] | {} == {"description": "gac: reused from other-run/gac", "total": 1, "completed": 1,
                                  "eta": "", "stopped": True}


def test_the_adapter_reports_examples_per_task(bpe_model, bpe_tokenizer):
    """lm.py counts a question's choices as one example, per task."""
    from lm_eval.api.instance import Instance

    from ensemble_bench.members import LocalMember
    from ensemble_bench.methods.single import Single
    from ensemble_bench.run.lm import EnsembleLM

    reports = []
    lm = EnsembleLM(Single([LocalMember(bpe_model, bpe_tokenizer, "s")], Single.Params(), batch_size=8), "s",
                    progress=lambda done, total: reports.append((done, total)))
    pairs = [("The cat sat on the", " mat"), ("The cat sat on the", " red chair"), ("A dog", " barked")]
    tasks = [("piqa", 0), ("piqa", 0), ("arc", 3)]
    lm.loglikelihood([Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=0,
                               metadata=(task, doc, 1)) for pair, (task, doc) in zip(pairs, tasks)])
    assert reports == [({}, {"piqa": 1, "arc": 1}), ({"piqa": 1, "arc": 1}, {"piqa": 1, "arc": 1})]



def test_a_bar_shown_before_its_row_starts_is_reset_when_the_row_loads():
    """The bar a response-cache line made early restarts its clock when the row starts loading."""
    bars, clock = FakeBars(), Clock()
    progress = BarProgress(bars, clock=clock)
    progress.on_row(ROW, "answers cached in run/cache/gac_rank0.db are reused")
    clock.now = 300.0
    progress.on_row(ROW, "loading")
    clock.now = 310.0
    progress.on_row(ROW, "evaluating")
    clock.now = 320.0
    progress.on_progress("gac", {"nq": 1}, {"nq": 3})
    assert bars.tasks[0]["resets"] == 1 and bars.tasks[0]["eta"] == "ETA 20 s"
    assert progress.rows["gac"].line(320.0) == "nq 1 of 3 examples done, 20 s elapsed, ETA 20 s, 10.0 s/example"
