"""`ensbench regress` on synthetic run folders: identical runs pass; an accuracy drop beyond the
binomial interval and a latency-ratio slowdown fail with exit 1; a drop inside the interval passes."""

import sys

import pytest

from ensemble_bench.cli.main import main
from ensemble_bench.report.regress import accuracy_floor
from tests.fake_runs import fake_run as write_run
from tests.tolerances import FLOAT64_SUMS, assert_rounded


def fake_run(folder, rows):
    """rows: label -> (method, arc accuracy, n, ms/token)."""
    return write_run(folder, {label: (method, {"arc_c": (acc, n)}, {"decode_ms_per_token": ms})
                              for label, (method, acc, n, ms) in rows.items()})


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


def test_the_guard_uses_the_shared_interval_code(tmp_path, monkeypatch, capsys):
    """z and the standard error come from report/stats.py; the table shows each accuracy with its
    95% Wilson interval (42% of 200: [35.4, 48.9])."""
    from ensemble_bench.report import stats

    se = stats.difference_standard_error(0.42, 200, 200)
    assert accuracy_floor(0.42, 200, 200, 0.95) == pytest.approx(0.42 - stats.z_value(0.95, sides=1) * se)
    assert_rounded(1.6449, stats.z_value(0.95, sides=1), 4, FLOAT64_SUMS)
    code, out = regress(monkeypatch, capsys, fake_run(tmp_path / "now", BASE), fake_run(tmp_path / "base", BASE))
    assert code == 0 and "42.0 [35.4, 48.9]" in out and "95% Wilson interval" in out


def test_a_declared_paper_row_is_not_a_different_recipe():
    """`paper_row:` names a table row; it changes no number, so a baseline without it still matches."""
    from ensemble_bench.recipe import parse_recipe
    from ensemble_bench.report.regress import recipe_difference

    members = [{"model": "smollm2-135m", "name": "a"}, {"model": "qwen2.5-0.5b", "name": "b"}]
    recipe = {"name": "reg", "members": members,
              "method": {"name": "gac"}, "singles": True, "data": "offline", "tasks": [{"name": "arc_c", "limit": 200}]}
    declared = {**recipe, "members": [{**recipe["members"][0], "paper_row": "openchat_3.5"}, recipe["members"][1]],
                "method": {"name": "gac", "paper_row": "GaC (ours)"}}
    assert recipe_difference(parse_recipe(declared), parse_recipe(recipe)) is None
    other = {**recipe, "members": [{**recipe["members"][0], "dtype": "bfloat16"}, recipe["members"][1]]}
    assert "dtype" in recipe_difference(parse_recipe(other), parse_recipe(recipe))
