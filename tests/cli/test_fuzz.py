"""Property-based fuzzing of the command line (issue 30): mutated shipped recipes through
``run --dry-run`` and hostile argument vectors through every command never end in exit 70, a
traceback, more than one error line or a file written outside the output; a smoke pass runs the
runtime-only fields through real tiny runs; every failure the fuzzer found is a named test below.

Bound: ENSBENCH_FUZZ_EXAMPLES examples per command (default 40; `make fuzz` runs 400) and three
times as many recipes (a dry run is cheap), with the fixed seed ENSBENCH_FUZZ_SEED (default 30);
no example database is kept.
"""

import contextlib
import io
import logging
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest
import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from ensemble_bench.members import Prompt
from ensemble_bench.methods import LoglikelihoodRequest
from ensemble_bench.methods.gac import Gac, GacParams
from tests.cli_helpers import one_line, run_cli
from tests.fake_runs import BASE_RECIPE, ROWS, fake_run
from tests.fuzz_strategies import (
    COMMANDS,
    PLAUSIBLE_OPTIONS,
    ROOT,
    alias_bomb,
    argument_vectors,
    call_cli,
    call_with_argv,
    deep_flow,
    dry_run,
    is_finite_json,
    mutated_recipes,
    sandbox,
)
from tests.tolerances import TINY_MODEL, assert_close

set_hypothesis_home_dir(tempfile.mkdtemp(prefix="ensbench-hypothesis-"))  # nothing of hypothesis in the checkout
EXAMPLES = int(os.environ.get("ENSBENCH_FUZZ_EXAMPLES", "40"))
SEED = int(os.environ.get("ENSBENCH_FUZZ_SEED", "30"))
SHIPPED_DEMO = yaml.safe_load((ROOT / "recipes/offline/demo.yaml").read_text())
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=False,
                suppress_health_check=list(HealthCheck))


# --- the fuzzer ----------------------------------------------------------------------------------------------------
@seed(SEED)
@settings(FUZZ, max_examples=3 * EXAMPLES)
@given(case=mutated_recipes())
def test_a_mutated_shipped_recipe_is_a_plan_or_one_line(case):
    with sandbox() as box:
        outcome = dry_run(box, case)
    assert not outcome.problems(), (outcome.problems(), outcome.code, outcome.err[-2000:])
    assert not (case.refuse and outcome.code == 0), f"the dry run accepted {case.refuse}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
@seed(SEED)
@FUZZ
@given(data=st.data())
def test_every_command_on_hostile_arguments_is_a_result_or_one_line(command, data):
    case = data.draw(argument_vectors(command), label="argv")
    with sandbox() as box:
        outcome = call_with_argv(box, case)
    assert not outcome.problems(), (outcome.problems(), outcome.argv, outcome.code, outcome.err[-2000:])


# --- the smoke pass: runtime-only fields through real tiny runs (limit 1) ------------------------------------------
SMOKE = {  # recipe fields -> whether the run must be refused (exit 2) rather than finish (exit 0)
    "largest seed, 1 shot, window 0, uneven weights": (
        {"seed": 2**32 - 1, "shots": 1, "window": 0, "weights": "[0.3, 0.7]"}, False),
    "seed -1": ({"seed": -1}, True),
    "seed 99999999999": ({"seed": 99999999999}, True),
    "shots above the data": ({"shots": 100000}, True),
    "NaN weight": ({"weights": "[.nan, 1.0]"}, True),
    "infinite weight": ({"weights": "[.inf, 1.0]"}, True),
    "window 65": ({"window": 65}, True),
}


def smoke_recipe(dirs, fields: dict) -> str:
    fields = {"seed": 1234, "shots": 0, "window": 4, "weights": "average", **fields}
    return textwrap.dedent(f"""\
        name: smoke
        members:
          - {{model: {dirs[0]}, name: bpe}}
          - {{model: {dirs[1]}, name: sp}}
        method: {{name: gac, weights: {fields['weights']}, window: {fields['window']}}}
        tasks:
          - {{name: piqa, limit: 1, shots: {fields['shots']}}}
        seed: {fields['seed']}
        data: offline
        output: out
    """)


