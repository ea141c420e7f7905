"""`ensbench table`: our rows land in the paper's rows (by label, by member / entry position),
missing rows read "not run" (never zero), extra rows are kept, `--paper` adds the published
number and the difference, and every layout's paper rows exist in the transcribed numbers."""

import sys

import pandas as pd
import pytest

from ensemble_bench.cli import main
from ensemble_bench.report.tables import (EXTRA_BLOCK, NOT_RUN, build_table, get_layout, layouts, paper_numbers,
                                          paper_rows, render)
from tests.fake_runs import fake_run

RECIPE = {"name": "t3", "members": [{"model": "smollm2-135m", "name": "small"}, {"model": "qwen2.5-0.5b", "name": "big"}],
          "singles": True, "data": "offline", "tasks": [{"name": "nq", "limit": 50}, {"name": "arc_c", "limit": 50}],
          "methods": [{"name": "rerank", "label": "rerank-ppl"}, {"name": "gac", "label": "gac"},
                      {"name": "gac", "label": "gac-t0.5", "gate": "small", "threshold": 0.5}]}
ROWS = {"small": ("single", {"nq": (0.04, 50)}, {"decode_ms_per_token": 100.0}),
        "big": ("single", {"nq": (0.06, 50)}, {"decode_ms_per_token": 250.0}),
        "rerank-ppl": ("rerank", {"nq": (0.08, 50)}, {"decode_ms_per_token": 360.0}),
        "gac": ("gac", {"nq": (0.10, 50)}, {"decode_ms_per_token": 340.0, "ensembled_fraction": 1.0}),
        "gac-t0.5": ("gac", {"nq": (0.12, 50)}, {"decode_ms_per_token": 200.0, "ensembled_fraction": 0.25})}


@pytest.fixture()
def run(tmp_path):
    return fake_run(tmp_path / "results" / "t3" / "20260101-000000-abc", ROWS, RECIPE)


def test_rows_fill_the_paper_layout(run):
    table = build_table(get_layout("gac_table3"), [run.parent], block="openchat and SOLAR")
    by_row = table.set_index("paper row")
    assert by_row.loc["openchat_3.5", "ours"] == "small" and by_row.loc["openchat_3.5", "nq"] == 4.0
    assert by_row.loc["Nous-Hermes-2-SOLAR-10.7B", "ours"] == "big"
    assert by_row.loc["GaC (ours)", "nq"] == 10.0 and by_row.loc["GaC (ours)", "latency_ms_per_token"] == 340.0
    gated = by_row.loc["GaC t=0.5 (ours)"]
    assert (gated["nq"], gated["ensembled_pct"]) == (12.0, 25.0)
    for missing in ("LLM Blender (PairRanker)", "OAssistRM", "UltraRM", "FuseLLM"):
        assert by_row.loc[missing, "ours"] == NOT_RUN and by_row.loc[missing, "nq"] == NOT_RUN
    assert pd.isna(by_row.loc["GaC (ours)", "mmlu"])  # a column the run did not measure: empty, not zero
    extra = table[table.block == EXTRA_BLOCK]
    assert list(extra.ours) == ["rerank-ppl"] and list(extra.nq) == [8.0]


def test_paper_numbers_and_differences(run, tmp_path, monkeypatch, capsys):
    table = build_table(get_layout("gac_table3"), [run], with_paper=True, block="openchat and SOLAR")
    gac = table.set_index("paper row").loc["GaC (ours)"]
    assert gac["nq (paper)"] == 33.82 and gac["nq Δ"] == pytest.approx(10.0 - 33.82)
    assert "10.0 / 33.82 (-23.82)" in render(table, get_layout("gac_table3"), "markdown")
    out = tmp_path / "table3"
    monkeypatch.setattr(sys, "argv", ["ensbench", "table", str(run), "--layout", "gac_table3", "--paper",
                                      "--block", "openchat and SOLAR", "--out", str(out)])
    main()
    assert "\\begin{table}" in (tmp_path / "table3.tex").read_text()
    written = pd.read_csv(tmp_path / "table3.csv")
    assert list(written.columns[:4]) == ["block", "paper row", "ours", "mmlu"]
    assert "GaC t=0.5 (ours)" in (tmp_path / "table3.md").read_text()


def test_position_aliases_fill_entry_slots(tmp_path):
    recipe = {**RECIPE, "methods": [{"name": "gac", "label": "smollm2+qwen2.5"}]}
    rows = {k: ROWS[k] for k in ("small", "big")} | {"smollm2+qwen2.5": ROWS["gac"]}
    run = fake_run(tmp_path / "r", rows, recipe)
    table = build_table(get_layout("gac_table4"), [run]).set_index("paper row")
    assert table.loc["Yi + Mixtral", "ours"] == "smollm2+qwen2.5"  # entry:0
    assert table.loc["Yi-34B-Chat", "ours"] == "small" and table.loc["Qwen2-72B-Instruct", "ours"] == NOT_RUN


@pytest.mark.parametrize("args,message", [
    (["--layout", "nope"], "unknown layout 'nope'"),
    (["--layout", "gac_table3", "--block", "nope"], "has no block 'nope'"),
])
def test_bad_table_arguments(run, monkeypatch, capsys, args, message):
    monkeypatch.setattr(sys, "argv", ["ensbench", "table", str(run), *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_not_a_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["ensbench", "table", str(tmp_path), "--layout", "gac_table3"])
    with pytest.raises(SystemExit):
        main()
    assert "neither a finished ensbench run" in capsys.readouterr().err


def test_every_layout_names_paper_rows_that_exist():
    numbers = paper_numbers()
    for name, layout in layouts().items():
        rows = paper_rows(layout)
        assert rows, name
        known = {r for _, r in rows} | {f"{b} / {r}" for b, r in rows}
        assert set(layout.rows) <= known, (name, set(layout.rows) - known)
        columns = set(numbers[numbers.layout == name].column)
        assert columns <= set(layout.columns), (name, columns - set(layout.columns))


def test_every_score_carries_its_95_interval(run, tmp_path, monkeypatch):
    """Without per-sample files (as here) the interval is Wilson's from the score and its count:
    nq 10% of 50 -> [4.3, 21.4]; CSV keeps low/high numbers, Markdown and LaTeX one "nq 95%" column."""
    table = build_table(get_layout("gac_table3"), [run], block="openchat and SOLAR").set_index("paper row")
    assert (table.loc["GaC (ours)", "nq low"], table.loc["GaC (ours)", "nq high"]) == (4.3, 21.4)
    assert pd.isna(table.loc["OAssistRM", "nq low"])  # not run: no interval
    layout = get_layout("gac_table3")
    frame = build_table(layout, [run], block="openchat and SOLAR")
    markdown = render(frame, layout, "markdown")
    assert "nq 95%" in markdown and "[4.3, 21.4]" in markdown and "nq low" not in markdown
    assert "[4.3, 21.4]" in render(frame, layout, "latex")
    with_paper = render(build_table(layout, [run], with_paper=True, block="openchat and SOLAR"), layout, "markdown")
    assert "10.0 / 33.82 (-23.82)" in with_paper and "[4.3, 21.4]" in with_paper
