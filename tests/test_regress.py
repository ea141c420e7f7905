"""`ensbench regress` on synthetic run folders: identical runs pass; an accuracy drop beyond the
binomial interval and a latency-ratio slowdown fail with exit 1; a drop inside the interval passes."""

import json
import sys

import pytest
import yaml

from ensemble_bench.cli import main
from ensemble_bench.report.regress import accuracy_floor


def fake_run(folder, rows):
    """rows: label -> (method, arc accuracy, n, ms/token)."""
    folder.mkdir(parents=True)
    recipe = {"name": "reg", "members": [{"model": "smollm2-135m", "name": "a"}, {"model": "qwen2.5-0.5b", "name": "b"}],
              "method": "gac", "singles": True, "data": "offline", "tasks": [{"name": "arc_c", "limit": 200}]}
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (folder / "summary.md").write_text("done\n")
    for label, (method, acc, n, ms) in rows.items():
        row = folder / label
        row.mkdir()
        (row / "timing.json").write_text(json.dumps({"label": label, "method": method, "decode_ms_per_token": ms}))
        (row / "results_1.json").write_text(json.dumps({"results": {"arc_challenge": {"acc,none": acc}},
                                                        "n-samples": {"arc_challenge": {"effective": n}}}))
    return folder


BASE = {"a": ("single", 0.30, 200, 100.0), "b": ("single", 0.40, 200, 200.0), "gac": ("gac", 0.42, 200, 310.0)}


def regress(monkeypatch, capsys, current, baseline):
    monkeypatch.setattr(sys, "argv", ["ensbench", "regress", str(current), "--baseline", str(baseline)])
    try:
        main()
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    return code, capsys.readouterr().out


def test_identical_runs_pass(tmp_path, monkeypatch, capsys):
    code, out = regress(monkeypatch, capsys, fake_run(tmp_path / "now", BASE), fake_run(tmp_path / "base", BASE))
    assert code == 0 and "all 4 checks passed" in out


@pytest.mark.parametrize("change,what", [
    ({"gac": ("gac", 0.30, 200, 310.0)}, "arc_c"),            # 12 points down on 200 questions
    ({"gac": ("gac", 0.42, 200, 420.0)}, "latency ratio"),    # 1.03 -> 1.40 of the members' sum
    ({"b": ("single", 0.40, 200, 100.0)}, "latency ratio"),   # the members got faster, the ensemble did not
])
def test_a_regression_fails_with_a_table(tmp_path, monkeypatch, capsys, change, what):
    current = fake_run(tmp_path / "now", {**BASE, **change})
    code, out = regress(monkeypatch, capsys, current, fake_run(tmp_path / "base", BASE))
    assert code == 1 and "REGRESSED" in out and what in out and "checks regressed" in out


def test_a_drop_within_the_binomial_interval_passes(tmp_path, monkeypatch, capsys):
    floor = accuracy_floor(0.42, 200, 200, 0.95)
    assert 0.42 - 0.09 < floor < 0.42 - 0.05  # 1.645 * sqrt(.42 * .58 * 2 / 200) = 0.081
    current = fake_run(tmp_path / "now", {**BASE, "gac": ("gac", 0.36, 200, 310.0)})
    code, _ = regress(monkeypatch, capsys, current, fake_run(tmp_path / "base", BASE))
    assert code == 0


def test_span_sweep_table_and_plot(tmp_path):
    from ensemble_bench.report.span_sweep import plot_sweep, sweep_table

    records = [{"label": "a", "span_words": None, "scores": {"nq": 20.0, "gsm8k": 30.0}, "ms_per_token": 100.0},
               {"label": "b", "span_words": None, "scores": {"nq": 25.0, "gsm8k": 10.0}, "ms_per_token": 200.0},
               {"label": "Span-4", "span_words": 4, "scores": {"nq": 27.5, "gsm8k": 29.0}, "ms_per_token": 400.0},
               {"label": "Span-1", "span_words": 1, "scores": {"nq": 24.0, "gsm8k": 33.0}, "ms_per_token": 900.0}]
    table = sweep_table(records)
    assert list(table["system"]) == ["a", "b", "Span-1", "Span-4"]
    assert list(table["nq"]) == ["20.00", "25.00", "24.00 (-1.00)", "27.50 (+2.50)"]
    assert list(table["gsm8k"])[2:] == ["33.00 (+3.00)", "29.00 (-1.00)"]
    written = plot_sweep(records, tmp_path / "curve", "test")
    assert [p.suffix for p in written] == [".png", ".svg"] and all(p.stat().st_size > 1000 for p in written)