@pytest.mark.usefixtures("offline_data")
@pytest.mark.parametrize("case", sorted(SMOKE))
def test_runtime_fields_through_a_real_tiny_run_are_a_result_or_one_line(case, tiny_dirs):
    fields, refused = SMOKE[case]
    with sandbox() as box:
        recipe = box.root / "recipe.yaml"
        recipe.write_text(smoke_recipe(tiny_dirs, fields))
        # a real run also fills the libraries' caches under $HOME/.cache (the Hugging Face datasets cache)
        outcome = call_cli(box, ["run", str(recipe)], [box.cwd / "out", box.home / ".cache"], limit_s=300)
        written = [p.read_text() for p in (box.cwd / "out").rglob("*.json")]
    assert not outcome.problems(), (outcome.problems(), outcome.err[-3000:])
    assert outcome.code == (2 if refused else 0), outcome.err[-3000:]
    assert all(is_finite_json(text) for text in written), "a result file holds NaN or infinity"
    assert refused or written


# --- every distinct failure the fuzzer found, as a named test ------------------------------------------------------
def test_gac_zero_or_underflowing_weight_scores_multiple_choice(pair):
    """weights: [0.0, 1.0] (a member kept for gating only, GaC Table 5) took log(0) in the scoring (exit 70)."""
    a, b = pair()
    request = LoglikelihoodRequest(Prompt(text="Question: 12 plus 30?\nAnswer:"), " 42")
    alone = b.score([b.encode_pair(request.prompt.text, request.continuation)])[0].logprob
    for weights in ([0.0, 1.0], [1e-300, 1.0]):
        [score] = Gac([a, b], GacParams(weights=weights)).loglikelihood([request])
        assert_close(score.logprob, alone, TINY_MODEL, what=str(weights))


def recipe_file(tmp_path, text: str):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return str(path)


def demo_recipe(tmp_path, **fields) -> dict:
    demo = yaml.safe_load((ROOT / "recipes/offline/demo.yaml").read_text())
    return {**demo, "output": str(tmp_path / "out"), **fields}


def test_a_deeply_nested_recipe_value_is_one_line(tmp_path, monkeypatch, capsys):
    """3000 nested flow lists: RecursionError in the YAML reader, a 400 kB traceback (exit 70)."""
    recipe = demo_recipe(tmp_path)
    del recipe["description"]
    text = yaml.safe_dump(recipe, sort_keys=False) + "description: " + deep_flow(3000, False) + "\n"
    code, out = run_cli(monkeypatch, capsys, "run", recipe_file(tmp_path, text), "--dry-run")
    assert code == 2 and one_line(out)


def test_an_alias_bomb_is_one_short_line(tmp_path, monkeypatch, capsys):
    """9**7 strings through nested aliases in a sweep: the error echoed all of them (megabytes on one line)."""
    text = yaml.safe_dump(demo_recipe(tmp_path), sort_keys=False) + f"sweep: {{threshold: {alias_bomb(9, 7)}}}\n"
    code, out = run_cli(monkeypatch, capsys, "run", recipe_file(tmp_path, text), "--dry-run")
    assert code == 2 and len(one_line(out)) < 2000


def test_a_long_value_of_the_wrong_type_is_echoed_shortened(tmp_path, monkeypatch, capsys):
    """A 30000-character string given as a member's weight was echoed in full in the error line."""
    recipe = demo_recipe(tmp_path)
    recipe["members"][0]["weight"] = "ø" * 30000
    code, out = run_cli(monkeypatch, capsys, "run", recipe_file(tmp_path, yaml.safe_dump(recipe)), "--dry-run")
    assert code == 2 and "members[0].weight" in one_line(out) and len(one_line(out)) < 2000


