"""Every bad recipe gives one clear line naming the file and the field, exit code 2, no traceback."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ensemble_bench.cli.main import main

GOOD = textwrap.dedent("""\
    name: good
    members:
      - model: smollm2-135m
    method: single
    tasks:
      - name: piqa
        limit: 5
    data: offline
""")


def run_cli(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["ensbench", *args])
    try:
        main()
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    return code, capsys.readouterr()


def write(tmp_path, text, name="recipe.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


CASES = {
    "unknown method": (GOOD.replace("method: single", "method: blend"), "method.name: unknown method 'blend'"),
    "missing model": (GOOD.replace("model: smollm2-135m", "model: no-such-model"),
                      "members[0].model: unknown model 'no-such-model'"),
    "missing model file": (GOOD.replace("model: smollm2-135m", "model: /nowhere/model.gguf"),
                           "members[0].model: model file not found"),
    "negative limit": (GOOD.replace("limit: 5", "limit: -3"), "tasks[0].limit: Input should be greater than 0"),
    "wrong type": (GOOD + "batch_size: eight\n", "batch_size: Input should be a valid integer"),
    "string number": (GOOD.replace("limit: 5", "limit: '5'"), "tasks[0].limit: Input should be a valid integer"),
    "bad dtype": (GOOD.replace("- model: smollm2-135m", "- model: smollm2-135m\n    dtype: fp8"),
                  "members[0].dtype: Input should be"),
    "unknown field": (GOOD + "temperature: 0.7\n", "temperature: unknown field"),
    "unknown benchmark": (GOOD.replace("name: piqa", "name: hellaswagz"), "tasks[0].name: unknown task 'hellaswagz'"),
    "missing members": (GOOD.replace("members:\n  - model: smollm2-135m\n", ""), "members: Field required"),
    "not a mapping": ("- just\n- a list\n", "a recipe must be a YAML mapping"),
    "malformed yaml": ("name: [unclosed\n", "not valid YAML"),
    "bad method parameter": (GOOD.replace("method: single", "method:\n  name: single\n  k: 3"),
                             "method.k: unknown field"),
    "code without opt-in": (GOOD.replace("name: piqa", "name: mbpp"),
                            "benchmark 'mbpp' runs the generated programs: set allow_code_execution: true"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_recipe_is_one_line_exit_2(case, tmp_path, monkeypatch, capsys):
    text, expected = CASES[case]
    path = write(tmp_path, text)
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run")
    assert code == 2
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert str(path) in lines[0] and expected in lines[0], lines[0]
    assert "Traceback" not in out.err + out.out


def test_unreadable_file(tmp_path, monkeypatch, capsys):
    code, out = run_cli(monkeypatch, capsys, "run", str(tmp_path / "absent.yaml"), "--dry-run")
    assert code == 2 and "cannot read recipe" in out.err and len(out.err.strip().splitlines()) == 1
    code, out = run_cli(monkeypatch, capsys, "run", str(tmp_path), "--dry-run")  # a directory
    assert code == 2 and "cannot read recipe" in out.err


def test_good_recipe_dry_run_prints_plan(tmp_path, monkeypatch, capsys):
    code, out = run_cli(monkeypatch, capsys, "run", str(write(tmp_path, GOOD)), "--dry-run")
    assert code == 0 and "piqa" in out.out and "smollm2" in out.out


def test_subprocess_error_has_no_traceback(tmp_path):
    path = write(tmp_path, GOOD.replace("method: single", "method: blend"))
    done = subprocess.run([sys.executable, "-m", "ensemble_bench.cli", "run", str(path), "--dry-run"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["bench"], ["run", "--bogus", "x.yaml"], ["run"]])
def test_command_line_mistakes_are_usage_errors(args, monkeypatch, capsys):
    code, out = run_cli(monkeypatch, capsys, *args)
    assert code == 2
    assert out.err.startswith("error:") and len(out.err.strip().splitlines()) == 1, out.err
    assert "Traceback" not in out.err + out.out


def test_no_arguments_shows_help(monkeypatch, capsys):
    code, out = run_cli(monkeypatch, capsys)
    assert "Usage" in out.out + out.err and "Traceback" not in out.err + out.out
    assert code in (0, 2)  # click >= 8.2 exits 2 after the help (no command given)


GAC = textwrap.dedent("""\
    name: gac
    members:
      - model: smollm2-135m
        name: small
      - model: qwen2.5-0.5b
        name: big
    method:
      name: gac
      {extra}
    tasks: [piqa]
