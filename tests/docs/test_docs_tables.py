"""The committed paper tables (docs/tables/) are today's rendering of their own CSVs, so they cannot drift
from the code that writes tables: each carries the legend and the 'ensbench row' column."""

import pytest

from ensemble_bench.report.from_csv import TABLES, rendered
from ensemble_bench.report.provenance import ROW_COLUMN, legend

CSVS = sorted(TABLES.glob("*.csv"))


def test_every_table_has_its_csv_and_its_renderings():
    assert CSVS, f"no tables in {TABLES}"
    stems = {path.stem for path in TABLES.iterdir()}
    assert all(stem in {csv.stem for csv in CSVS} for stem in stems), "a table in docs/tables/ without its CSV"


@pytest.mark.parametrize("csv", CSVS, ids=lambda path: path.stem)
def test_committed_table_is_todays_rendering_of_its_csv(csv):
    for target, text in rendered(csv).items():
        assert target.read_text(encoding="utf-8") == text, \
            f"{target} is out of date: run make docs-tables (python -m ensemble_bench.report.from_csv)"


@pytest.mark.parametrize("csv", CSVS, ids=lambda path: path.stem)
def test_committed_table_carries_its_legend(csv):
    markdown = csv.with_suffix(".md").read_text(encoding="utf-8")
    header = next(line for line in markdown.splitlines() if line.startswith("| block"))
    assert f"| {ROW_COLUMN} " in header and "| ours " not in header
    assert f"\n- {legend(with_paper=True)}\n" in markdown
    assert legend(with_paper=True).replace("%", "\\%") in csv.with_suffix(".tex").read_text(encoding="utf-8")


@pytest.mark.parametrize("csv", CSVS, ids=lambda path: path.stem)
def test_results_page_quotes_the_table_as_committed(csv):
    title, blank, body = csv.with_suffix(".md").read_text(encoding="utf-8").split("\n", 2)
    assert title.startswith("### ") and blank == ""
    assert body.rstrip("\n") in (TABLES.parent / "results.md").read_text(encoding="utf-8"), \
        f"docs/results.md does not quote {csv.stem}.md as committed: copy its table and notes there"