def test_a_model_name_too_long_for_the_file_system_is_one_line(tmp_path, monkeypatch, capsys):
    """members[0].model of 300 characters: OSError ENAMETOOLONG while checking whether it is a folder (exit 70)."""
    recipe = demo_recipe(tmp_path)
    recipe["members"][0]["model"] = "\x80f" * 150
    code, out = run_cli(monkeypatch, capsys, "run", recipe_file(tmp_path, yaml.safe_dump(recipe)), "--dry-run")
    assert code in (1, 2) and "members[0].model" in one_line(out)


@pytest.mark.parametrize("field,value", [("seed", -1), ("seed", 99999999999)])
def test_a_seed_out_of_range_is_refused_by_the_dry_run(field, value, tmp_path, monkeypatch, capsys):
    text = yaml.safe_dump(demo_recipe(tmp_path, **{field: value}), sort_keys=False)
    code, out = run_cli(monkeypatch, capsys, "run", recipe_file(tmp_path, text), "--dry-run")
    assert code == 2 and "seed" in one_line(out)


def test_a_benchmark_listed_twice_is_refused_by_the_dry_run(tmp_path, monkeypatch, capsys):
    recipe = demo_recipe(tmp_path)
    recipe["tasks"].append(recipe["tasks"][0])  # written as an anchor and an alias
    code, out = run_cli(monkeypatch, capsys, "run", recipe_file(tmp_path, yaml.safe_dump(recipe)), "--dry-run")
    assert code == 2 and "tasks[2]" in one_line(out)


@pytest.mark.parametrize("weights", ["[.nan, 1.0]", "[.inf, 1.0]"])
def test_a_non_finite_weight_is_refused_by_the_dry_run(weights, tmp_path, monkeypatch, capsys):
    text = yaml.safe_dump(demo_recipe(tmp_path), sort_keys=False).replace("weights: average", f"weights: {weights}")
    code, out = run_cli(monkeypatch, capsys, "run", recipe_file(tmp_path, text), "--dry-run")
    assert code == 2 and "weights" in one_line(out)


@pytest.mark.parametrize("command", ["compare", "plot", "table", "regress", "regress --baseline"])
def test_a_run_path_too_long_for_the_file_system_is_one_line(command, tmp_path, monkeypatch, capsys):
    """A 300-character path component: OSError ENAMETOOLONG in resolve_run or finished_recipe (exit 70)."""
    run = str(fake_run(tmp_path / "run", ROWS, BASE_RECIPE))
    args = {"compare": ["compare", "x" * 300], "plot": ["plot", "x" * 300, "--out", str(tmp_path / "plot")],
            "table": ["table", "x" * 300, "--layout", "gac_table3"],
            "regress": ["regress", "x" * 300, "--baseline", run],
            "regress --baseline": ["regress", run, "--baseline", "x" * 300]}[command]
    monkeypatch.chdir(tmp_path)
    code, out = run_cli(monkeypatch, capsys, *args)
    assert code in (1, 2) and one_line(out)