""")

GAC_CASES = {
    "unknown gate": ("gate: nobody\n  threshold: 0.5", "method.gate: 'nobody' is not a member (members: small, big)"),
    "threshold above one": ("threshold: 1.5", "method.threshold: Input should be less than or equal to 1"),
    "gate without threshold": ("gate: small", "method: a gate needs a threshold"),
    "weights count": ("weights: [1.0, 2.0, 3.0]", "method.weights: expected 2 values"),
    "negative weight": ("weights: [1.0, -2.0]", "weights must be >= 0"),
    "score weights without scores": ("weights: score", "needs 'scores'"),
}


@pytest.mark.parametrize("case", sorted(GAC_CASES))
def test_bad_gac_parameters(case, tmp_path, monkeypatch, capsys):
    extra, expected = GAC_CASES[case]
    path = write(tmp_path, GAC.format(extra=extra))
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run")
    assert code == 2 and len(out.err.strip().splitlines()) == 1, out.err
    assert expected in out.err, out.err


def test_gac_needs_two_members(tmp_path, monkeypatch, capsys):
    path = write(tmp_path, GOOD.replace("method: single", "method: gac"))
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run")
    assert code == 2 and "method 'gac' takes 2+ members, got 1" in out.err


def test_shipped_recipes_validate():
    from pathlib import Path

    from ensemble_bench.recipe import load_recipe

    recipes = sorted(Path(__file__).parents[2].joinpath("recipes").rglob("*.yaml"))
    assert len(recipes) >= 9
    for path in recipes:
        load_recipe(path)


def test_every_shipped_recipe_reads_back_as_a_run_folder_stores_it(tmp_path):
    """A run folder's recipe.yaml (run/folder.py's write_recipe: defaults included) parses to the same recipe:
    resume and `ensbench table` find finished runs by it."""
    from pathlib import Path

    import yaml

    from ensemble_bench.recipe import load_recipe, parse_recipe
    from ensemble_bench.run.folder import write_recipe

    for path in sorted(Path(__file__).parents[2].joinpath("recipes").rglob("*.yaml")):
        recipe = load_recipe(path)
        write_recipe(tmp_path, recipe)
        held = parse_recipe(yaml.safe_load((tmp_path / "recipe.yaml").read_text()), str(tmp_path))
        assert held.fingerprint() == recipe.fingerprint(), path


ENSEMBLE = GAC.replace("name: gac\n", "name: ensemble\n", 1).replace("  name: gac\n", "  name: {method}\n")
METHOD_CASES = {
    "unite unknown primary": ("unite", "primary: nobody", "method.primary: 'nobody' is not a member"),
    "unite k zero": ("unite", "k: 0", "method.k: Input should be greater than or equal to 1"),
    "unite weights count": ("unite", "weights: [1.0]", "method.weights: expected 2 values"),
    "deepen main out of range": ("deepen", "main: 5", "method.main: index 5 out of range for 2 members"),
    "deepen adapt without scores": ("deepen", "weights: adapt", "weights 'adapt' needs 'scores'"),
    "deepen scores below chance": ("deepen", "weights: adapt\n  scores: [0.2, 0.3]\n  chance: 0.25",
                                   "method.scores: every score must be >= chance"),
    "deepen negative eta": ("deepen", "eta: -0.1", "method.eta: Input should be greater than 0"),
    "deepen zero support": ("deepen", "support: 0", "method.support: Input should be greater than or equal to 1"),
    "voting bad regex": ("voting", "answer: '(unclosed'", "method.answer: not a valid regular expression"),
    "mbr unknown main": ("mbr", "main: nobody", "method.main: 'nobody' is not a member"),
}


@pytest.mark.parametrize("case", sorted(METHOD_CASES))
def test_bad_parameters_of_other_methods(case, tmp_path, monkeypatch, capsys):
    method, extra, expected = METHOD_CASES[case]
    path = write(tmp_path, ENSEMBLE.format(method=method, extra=extra))
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run")
    assert code == 2 and len(out.err.strip().splitlines()) == 1, out.err
    assert expected in out.err, out.err


SWEEP = ENSEMBLE.format(method="sweetspan", extra="main: big")


@pytest.mark.parametrize("sweep,expected", [
    ("sweep: {span_words: [1, 0]}",
     "sweep {'span_words': 0}: method.span_words: Input should be greater than or equal to 1"),
    ("sweep: {span_words: [1], lambda: [2.0]}", "sweep: sweep names exactly one method parameter"),
    ("sweep: {span_words: []}", "sweep: sweep names exactly one method parameter"),
    ("sweep: {window: [2]}", "sweep {'window': 2}: method.window: unknown field"),
])
def test_bad_sweeps(sweep, expected, tmp_path, monkeypatch, capsys):
    path = write(tmp_path, SWEEP + sweep + "\n")
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run")
    assert code == 2 and len(out.err.strip().splitlines()) == 1, out.err
    assert expected in out.err, out.err


def test_a_sweep_plans_one_ensemble_row_per_value(tmp_path):
    from ensemble_bench.recipe import load_recipe, plan_rows

    recipe = load_recipe(write(tmp_path, SWEEP + "singles: true\nsweep: {span_words: [1, 4, 16]}\n"))
    rows = plan_rows(recipe)
    assert [r.label for r in rows] == ["small", "big", "sweetspan-span_words=1", "sweetspan-span_words=4",
                                       "sweetspan-span_words=16"]
    assert rows[3].overrides == (("span_words", 4),) and rows[0].overrides == ()


TABLE = textwrap.dedent("""\
    name: table
    members:
      - {model: smollm2-135m, name: small}
      - {model: qwen2.5-0.5b, name: big}
      - {model: gemma3-270m, name: third}
    singles: true
    tasks: [piqa]
