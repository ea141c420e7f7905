"""Plots and the SweetSpan Table 7-style sweep table from synthetic finished runs."""

import json
import sys

import pytest

from ensemble_bench.cli.main import main
from ensemble_bench.report.plots import parameter_records
from ensemble_bench.report.span_sweep import sweep_records, sweep_table, timed_by
from tests.fake_runs import fake_run
from tests.tolerances import FLOAT64_SUMS, assert_rounded

RECIPE = {"name": "sweep", "members": [{"model": "smollm2-135m", "name": "a"}, {"model": "qwen2.5-0.5b", "name": "b"}],
          "method": "sweetspan", "singles": True, "data": "offline", "sweep": {"span_words": [1, 4]},
          "tasks": [{"name": "nq", "limit": 50}, {"name": "arc_c", "limit": 50}]}


def with_params(run, params):
    for label, values in params.items():
        path = run / label / "timing.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "params": values}))
    return run


@pytest.fixture()
def sweep_run(tmp_path):
    rows = {"a": ("single", {"nq": (0.20, 50), "arc_c": (0.30, 50)}, {"decode_ms_per_token": 100.0}),
            "b": ("single", {"nq": (0.25, 50), "arc_c": (0.10, 50)}, {"decode_ms_per_token": 200.0}),
            "sweetspan-span_words=1": ("sweetspan", {"nq": (0.24, 50), "arc_c": (0.33, 50)},
                                       {"decode_ms_per_token": 900.0}),
            "sweetspan-span_words=4": ("sweetspan", {"nq": (0.275, 50), "arc_c": (0.29, 50)},
                                       {"decode_ms_per_token": 400.0})}
    run = fake_run(tmp_path / "run", rows, RECIPE)
    return with_params(run, {"sweetspan-span_words=1": {"span_words": 1}, "sweetspan-span_words=4": {"span_words": 4}})


def test_span_sweep_table(sweep_run):
    table = sweep_table(sweep_records([sweep_run]))
    assert list(table["system"]) == ["a", "b", "Span-1", "Span-4"]
    assert list(table["nq"]) == ["20.00", "25.00", "24.00 (-1.00)", "27.50 (+2.50)"]
    assert list(table["arc_c"])[2:] == ["33.00 (+3.00)", "29.00 (-1.00)"]


def test_span_sweep_latency_comes_from_the_timing_run(sweep_run, tmp_path):
    rows = {"a": ("single", {"nq": (0.5, 8)}, {"decode_ms_per_token": 50.0}),
            "b": ("single", {"nq": (0.5, 8)}, {"decode_ms_per_token": 60.0}),
            "sweetspan-span_words=4": ("sweetspan", {"nq": (0.5, 8)}, {"decode_ms_per_token": 300.0})}
    timing_run = with_params(fake_run(tmp_path / "timing", rows, {**RECIPE, "sweep": {"span_words": [4]}}),
                             {"sweetspan-span_words=4": {"span_words": 4}})
    table = sweep_table(timed_by(sweep_records([sweep_run]), sweep_records([timing_run])))
    assert list(table["ms/token"]) == ["50.0", "60.0", "", "300.0"]  # Span-1 was not timed there
    assert list(table["nq"])[3] == "27.50 (+2.50)"  # scores stay the sweep's


@pytest.mark.parametrize("extra", [["--param", "span_words"], []])
def test_plot_command_writes_png_and_svg(sweep_run, tmp_path, monkeypatch, extra):
    monkeypatch.setattr(sys, "argv", ["ensbench", "plot", str(sweep_run), "--out", str(tmp_path / "fig"), *extra])
    main()
    assert all((tmp_path / f"fig{suffix}").stat().st_size > 1000 for suffix in (".png", ".svg"))


def test_threshold_records_carry_the_ensembled_share(tmp_path):
    recipe = {**RECIPE, "method": {"name": "gac", "gate": "a", "threshold": 0.5}, "sweep": {"threshold": [0.5]}}
    rows = {"a": ("single", {"nq": (0.2, 50)}, {"decode_ms_per_token": 100.0}),
            "b": ("single", {"nq": (0.25, 50)}, {"decode_ms_per_token": 200.0}),
            "gac-threshold=0.5": ("gac", {"nq": (0.3, 50)}, {"decode_ms_per_token": 150.0, "ensembled_fraction": 0.4})}
    run = with_params(fake_run(tmp_path / "run", rows, recipe), {"gac-threshold=0.5": {"threshold": 0.5}})
    gated = [r for r in parameter_records([run], "threshold") if r["value"] is not None]
    assert [(r["value"], r["ensembled_pct"], r["scores"]["nq"]) for r in gated] == [(0.5, 40.0, 30.0)]


