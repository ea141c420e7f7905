"""The family pages' parameter tables (docs/methods/*.md) are the code's (``describe_params``),
every built-in method has its table on exactly one page and a row in the method tables of
docs/methods.md and the README (in the same order), and ``ensbench list --method X`` prints the
same rows."""

import re
from pathlib import Path

from ensemble_bench.cli import docgen
from ensemble_bench.cli.docgen import PAGES, families, params_tables, updated
from ensemble_bench.methods import BUILT_IN, DECLARED, describe_params
from tests.cli_helpers import one_line, run_cli


def test_docs_parameter_tables_match_the_code():
    for page_name, names in families().items():
        page = (PAGES / page_name).read_text(encoding="utf-8")
        assert params_tables(names) in page, f"{page_name} is out of date: run python -m ensemble_bench.cli.docgen"
        assert updated(page, names) == page


def test_every_registered_method_is_on_one_family_page():
    placed = [name for names in families().values() for name in names]
    assert sorted(placed) == sorted(DECLARED) == sorted(cls.name for cls in BUILT_IN)
    assert all((PAGES / page).exists() for page in families())


def method_rows(page: Path, section: str) -> list[str]:
    """The method names of the table under ``section`` (a heading line), one per row."""
    text = page.read_text(encoding="utf-8").split(section + "\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(\w+)` \|", text, re.M)


def test_readme_and_the_index_list_every_built_in_method():
    root = PAGES.parents[1]
    index = method_rows(root / "docs" / "methods.md", "## Every method")
    assert sorted(index) == sorted(cls.name for cls in BUILT_IN)
    assert method_rows(root / "README.md", "## Methods") == index


def test_a_method_on_no_page_is_named(monkeypatch, capsys):
    monkeypatch.setattr(DECLARED["gac"], "family", None)
    assert docgen.main(["--check"]) == 1
    assert "no family page for gac" in capsys.readouterr().out


def test_every_method_has_a_table_row_per_parameter():
    for names in families().values():
        tables = params_tables(names)
        for name in names:
            assert f"### `{name}`" in tables
            for param in describe_params(name):
                assert f"| `{param.name}` |" in tables


def test_describe_params_gives_name_type_default_meaning():
    rows = {p.name: p for p in describe_params("gac")}
    assert rows["threshold"].type == "float | null" and rows["threshold"].default == "null"
    assert rows["lead"].type == "int | str" and "gate" in rows["lead"].meaning
    assert [p.name for p in describe_params("sweetspan")][-1] == "lambda"
    assert describe_params("single") == []


def test_list_method_prints_the_parameters(monkeypatch, capsys):
    code, out = run_cli(monkeypatch, capsys, "list", "--method", "unite")
    assert code == 0
    for param in describe_params("unite"):
        assert param.name in out.out
    assert "primary" in out.out and "default" in out.out


def test_list_unknown_method_is_one_line(monkeypatch, capsys):
    code, out = run_cli(monkeypatch, capsys, "list", "--method", "nope")
    assert code == 2 and "unknown method 'nope'" in one_line(out)