""")


@pytest.mark.parametrize("methods,expected", [
    ("methods: [gac]\nmethod: gac", "give either 'method' (one ensemble) or 'methods'"),
    ("methods: [{name: gac, members: [small, nobody]}]", "method 'gac' names unknown member 'nobody'"),
    ("methods: [gac, gac]", "two rows of the recipe are labelled 'gac'"),
    ("methods: [{name: gac, label: small}]", "two rows of the recipe are labelled 'small'"),
    ("methods: [{name: gac, label: a}, {name: rerank, label: b, scorer: reward}]",
     "methods[1]: scorer_model is required by the reward and pairwise scorers"),
    ("methods: [{name: gac, members: [small]}]", "method 'gac' takes 2+ members, got 1"),
    ("methods: [gac, {name: unite, label: u}]\nsweep: {k: [1, 2]}", "sweep needs a single method entry"),
])
def test_bad_method_lists(methods, expected, tmp_path, monkeypatch, capsys):
    path = write(tmp_path, TABLE + methods + "\n")
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run")
    assert code == 2 and len(out.err.strip().splitlines()) == 1, out.err
    assert expected in out.err, out.err


def test_a_method_list_plans_labelled_rows_over_chosen_members(tmp_path):
    from ensemble_bench.recipe import load_recipe, plan_rows

    recipe = load_recipe(write(tmp_path, TABLE + "methods:\n  - {name: gac, members: [small, big]}\n"
                                                 "  - {name: gac, label: gac-t0.5, gate: small, threshold: 0.5}\n"))
    rows = plan_rows(recipe)
    assert [(r.label, r.method, r.members, r.spec) for r in rows] == [
        ("small", "single", (0,), None), ("big", "single", (1,), None), ("third", "single", (2,), None),
        ("gac", "gac", (0, 1), 0), ("gac-t0.5", "gac", (0, 1, 2), 1)]


def test_a_schema_mistake_and_a_method_mistake_are_reported_together():
    """The method's parameters are checked even when another field fails the schema (issue 38)."""
    from ensemble_bench.errors import UserError, lines_of
    from ensemble_bench.recipe import parse_recipe

    data = {"name": "two", "members": [{"model": "smollm2-135m"}, {"model": "qwen2.5-0.5b"}],
            "method": {"name": "gac", "threshold": 2}, "tasks": ["piqa"], "seed": "abc", "limt": 3}
    with pytest.raises(UserError) as caught:
        parse_recipe(data, "r.yaml")
    lines = lines_of(caught.value)
    assert any(line.startswith("r.yaml: seed:") for line in lines), lines
    assert any(line.startswith("r.yaml: limt:") for line in lines), lines
    assert any(line.startswith("r.yaml: method.threshold:") for line in lines), lines


