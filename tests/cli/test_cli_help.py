"""What `ensbench list` and the help say (issue 39, item 7): a benchmark is never offline "yes" and
"hub only" at once, `list --details` explains each method parameter, flags show no `<bool>` and
arguments read RECIPE; an unknown recipe field names the close ones, and close task names are unique."""

import pytest

from ensemble_bench.cli import listing
from ensemble_bench.cli import main as cli
from ensemble_bench.errors import UserError
from ensemble_bench.recipe import parse_recipe
from tests.cli_helpers import run_cli

BASE = {"name": "pair", "members": [{"model": "smollm2-135m", "name": "a"}, {"model": "qwen2.5-0.5b", "name": "b"}],
        "method": "gac", "tasks": [{"name": "piqa", "limit": 4}], "data": "offline"}


def table_rows(table) -> dict[str, list[str]]:
    cells = [[str(cell) for cell in column._cells] for column in table.columns]
    return {row[0] + "/" + row[1]: list(row) for row in zip(*cells)}


def test_a_benchmark_whose_offline_copy_cannot_be_built_here_is_not_offline_yes(monkeypatch):
    monkeypatch.setattr(listing, "_offline_missing", lambda b: "a folder of json files" if b.name == "bbh" else None)
    rows = table_rows(listing._benchmark_table())
    assert rows["bbh/default"][4:] == ["not here", "hub only [1]"]
    assert rows["piqa/default"][4:] == ["yes", "ready"] and rows["flores_en-de/flores101"][4] == "fixture"


def test_list_details_explains_each_parameter_at_80_columns(monkeypatch, capsys):
    monkeypatch.setattr(cli, "console", cli.PipeConsole(width=80))
    code, out = run_cli(monkeypatch, capsys, "list", "--details")
    lines = out.out.splitlines()
    assert code == 0 and max(map(len, lines)) <= 80
    text = " ".join(out.out.split())
    assert "gac members: 2+" in text and "threshold = null" in text and "k = 10" in text
    assert "single members: 1 per row (no parameters)" in text


@pytest.mark.parametrize("command,usage", [("run", "ensbench run [OPTIONS] RECIPE"),
                                           ("table", "ensbench table [OPTIONS] RUNS...")])
def test_the_help_shows_no_bool_for_flags_and_plain_argument_names(monkeypatch, capsys, command, usage):
    monkeypatch.setenv("COLUMNS", "100")
    code, out = run_cli(monkeypatch, capsys, command, "--help")
    assert code == 0 and usage in out.out
    assert "<bool>" not in out.out and "{" not in out.out
    if command == "run":
        assert "KEY=VALUE" in out.out and "--seed" in out.out


@pytest.mark.parametrize("where,wrong,expected", [
    ((), "weigths", None), (("members", 0), "dtpye", "'dtype'"), ((), "seeed", "'seed'"),
    (("tasks", 0), "shotz", "'shots'")])
def test_an_unknown_field_names_the_close_ones(where, wrong, expected):
    data = {**BASE, "members": [dict(m) for m in BASE["members"]], "tasks": [dict(BASE["tasks"][0])],
            "method": {"name": "gac"}}
    holder = data
    for part in where:
        holder = holder[part]
    (data["method"] if wrong == "weigths" else holder)[wrong] = [2, 1] if wrong == "weigths" else 1
    with pytest.raises(UserError) as info:
        parse_recipe(data, "r.yaml")
    line = str(info.value)
    assert "unknown field (did you mean " in line and "\n" not in line
    assert (expected or "'weights'") in line


def test_close_task_names_are_each_named_once():
    from ensemble_bench.tasks.lm_eval_tasks import find_entry, stock_index

    with pytest.raises(UserError) as info:
        find_entry("arc_challeng", stock_index())
    close = str(info.value).split("(close: ", 1)[1].split(")", 1)[0].split(", ")
    assert "arc_challenge" in close and len(close) == len(set(close))