def test_plotting_an_unswept_parameter_is_one_line(sweep_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["ensbench", "plot", str(sweep_run), "--out", str(tmp_path / "f"), "--param", "k"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2 and "no row of the runs sets 'k'" in capsys.readouterr().err


def test_records_carry_intervals_and_the_plots_draw_them_as_error_bars(sweep_run):
    from ensemble_bench.report.plots import error_bar, mean_error_bar

    record = next(r for r in parameter_records([sweep_run]) if r["label"] == "a")
    low, high = record["intervals"]["nq"]  # Wilson of 10 in 50: [11.2, 33.0]
    assert_rounded((11.2, 33.0), (low, high), 1, FLOAT64_SUMS)
    below, above = error_bar(20.0, (low, high))
    assert below == pytest.approx(20.0 - low) and above == pytest.approx(high - 20.0)
    assert error_bar(20.0, None) == (0.0, 0.0)
    both = mean_error_bar(record, ["arc_c", "nq"])  # independent errors: sqrt(w1^2 + w2^2) / 2
    arc = error_bar(30.0, record["intervals"]["arc_c"])
    assert both[0] == pytest.approx((arc[0] ** 2 + below ** 2) ** 0.5 / 2)


def test_the_span_sweep_table_shows_intervals(sweep_run):
    table = sweep_table(sweep_records([sweep_run]))
    assert list(table["nq 95%"])[0] == "[11.2, 33.0]"


def test_a_multiple_choice_run_is_plotted_by_ms_per_request(tmp_path, monkeypatch, capsys):
    """Multiple-choice rows have no ms/token: the plot reads ms/request, and the row without one
    is named in one warning line."""
    recipe = {**RECIPE, "method": "gac", "sweep": None, "tasks": [{"name": "arc_c", "limit": 50}]}
    rows = {"a": ("single", {"arc_c": (0.3, 50)}, {"loglikelihood_ms_per_request": 10.0}),
            "b": ("single", {"arc_c": (0.2, 50)}, {}),
            "gac": ("gac", {"arc_c": (0.4, 50)}, {"loglikelihood_ms_per_request": 25.0})}
    run = fake_run(tmp_path / "run", rows, recipe)
    monkeypatch.setattr(sys, "argv", ["ensbench", "plot", str(run), "--out", str(tmp_path / "fig")])
    main()
    assert (tmp_path / "fig.svg").stat().st_size > 1000
    assert "ms/request" in (tmp_path / "fig.svg").read_text()
    assert capsys.readouterr().err.splitlines() == [
        "warning: row b is left out of the plot: it has no ms/request, multiple choice"]


def test_a_row_of_one_round_keeps_its_ms_per_token(sweep_run, tmp_path):
    """A SweetSpan row whose answers all fit one span has no decode step: its first round's time per
    token is its ms/token, in the records, the plot and the tables."""
    from ensemble_bench.report.plots import plot_accuracy_latency
    from ensemble_bench.report.tables import build_run_table

    path = sweep_run / "sweetspan-span_words=4" / "timing.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "decode_ms_per_token": None,
                                "first_round_ms_per_token": 120.0}))
    records = parameter_records([sweep_run])
    assert [r["ms_per_token"] for r in records] == [100.0, 200.0, 900.0, 120.0]
    dropped = []
    plot_accuracy_latency(records, tmp_path / "fig", "t", warn=dropped.append)
    assert dropped == []
    frame, _ = build_run_table([sweep_run])
    assert list(frame["ms/token"]) == [100.0, 200.0, 900.0, 120.0]


def test_a_row_without_latency_is_named_not_dropped_silently(sweep_run, tmp_path):
    from ensemble_bench.report.plots import plot_accuracy_latency

    records = parameter_records([sweep_run])
    records[1] = {**records[1], "ms_per_token": None}
    dropped = []
    plot_accuracy_latency(records, tmp_path / "fig", "t", warn=dropped.append)
    assert dropped == ["row b is left out of the plot: it has no ms/token"]


def test_multiple_choice_requests_are_timed_per_request_and_per_token(bpe_model, bpe_tokenizer):
    """The lm-eval adapter times the log-likelihood path: ms per request and per scored token
    (the continuations' tokens in the first member's tokenizer), the keys the reports read."""
    from lm_eval.api.instance import Instance

    from ensemble_bench.members import LocalMember
    from ensemble_bench.methods.single import Single
    from ensemble_bench.run.lm import EnsembleLM

    member = LocalMember(bpe_model, bpe_tokenizer, "s")
    lm = EnsembleLM(Single([member], Single.Params(), batch_size=2), "s")
    pairs = [("The cat sat on the", " mat"), ("The cat sat on the", " red chair")]
    lm.loglikelihood([Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=0,
                               metadata=("piqa", k, 1)) for k, pair in enumerate(pairs)])
    stats = lm.scoring.summary()
    tokens = sum(len(member.encode(c, add_special_tokens=False)) for _, c in pairs)
    assert (stats["requests_scored"], stats["tokens_scored"]) == (2, tokens)
    assert stats["loglikelihood_ms_per_request"] > 0
    assert stats["loglikelihood_ms_per_token"] == pytest.approx(stats["loglikelihood_ms_per_request"] * 2 / tokens)


def test_a_first_round_of_a_span_counts_its_tokens():
    """A span-level first round chooses several tokens per row: a row that ends there gets that
    round's time per token (decode_ms_per_token stays None: no decode step happened)."""
    from ensemble_bench.decoding.method import Timing

    timing = Timing()
    timing.start_batch()
    timing.first_token(steps=4.0)
    summary = timing.summary()
    assert summary["decode_ms_per_token"] is None
    assert summary["first_round_ms_per_token"] == pytest.approx(1000 * timing.first_token_seconds / 4.0)


def test_a_parameter_stored_under_an_old_name_is_read_by_its_name(sweep_run):
    """timing.json is read as RunStats: SweetSpan's `lambda`, once stored as `filter_ratio`, plots as lambda."""
    with_params(sweep_run, {"sweetspan-span_words=1": {"span_words": 1, "filter_ratio": 0.25}})
    values = {r["label"]: r["value"] for r in parameter_records([sweep_run], "lambda")}
    assert values["sweetspan-span_words=1"] == 0.25 and values["a"] is None
