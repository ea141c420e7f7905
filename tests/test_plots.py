"""Plots and the SweetSpan Table 7-style sweep table from synthetic finished runs."""

import json
import sys

import pytest

from ensemble_bench.cli import main
from ensemble_bench.report.plots import parameter_records
from ensemble_bench.report.span_sweep import sweep_records, sweep_table, timed_by
from tests.fake_runs import fake_run

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
            "sweetspan-span_words=1": ("sweetspan", {"nq": (0.24, 50), "arc_c": (0.33, 50)}, {"decode_ms_per_token": 900.0}),
            "sweetspan-span_words=4": ("sweetspan", {"nq": (0.275, 50), "arc_c": (0.29, 50)}, {"decode_ms_per_token": 400.0})}
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
    assert (round(low, 1), round(high, 1)) == (11.2, 33.0)
    below, above = error_bar(20.0, (low, high))
    assert below == pytest.approx(20.0 - low) and above == pytest.approx(high - 20.0)
    assert error_bar(20.0, None) == (0.0, 0.0)
    both = mean_error_bar(record, ["arc_c", "nq"])  # independent errors: sqrt(w1^2 + w2^2) / 2
    arc = error_bar(30.0, record["intervals"]["arc_c"])
    assert both[0] == pytest.approx((arc[0] ** 2 + below ** 2) ** 0.5 / 2)


def test_the_span_sweep_table_shows_intervals(sweep_run):
    table = sweep_table(sweep_records([sweep_run]))
    assert list(table["nq 95%"])[0] == "[11.2, 33.0]"
