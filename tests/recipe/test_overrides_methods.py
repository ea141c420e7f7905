"""Overrides on the common recipe shape (issue 39, item 3): ``--set method.X`` on a ``methods:`` recipe,
``--seed``, the plan's method parameters, ``select`` from a ``methods:`` run; and (issue 41) ``--set``
values and paths under the recipe file's YAML limits."""

import textwrap

import pytest
import yaml

from ensemble_bench.errors import UserError
from ensemble_bench.recipe import MAX_YAML_DEPTH, load_recipe, parse_recipe
from ensemble_bench.recipe.overrides import parse_set
from tests.cli_helpers import one_line, run_cli

METHODS = textwrap.dedent("""\
    name: pair
    members:
      - {model: smollm2-135m, name: a}
      - {model: qwen2.5-0.5b, name: b}
    methods: [gac, {name: unite, k: 5}, {name: single, members: [a]}]
    tasks: [{name: piqa, limit: 4}]
    data: offline
""")


@pytest.fixture()
def methods_recipe(tmp_path):
    path = tmp_path / "pair.yaml"
    path.write_text(METHODS)
    return path


def test_set_method_x_applies_to_every_method_row_that_takes_x(methods_recipe):
    loaded = load_recipe(methods_recipe, [parse_set("method.weights=[2,1]"), parse_set("method.threshold=0.5")])
    gac, unite, single = loaded.methods
    assert gac.params == {"weights": [2, 1], "threshold": 0.5}  # unite has weights but no threshold
    assert unite.params == {"k": 5, "weights": [2, 1]} and single.params == {}


def test_set_method_x_that_no_row_takes_names_the_row_to_write_in_one_line(methods_recipe, monkeypatch, capsys):
    code, out = run_cli(monkeypatch, capsys, "run", str(methods_recipe), "--dry-run", "--set", "method.eta=0.1")
    assert code == 2 and one_line(out) == (
        "error: --set method.eta=0.1: this recipe lists its methods under 'methods:' (gac, unite, single) and no "
        "method row takes 'eta': name the row, e.g. --set methods[0].eta=0.1")
    with pytest.raises(UserError, match=r"^--set method.name=gac: .* name the row, e.g. --set methods\[0\].name=gac$"):
        load_recipe(methods_recipe, [parse_set("method.name=gac")])


def test_a_bad_value_set_on_every_row_names_the_override(methods_recipe):
    with pytest.raises(UserError) as info:
        load_recipe(methods_recipe, [parse_set("method.weights=[2,1,3]")])
    lines = str(info.value).splitlines()
    assert lines and all(line.startswith(f"{methods_recipe}: --set method.weights=[2,1,3]: ") for line in lines)
    assert "expected 2 values" in lines[0]


def test_seed_is_a_flag_and_the_plan_shows_it_and_each_rows_parameters(methods_recipe, monkeypatch, capsys):
    code, out = run_cli(monkeypatch, capsys, "run", str(methods_recipe), "--dry-run", "--seed", "7",
                        "--set", "method.weights=[2,1]")
    assert code == 0, out.err
    assert "seed 7)" in out.out.splitlines()[0]
    text = " ".join(out.out.split())  # the parameters cell may wrap
    assert "weights=[2.0, 1.0]" in text and "k=5" in text
    assert load_recipe(methods_recipe, [parse_set("seed=9")]).seed == 9
    code, out = run_cli(monkeypatch, capsys, "run", str(methods_recipe), "--dry-run", "--seed", "-1")
    assert code == 2 and "--seed" in out.err


def test_the_plan_says_defaults_for_a_row_that_sets_nothing(methods_recipe, monkeypatch, capsys):
    from ensemble_bench.cli.plan import row_parameters

    recipe = load_recipe(methods_recipe)
    shown = {row.label: row_parameters(row) for row in recipe.plan}
    assert shown == {"gac": "defaults", "unite": "k=5"}
    with_singles = parse_recipe({**yaml.safe_load(METHODS), "singles": True}, "with singles")
    assert {row.label: row_parameters(row) for row in with_singles.plan}["a"] == "-"


def test_select_writes_a_valid_recipe_from_a_methods_run(tmp_path, monkeypatch, capsys):
    from tests.report.test_select import fake_run

    run = fake_run(tmp_path, "pool", {"small": (0.25, 0.50, ["Paris", "two"]), "big": (0.30, 0.55, ["Rome", "one"])})
    source = yaml.safe_load((run / "recipe.yaml").read_text())
    source.pop("method")
    source["methods"] = [{"name": "gac", "threshold": 0.5}, {"name": "unite", "k": 5}]
    source["members"][0]["weight"] = 2.0  # the source ensemble's weight: not the written recipe's
    (run / "recipe.yaml").write_text(yaml.safe_dump(source))
    parse_recipe(source, "source")  # the source is a valid methods: recipe
    out = tmp_path / "chosen.yaml"
    code, printed = run_cli(monkeypatch, capsys, "select", str(run), "--out", str(out))
    assert code == 0, printed.err
    written = yaml.safe_load(out.read_text())
    assert "methods" not in written and written["method"] == {"name": "unite", "lead": "big"}
    assert all("weight" not in member for member in written["members"])
    assert parse_recipe(written, str(out)).method.lead == "big"


def test_an_alias_bomb_in_a_set_value_meets_the_recipe_limits_fast():
    bomb = "{" + "a: &a [x,x,x,x,x,x,x,x,x]"
    for k in range(1, 9):
        bomb += f", {chr(97 + k)}: &{chr(97 + k)} [" + ",".join([f"*{chr(96 + k)}"] * 9) + "]"
    bomb += "}"
    with pytest.raises(UserError) as info:  # 9**9 values written out: refused from the count, not expanded
        parse_set(f"sweep={bomb}")
    line = str(info.value)
    assert "\n" not in line and line.startswith("--set sweep={a: &a") and "past the recipe's YAML limits" in line
    assert len(line) < 300


def test_a_set_path_thousands_of_fields_deep_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    path = tmp_path / "r.yaml"
    path.write_text(METHODS)
    deep = ".".join(["a"] * 3000) + "=1"
    with pytest.raises(UserError, match=rf"3000 fields deep; a recipe nests at most {MAX_YAML_DEPTH}$"):
        parse_set(deep)
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run", "--set", deep)
    assert code == 2 and len(one_line(out)) < 300
