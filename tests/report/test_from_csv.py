"""A paper-layout table rendered again from its CSV (report/from_csv.py): the CSV's numbers and its rows'
places kept, everything else from today's code; what the CSV does not record is said, never filled in."""

import io
import shutil

import pandas as pd
import pytest

from ensemble_bench.report import from_csv
from ensemble_bench.report.from_csv import layout_of, rendered, table_stem
from ensemble_bench.report.tables import build_table, get_layout, render
from tests.fake_runs import fake_run
from tests.report.test_tables import RECIPE, ROWS

# What `ensbench table --paper` wrote before the legend: our label in "ours", a latency difference
# against the paper's GPU whatever the runs' hardware. "gac" sits apart although the layout names it
# for "GaC (ours)": a re-rendering keeps the place the CSV gives it.
OLD_CSV = """block,paper row,ours,nq,nq (paper),nq Δ,\
latency_ms_per_token,latency_ms_per_token (paper),latency_ms_per_token Δ
openchat and SOLAR,openchat_3.5,smol,3.0,29.75,-26.75,279.1,28.01,251.09
openchat and SOLAR,UltraRM,not run,not run,32.03,,not run,74.51,
"(ours, not in the paper)",,gac,5.0,,,688.5,,
"""


def old_table(tmp_path):
    path = tmp_path / f"{table_stem('gac_table3', 'openchat and SOLAR', True)}.csv"
    path.write_text(OLD_CSV, encoding="utf-8")
    return path


def test_file_names_say_the_layout_and_block(tmp_path):
    assert table_stem("gac_table3", "openchat and SOLAR", True) == "gac_table3-openchat_and_solar_offline"
    layout, block = layout_of(tmp_path / "gac_table3-openchat_and_solar_offline.csv")
    assert (layout.name, block) == ("gac_table3", "openchat and SOLAR")
    assert layout_of(tmp_path / "unite_table4.csv") == (get_layout("unite_table4"), None)


def test_an_old_csv_gets_todays_columns_legend_and_notes(tmp_path):
    path = old_table(tmp_path)
    files = rendered(path)
    frame = pd.read_csv(io.StringIO(files[path]), dtype=str, keep_default_na=False)
    by_row = frame.set_index("paper row")
    ours = by_row.loc["openchat_3.5"]
    assert (ours["ensbench row"], ours["nq"], ours["latency_ms_per_token"]) == ("smol", "3.0", "279.1")
    assert ours["nq Δ"] == "-26.75"  # recomputed: the paper's 29.75 from paper_numbers.csv
    assert ours["latency_ms_per_token Δ"] == ""  # the CSV records no hardware: no difference to the paper's GPU
    assert by_row.loc["GaC (ours)", "ensbench row"] == "not run"
    assert list(frame.loc[frame.block == "(ours, not in the paper)", "ensbench row"]) == ["gac"]
    markdown = files[tmp_path / "gac_table3-openchat_and_solar_offline.md"]
    assert "'ensbench row': the label of our result row" in markdown
    assert "these runs: not recorded in gac_table3-openchat_and_solar_offline.csv" in markdown
    assert "does not record the runs' hardware" in markdown and "95% intervals" in markdown
    assert "\\par cells: ours / paper" in files[tmp_path / "gac_table3-openchat_and_solar_offline.tex"]


def test_a_csv_written_today_renders_to_itself(tmp_path, monkeypatch):
    """Numbers, intervals, the paper's rows and our extra rows of a table made from runs come back as they
    were written: the CSV route adds no number and loses none."""
    run = fake_run(tmp_path / "results" / "t3" / "20260101-000000-abc", ROWS, RECIPE)
    layout = get_layout("gac_table3")
    written = render(build_table(layout, [run], with_paper=True, block="openchat and SOLAR"), layout, "csv")
    path = tmp_path / "gac_table3-openchat_and_solar.csv"
    path.write_text(written, encoding="utf-8")
    files = rendered(path)
    assert files[path] == written
    assert "| [4.3, 21.4] |" in files[path.with_suffix(".md")]  # GaC's nq interval, from the CSV


def test_check_lists_stale_files_and_writing_makes_them_fresh(tmp_path, capsys):
    path = old_table(tmp_path)
    assert from_csv.main([str(path), "--check"]) == 1
    assert path.read_text(encoding="utf-8") == OLD_CSV  # --check writes nothing
    assert "out of date" in capsys.readouterr().out
    assert from_csv.main([str(path)]) == 0
    assert from_csv.main([str(path), "--check"]) == 0
    again = tmp_path / "again"
    again.mkdir()
    shutil.copy(path, again / path.name)
    assert rendered(again / path.name)[again / path.name] == path.read_text(encoding="utf-8")


@pytest.mark.parametrize(("name", "text", "message"), [
    ("no_such_table.csv", OLD_CSV, "the name names no layout"),
    ("gac_table4.csv", "a,b\n1,2\n", "not a table of ensbench table --layout"),
])
def test_bad_csvs_give_one_line(tmp_path, capsys, name, text, message):
    (tmp_path / name).write_text(text, encoding="utf-8")
    assert from_csv.main([str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