@pytest.mark.parametrize("command", ["plot", "table", "compare"])
def test_an_out_name_too_long_for_the_file_system_is_one_line(command, tmp_path, monkeypatch, capsys):
    """--out with a 300-character name: OSError ENAMETOOLONG while saving (exit 70)."""
    run = fake_run(tmp_path / "run", ROWS, BASE_RECIPE)
    extra = ["--layout", "gac_table3"] if command == "table" else []
    code, out = run_cli(monkeypatch, capsys, command, str(run), "--out", str(tmp_path / ("o" * 300)), *extra)
    assert code in (1, 2) and one_line(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_plot_with_an_empty_out_is_one_line(tmp_path, monkeypatch, capsys):
    """`plot --out=`: ValueError "PosixPath('.') has an empty name" (exit 70)."""
    run = fake_run(tmp_path / "run", ROWS, BASE_RECIPE)
    monkeypatch.chdir(tmp_path)  # where an empty --out would point
    code, out = run_cli(monkeypatch, capsys, "plot", str(run), "--out=")
    assert code == 2 and "--out" in one_line(out) and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.parametrize("option", ["--layout", "--method"])
def test_an_unknown_name_with_line_breaks_is_echoed_on_one_line(option, tmp_path, monkeypatch, capsys):
    """An unknown `table --layout` or `select --method` holding line breaks (\\n, U+0085) was echoed
    as given: the error spread over several lines."""
    run = fake_run(tmp_path / "run", ROWS, BASE_RECIPE)
    command = {"--layout": "table", "--method": "select"}[option]
    monkeypatch.chdir(tmp_path)
    code, out = run_cli(monkeypatch, capsys, command, str(run), option, "nope\n\nsecond\x85third")
    assert code == 2 and "nope" in one_line(out) and len(out.err.splitlines()) == 1


@pytest.mark.parametrize("command", [["--help"], ["list"]])
def test_ensbench_threads_abc_is_one_line(command):
    """ENSBENCH_THREADS=abc was read when the command line was built: a traceback on every command."""
    done = subprocess.run([sys.executable, "-m", "ensemble_bench.cli", *command], capture_output=True, text=True,
                          env={**os.environ, "ENSBENCH_THREADS": "abc"}, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 0 or (done.returncode == 2 and len(lines) == 1 and "ENSBENCH_THREADS" in lines[0])


# --- hostile task folders (issue 41): include_path entries lm-eval's index would open ---------------------------
# data_files are read from the working folder (the sandbox's), where the folder is tasks/ (a missing data file is
# refused since issue 47)
TASK = ("task: my_task\ndataset_path: json\ndataset_kwargs: {data_files: {test: tasks/data.jsonl}}\ntest_split: test\n"
        "output_type: generate_until\ndoc_to_text: '{{q}}'\ndoc_to_target: '{{a}}'\n")
FOLDER_ENTRIES = {  # name -> how to make it in a folder
    "pipe": lambda folder: os.mkfifo(folder / "pipe.yaml"),
    "symlink loop": lambda folder: (folder / "loop").symlink_to(folder, target_is_directory=True),
    "dangling link": lambda folder: (folder / "gone.yaml").symlink_to(folder / "nowhere.yaml"),
    "huge data file": lambda folder: os.truncate(_touch(folder / "big.jsonl"), 1 << 31),
    "huge task file": lambda folder: os.truncate(_touch(folder / "huge.yaml"), 64 << 20),
    "alias bomb": lambda folder: (folder / "bomb.yaml").write_text(f"task: bomb\nx: {alias_bomb(9, 7)}\n"),
    "deep nesting": lambda folder: (folder / "deep.yaml").write_text(f"task: deep\nx: {deep_flow(3000, False)}\n"),
    "not UTF-8": lambda folder: (folder / "latin.yaml").write_bytes(b"task: caf\xe9\n"),
    "not YAML": lambda folder: (folder / "broken.yaml").write_text("task: [unclosed\n"),
    "missing module": lambda folder: _append(folder / "my_task.yaml", "process_docs: !function nowhere_mod.fn\n"),
    "local module": lambda folder: (_append(folder / "my_task.yaml", "process_docs: !function helpers.fn\n"),
                                    (folder / "helpers.py").write_text("raise SystemExit('imported')\n")),
}


def _touch(path):
    path.touch()
    return path


def _append(path, text):
    path.write_text(path.read_text() + text)


@seed(SEED)
@FUZZ
@given(kinds=st.lists(st.sampled_from(sorted(FOLDER_ENTRIES)), min_size=1, max_size=4, unique=True))
def test_a_hostile_task_folder_is_a_plan_or_one_line_within_the_time_limit(kinds):
    with sandbox() as box:
        folder = box.cwd / "tasks"
        folder.mkdir()
        (folder / "data.jsonl").write_text('{"q": "1+1?", "a": "2"}\n')
        (folder / "my_task.yaml").write_text(TASK)
        for kind in kinds:
            FOLDER_ENTRIES[kind](folder)
        recipe = {**SHIPPED_DEMO, "output": "out", "tasks": [{"name": "my_task", "limit": 1}],
                  "include_path": str(folder)}
        path = box.root / "recipe.yaml"
        path.write_text(yaml.safe_dump(recipe))
        outcome = call_cli(box, ["run", str(path), "--dry-run"], [box.cwd / "out"])
    assert not outcome.problems(), (kinds, outcome.problems(), outcome.code, outcome.err[-2000:])
    refused = {"pipe", "huge task file", "alias bomb", "deep nesting", "missing module", "local module"}
    assert (outcome.code == 2) == bool(refused & set(kinds)), (kinds, outcome.code, outcome.err[-2000:])


@pytest.mark.parametrize("value", PLAUSIBLE_OPTIONS["--set"])
def test_every_hostile_set_value_is_a_plan_or_one_line(value):
    """The fuzzer's --set values one by one (issue 41): an alias bomb, a 3000-level path, a typo, a NaN ..."""
    with sandbox() as box:
        recipe = box.root / "recipe.yaml"
        recipe.write_text(yaml.safe_dump({**SHIPPED_DEMO, "output": "out"}))
        outcome = call_cli(box, ["run", str(recipe), "--dry-run", "--set", value], [box.cwd / "out"])
    assert not outcome.problems(), (value[:80], outcome.problems(), outcome.code, outcome.err[-2000:])


# --- ensbench-lm-eval's arguments (issue 41): members that do not exist, so no example loads a model ------------
LM_EVAL_BASE = ["run", "--model", "gac", "--tasks", "piqa", "--model_args",
                '{"members": [{"model": "/no/such/model-a"}, {"model": "/no/such/model-b"}]}']
LM_EVAL_HOSTILE = {
    "--limit": ["-1", "0", "nan", "abc", "1e999", "0.5"],
    "--threads": ["-3", "abc", "99999999999999999999"],
    "--model_args": ['{"members": [', "[]", '{"members": []}', '{"members": [{"model": 3}]}', '{"nope": 1}',
                     '{"members": [{"model": "../../etc"}], "method": {"weights": [1e-320, 1e-320]}}'],
    "--batch_size": ["-1", "0", "auto:abc", "abc"],
    "--device": ["cuda:9", "bogus", ""],
    "--tasks": ["nope_task", ",", ""],
    "--include_path": ["/no/such/folder", "/etc/hostname"],
    "--output_path": ["/etc/hostname/x"],
}


@seed(SEED)
@settings(FUZZ, max_examples=max(10, EXAMPLES // 2))
@given(chosen=st.lists(st.sampled_from(sorted(LM_EVAL_HOSTILE)), min_size=1, max_size=3, unique=True),
       data=st.data())
def test_hostile_lm_eval_arguments_are_one_line_before_any_model_loads(chosen, data):
    argv = list(LM_EVAL_BASE)
    for option in chosen:
        value = data.draw(st.sampled_from(LM_EVAL_HOSTILE[option]), label=option)
        if option in argv:
            argv[argv.index(option) + 1] = value
        else:
            argv += [option, value]
    with pytest.MonkeyPatch.context() as monkeypatch, tempfile.TemporaryDirectory() as folder:
        monkeypatch.chdir(folder)
        for name in ("", "lm_eval", "lm-eval"):  # handlers an earlier test bound to a stream since closed
            monkeypatch.setattr(logging.getLogger(name), "handlers", [])
        out, err = io.StringIO(), io.StringIO()
        monkeypatch.setattr(sys, "argv", ["ensbench-lm-eval", *argv])
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            from ensemble_bench.cli import lm_eval as lm_eval_cli

            try:
                lm_eval_cli.main()
                code = 0
            except SystemExit as done:
                code = done.code
    errors = [line for line in err.getvalue().splitlines()  # ours, or lm-eval's argparse ("lm-eval run: error: ...")
              if line.startswith("error: ") or ": error: " in line]
    assert code in (1, 2), (argv, code, err.getvalue()[-1500:])
    assert "Traceback" not in err.getvalue() + out.getvalue(), (argv, err.getvalue()[-1500:])
    assert errors and len(err.getvalue()) < 20_000, (argv, err.getvalue()[-1500:])