def test_a_member_a_method_and_a_task_mistake_are_three_lines(tmp_path, monkeypatch, capsys):
    """A member's dtype, GaC's threshold and a task's limit: the three mistakes in one pass, one line each
    (issue 48: the member's mistake hid the method's)."""
    path = write(tmp_path, GOOD.replace("- model: smollm2-135m", "- {model: smollm2-135m, dtype: float99}\n"
                                                                 "  - model: qwen2.5-0.5b")
                 .replace("method: single", "method: {name: gac, threshold: 7}").replace("limit: 5", "limit: -3"))
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run")
    lines = out.err.strip().splitlines()
    assert code == 2 and len(lines) == 3 and "Traceback" not in out.err, out.err
    assert [line.split(": ")[2] for line in lines] == ["members[0].dtype", "tasks[0].limit", "method.threshold"]


@pytest.mark.parametrize("member, placement, expected", [
    ({"name": "a/b"}, {}, ["members[0].name"]),  # the gate names it: the methods are not checked on a guess
    ({"device": "cuda", "num_gpus": "two"}, {"placement": {"kind": "ray"}},  # no second line on num_gpus
     ["members[0].num_gpus", "method.threshold"]),
    ({"dtype": "x"}, {"placement": {"kind": "rayy"}}, ["members[0].dtype", "placement.kind", "method.threshold"]),
])
def test_the_rest_of_a_failing_recipe_is_checked_without_the_fields_that_failed(member, placement, expected):
    from ensemble_bench.errors import UserError, lines_of
    from ensemble_bench.recipe import parse_recipe

    data = {"name": "rest", "members": [{"model": "smollm2-135m", **member}, {"model": "qwen2.5-0.5b"}],
            "method": {"name": "gac", "threshold": 7, "gate": member.get("name", "smollm2-135m")}, "tasks": ["piqa"],
            **placement}
    with pytest.raises(UserError) as caught:
        parse_recipe(data, "r.yaml")
    assert [line.split(": ")[1] for line in lines_of(caught.value)] == expected


def test_the_plan_is_built_once_per_command(tmp_path, monkeypatch, capsys):
    """The rows and their validated parameters are planned once, when the recipe is read, and every
    later step (preflight, the printed plan, keys, the run) reads ``recipe.plan`` (issue 38)."""
    import yaml

    from ensemble_bench.recipe import load as recipe_module
    from ensemble_bench.recipe import schema as recipe_schema

    calls, validations = [], []
    planned, validate = recipe_schema.plan_rows, recipe_schema.validate_method
    for module in (recipe_module, recipe_schema):  # the loading and the schema (Recipe.plan) each call them
        monkeypatch.setattr(module, "plan_rows", lambda *a, **k: calls.append(1) or planned(*a, **k))
        monkeypatch.setattr(module, "validate_method", lambda *a, **k: validations.append(1) or validate(*a, **k))
    data = yaml.safe_load((Path(__file__).parents[2] / "recipes" / "offline" / "demo.yaml").read_text())
    data.pop("method")
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump({**data, "output": str(tmp_path / "out"),
                                    "methods": [{"name": "gac"}, {"name": "unite", "label": "u"}]}))
    monkeypatch.setattr(sys, "argv", ["ensbench", "run", str(path), "--dry-run"])
    main()  # returns on success (a refusal would exit)
    assert "plan: demo" in capsys.readouterr().out
    assert calls == [1]
    assert len(validations) == 2 * 2  # each method entry: checked once, planned once
