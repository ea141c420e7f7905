"""`ensbench table`: without a layout, every row by every benchmark of the runs; with one, our rows
land in the paper's rows by declared identity (`paper_row:`) or name, never by position, missing
rows read "not run" (never zero), extra rows are kept, notes say what the runs lack and what the
layout leaves out, `--paper` adds the published number and the difference (latency only on the
paper's hardware), and every layout's paper rows exist in the transcribed numbers."""

import dataclasses
import sys

import pandas as pd
import pytest

from ensemble_bench.cli.main import main
from ensemble_bench.report.tables import (
    EXTRA_BLOCK,
    NOT_RUN,
    build_run_table,
    build_table,
    get_layout,
    layouts,
    paper_numbers,
    paper_rows,
    render,
)
from tests.fake_runs import fake_run

RECIPE = {"name": "t3", "members": [{"model": "smollm2-135m", "name": "small", "paper_row": "openchat_3.5"},
                                    {"model": "qwen2.5-0.5b", "name": "big",
                                     "paper_row": "openchat and SOLAR / Nous-Hermes-2-SOLAR-10.7B"}],
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
    assert by_row.loc["openchat_3.5", "ensbench row"] == "small" and by_row.loc["openchat_3.5", "nq"] == 4.0
    assert by_row.loc["Nous-Hermes-2-SOLAR-10.7B", "ensbench row"] == "big"
    assert by_row.loc["GaC (ours)", "nq"] == 10.0 and by_row.loc["GaC (ours)", "latency_ms_per_token"] == 340.0
    gated = by_row.loc["GaC t=0.5 (ours)"]
    assert (gated["nq"], gated["ensembled_pct"]) == (12.0, 25.0)
    for missing in ("LLM Blender (PairRanker)", "OAssistRM", "UltraRM", "FuseLLM"):
        assert by_row.loc[missing, "ensbench row"] == NOT_RUN and by_row.loc[missing, "nq"] == NOT_RUN
    assert pd.isna(by_row.loc["GaC (ours)", "mmlu"])  # a column the run did not measure: empty, not zero
    extra = table[table.block == EXTRA_BLOCK]
    assert list(extra["ensbench row"]) == ["rerank-ppl"] and list(extra.nq) == [8.0]


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
    assert list(written.columns[:4]) == ["block", "paper row", "ensbench row", "mmlu"]
    assert "GaC t=0.5 (ours)" in (tmp_path / "table3.md").read_text()


def test_declared_identity_fills_a_paper_row_and_position_never_does(tmp_path):
    """A user's own models do not take the paper's rows by their place in the recipe: only a
    declared `paper_row:` (on a member or an entry) or a matching name puts them there."""
    members = [{"model": "smollm2-135m", "name": "smol"}, {"model": "qwen2.5-0.5b", "name": "qwen2-72b-instruct"}]
    recipe = {**RECIPE, "members": members, "methods": [{"name": "gac", "label": "pair", "paper_row": "Yi + Mixtral"}]}
    rows = {"smol": ROWS["small"], "qwen2-72b-instruct": ROWS["big"], "pair": ROWS["gac"]}
    table = build_table(get_layout("gac_table4"), [fake_run(tmp_path / "r", rows, recipe)]).set_index("paper row")
    assert table.loc["Yi + Mixtral", "ensbench row"] == "pair"  # declared
    assert table.loc["Qwen2-72B-Instruct", "ensbench row"] == "qwen2-72b-instruct"  # the name the layout lists
    assert table.loc["Yi-34B-Chat", "ensbench row"] == NOT_RUN  # the first member fills no row by being first
    assert list(table[table.block == EXTRA_BLOCK]["ensbench row"]) == ["smol"]


def test_notes_say_what_the_runs_lack_and_what_the_layout_leaves_out(run):
    layout = get_layout("gac_table3")
    frame = build_table(layout, [run], block="openchat and SOLAR")
    notes = frame.attrs["notes"]
    assert notes[0].startswith("cells: our scores in %")  # the legend (tests/report/test_provenance.py)
    assert notes[1] == "benchmarks of this layout the runs lack: mmlu, gsm8k, bbh, triviaqa"
    assert notes[2] == "rows of this layout the runs lack: LLM Blender (PairRanker), OAssistRM, UltraRM, FuseLLM"
    assert notes[3] == "benchmarks of the runs this layout leaves out: arc_c"
    every_block = build_table(layout, [run]).attrs["notes"][2]  # rows of two blocks: named with their block
    assert "Mixtral and Yi / OAssistRM" in every_block and "openchat and SOLAR / OAssistRM" in every_block
    markdown = render(frame, layout, "markdown")
    assert markdown.endswith("\n\n- " + "\n- ".join(notes) + "\n")
    assert "arc\\_c" in render(frame, layout, "latex") and "arc_c" not in render(frame, layout, "csv")


def test_latency_is_compared_with_the_paper_only_on_its_hardware(tmp_path):
    env = {"pretty_env_info": "Is CUDA available: False\nGPU models and configuration: Could not collect\n"
                              "Model name:   Intel(R) Xeon(R) Processor\n"}
    run = fake_run(tmp_path / "r", ROWS, RECIPE, env)
    layout = get_layout("gac_table3")
    gac = build_table(layout, [run], with_paper=True, block="openchat and SOLAR")
    assert pd.isna(gac.set_index("paper row").loc["GaC (ours)", "latency_ms_per_token Δ"])
    assert gac.set_index("paper row").loc["GaC (ours)", "latency_ms_per_token (paper)"] == 51.32
    assert gac.attrs["notes"][-1] == ("latency: no difference to the paper's, which was timed on hardware this layout "
                                      "does not record; these runs: cpu (Intel(R) Xeon(R) Processor)")
    same = dataclasses.replace(layout, hardware="Xeon")
    gac = build_table(same, [run], with_paper=True, block="openchat and SOLAR").set_index("paper row")
    assert gac.loc["GaC (ours)", "latency_ms_per_token Δ"] == pytest.approx(340.0 - 51.32)


def test_a_table_of_any_run_without_a_layout(tmp_path, monkeypatch):
    """Every row by every benchmark of the run, intervals beside the scores, the average, latency
    and wall time; CSV keeps the numbers, Markdown and LaTeX one 95% column per benchmark."""
    rows = {label: (method, {**scores, "arc_c": (0.5, 40)}, dict(timing))
            for label, (method, scores, timing) in ROWS.items()}
    rows["big"][2]["loglikelihood_ms_per_request"] = 12.5
    run = fake_run(tmp_path / "results" / "t3" / "20260101-000000-abc", rows, RECIPE,
                   {"total_evaluation_time_seconds": "61.25"})
    frame, layout = build_run_table([run.parent])
    # no avg: nq is scored by exact match, arc_c by accuracy (before: "avg" 30.0 for gac, issue 39 item 5)
    assert list(frame.columns) == ["row", "method", "nq", "nq low", "nq high", "arc_c", "arc_c low", "arc_c high",
                                   "ms/token", "ms/request", "wall s"]
    assert "avg left out: the benchmarks are scored by different metrics (nq: exact_match, arc_c: acc)" \
        in frame.attrs["notes"]
    gac = frame.set_index("row").loc["gac"]
    assert (gac["nq"], gac["nq low"], gac["nq high"], gac["wall s"]) == (10.0, 4.3, 21.4, 61.25)
    assert frame.set_index("row").loc["big", "ms/request"] == 12.5
    assert list(frame.row) == list(ROWS)
    out = tmp_path / "mine"
    monkeypatch.setattr(sys, "argv", ["ensbench", "table", str(run.parent), "--out", str(out)])
    main()
    markdown = (tmp_path / "mine.md").read_text()
    assert "| gac " in markdown and "nq 95%" in markdown and "[4.3, 21.4]" in markdown
    assert "nq 95\\%" in (tmp_path / "mine.tex").read_text()
    assert list(pd.read_csv(tmp_path / "mine.csv").columns) == list(frame.columns)


@pytest.mark.parametrize("args,message", [
    (["--layout", "nope"], "unknown layout 'nope'"),
    (["--paper"], "--paper and --block need a paper layout"),
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


def test_one_label_measured_by_two_runs_is_shown_apart_never_mixed(tmp_path):
    """Two runs that both hold 'gac' on nq: two rows, each with its own run's score and latency, and a
    note; a label whose runs measured different benchmarks is still one row."""
    first = fake_run(tmp_path / "results" / "t3" / "20260101-000000-abc", ROWS, RECIPE)
    again = {"small": ("single", {"arc_c": (0.5, 50)}, {"decode_ms_per_token": 100.0}),
             "big": ("single", {"arc_c": (0.6, 50)}, {"decode_ms_per_token": 250.0}),
             "gac": ("gac", {"nq": (0.30, 50)}, {"decode_ms_per_token": 90.0})}
    recipe = {**RECIPE, "name": "t4", "methods": [{"name": "gac", "label": "gac"}]}
    second = fake_run(tmp_path / "results" / "t4" / "20260102-000000-def", again, recipe)
    frame, layout = build_run_table([first, second])
    rows = frame.set_index("row")
    apart = "gac (t4/20260102-000000-def)"
    assert (rows.loc["gac", "nq"], rows.loc["gac", "ms/token"]) == (10.0, 340.0)
    assert (rows.loc[apart, "nq"], rows.loc[apart, "ms/token"]) == (30.0, 90.0)
    assert (rows.loc["small", "nq"], rows.loc["small", "arc_c"]) == (4.0, 50.0)  # disjoint benchmarks: one row
    assert f"'gac' is in several runs with the same benchmarks: shown apart, as '{apart}'" in frame.attrs["notes"]


def test_a_table_reads_each_run_file_once(tmp_path, monkeypatch):
    """`table` on a run of 10,000 rows did not finish in 5 minutes (issue 47): it listed and parsed every row's
    results file five times or more (timed by scripts/bench_table_rows.py, not here)."""
    from ensemble_bench.report.tables import make_table
    from ensemble_bench.run import folder as run_folder
    from tests.fake_runs import ROWS

    run = fake_run(tmp_path / "run", ROWS)
    reads, parse = [], run_folder.parse_json
    monkeypatch.setattr(run_folder, "parse_json", lambda path: reads.append(path) or parse(path))
    make_table([run], None)
    assert sorted(reads) == sorted(run / label / name for label in ROWS for name in ("results_1.json", "timing.json"))
    reads.clear()
    monkeypatch.setattr(run_folder, "KEPT_BYTES", 0)  # nothing kept: each file is read as often as it is asked for
    make_table([run], None)
    assert reads.count(run / "gac" / "results_1.json") > 1
