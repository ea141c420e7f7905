"""docs/methods.md's parameter tables are the code's (``describe_params``), and ``ensbench list
--method X`` prints the same rows."""

from ensemble_bench.docgen import PAGE, params_tables, updated
from ensemble_bench.methods import METHODS, describe_params
from tests.run.test_faults import one_line, run_cli


def test_docs_parameter_tables_match_the_code():
    page = PAGE.read_text(encoding="utf-8")
    assert params_tables() in page, "docs/methods.md is out of date: run python -m ensemble_bench.docgen"
    assert updated(page) == page


def test_every_method_has_a_table_row_per_parameter():
    tables = params_tables()
    for name in METHODS:
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
