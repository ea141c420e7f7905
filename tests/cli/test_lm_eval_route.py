"""`ensbench-lm-eval` behaves like `lm_eval`: --batch_size auto, --device, --output_path, --log_samples,
the method named by --model, offline task data, and a run folder that `ensbench table` and `compare` read."""

import json
import logging
import sys

import pytest

from ensemble_bench.errors import UserError
from ensemble_bench.run.build import AUTO_BATCH_SIZE, batch_size_of, method_entry, recipe_from_model_args
from tests.cli_helpers import one_line, run_cli


def members(tiny_dirs, **extra) -> list[dict]:
    return [{"model": str(tiny_dirs[0]), "name": "a", **extra}, {"model": str(tiny_dirs[1]), "name": "b"}]


def lm_eval(monkeypatch, capsys, *argv):
    """``ensbench-lm-eval ARGV`` in this process: (exit code, captured stdout and stderr)."""
    from ensemble_bench.cli.lm_eval import main

    monkeypatch.setattr(sys, "argv", ["ensbench-lm-eval", *argv])
    try:
        main()
        code = 0
    except SystemExit as done:
        code = done.code or 0
    return code, capsys.readouterr()


# --- the pure rules -----------------------------------------------------------------------------------------
def test_auto_batch_size_is_the_model_args_one_else_the_default_capped_by_max_batch_size():
    assert batch_size_of(3, {"batch_size": "auto"}) == 3
    assert batch_size_of(None, {"batch_size": "auto:4"}) == AUTO_BATCH_SIZE
    assert batch_size_of(None, {"batch_size": "auto", "max_batch_size": 2}) == 2
    assert batch_size_of(None, {"batch_size": "4"}) == 4
    assert batch_size_of(5, {"batch_size": 1}) == 5  # lm-eval passes 1 when --batch_size is not given
    with pytest.raises(UserError, match="--batch_size: a whole number"):
        batch_size_of(None, {"batch_size": "many"})


def test_the_model_names_the_method_and_a_conflicting_method_is_refused():
    assert method_entry({"threshold": 0.5}, "gac") == {"threshold": 0.5, "name": "gac"}
    assert method_entry(None, "unite") == "unite"
    with pytest.raises(UserError, match="--model gac but --model_args names method 'unite'"):
        method_entry({"name": "unite"}, "gac")


def test_device_places_members_without_their_own_and_one_row_only(tiny_dirs):
    recipe = recipe_from_model_args({"members": members(tiny_dirs, device="cpu")}, "gac", {"device": "mps"})
    assert [m.device for m in recipe.members] == ["cpu", "mps"]
    with pytest.raises(UserError, match="'methods' plans several rows"):
        recipe_from_model_args({"members": members(tiny_dirs), "methods": ["gac"]}, "gac", {})
    with pytest.raises(UserError, match="evaluates one member alone, got 2 members"):
        recipe_from_model_args({"members": members(tiny_dirs)}, "single", {})


# --- the command line -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, code, words", [
    (["--model", "gac", "--model_args", "{{\"members\": {m}, \"method\": \"unite\"}}"], 2, "--model gac but"),
    (["--model", "gac", "--device", "gpu0", "--model_args", "{{\"members\": {m}}}"], 2, "--device: 'gpu0'"),
    (["--model", "gac", "--batch_size", "4", "--model_args", "{{\"members\": {m}, \"batch_size\": 2}}"], 2,
     "--batch_size 4 but --model_args sets batch_size 2"),
    (["--model", "gac", "--model_args", "{{\"members\": {m}}}", "--tasks", "no_such_task_xyz"], 2,
     "Tasks not found"),
])
def test_a_mistake_on_the_command_line_is_one_line_before_any_model_loads(tiny_dirs, monkeypatch, capsys, argv,
                                                                         code, words):
    argv = [a.format(m=json.dumps(members(tiny_dirs))) for a in argv]
    tasks = [] if "--tasks" in argv else ["--tasks", "piqa"]
    got, out = lm_eval(monkeypatch, capsys, "run", *argv, *tasks)
    assert got == code and words in one_line(out)


@pytest.mark.parametrize("flag, value, words", [
    ("--limit", "-1", "--limit -1: give a positive number of examples"),
    ("--limit", "0", "--limit 0: give a positive number of examples"),
    ("--threads", "-2", "--threads -2: give 0"),
])
def test_a_bad_limit_or_threads_is_one_line_before_any_model_loads(tiny_dirs, monkeypatch, capsys, flag, value, words):
    """lm-eval took --limit -1 and failed in islice after the members loaded."""
    import ensemble_bench.run.build

    monkeypatch.setattr(ensemble_bench.run.build, "load_member", lambda **kwargs: pytest.fail("a member loaded"))
    code, out = lm_eval(monkeypatch, capsys, "run", "--model", "gac", "--tasks", "piqa", flag, value,
                        "--model_args", json.dumps({"members": members(tiny_dirs)}))
    assert code == 2 and words in one_line(out)


@pytest.mark.parametrize("model", ["gac", "dummy"])  # an ensbench model, and one of lm-eval's own
def test_lm_evals_limit_warning_is_said_once(model, tiny_dirs, monkeypatch, capsys, caplog):
    """ensbench reads the command line before lm-eval does (EvaluatorConfig.from_cli, which warns of --limit)."""
    import lm_eval as harness
    from lm_eval import utils as harness_utils

    def stop(**_):
        raise UserError("stopped before evaluating")

    monkeypatch.setattr(harness, "simple_evaluate", stop)
    monkeypatch.setattr(harness_utils, "_LOGGING_CONFIGURED", True)  # lm-eval's records go to caplog only
    monkeypatch.setattr(logging.getLogger("lm_eval"), "handlers", [])
    monkeypatch.setattr(logging.getLogger("lm_eval"), "propagate", True)
    code, out = lm_eval(monkeypatch, capsys, "run", "--model", model, "--tasks", "piqa", "--limit", "2",
                        "--model_args", json.dumps({"members": members(tiny_dirs)}) if model == "gac" else "")
    assert code == 2 and "stopped before evaluating" in one_line(out)
    assert [record.getMessage() for record in caplog.records].count(
        "--limit SHOULD ONLY BE USED FOR TESTING. REAL METRICS SHOULD NOT BE COMPUTED USING LIMIT.") == 1


def test_threads_is_in_the_run_help(monkeypatch, capsys):
    code, out = lm_eval(monkeypatch, capsys, "run", "--help")
    assert code == 0 and "--threads" in out.out and "ensbench run --threads" in " ".join(out.out.split())


def test_missing_task_data_with_the_hub_offline_is_one_line(tiny_dirs, tmp_path, monkeypatch, capsys):
    (tmp_path / "mine.yaml").write_text("task: mine\ndataset_path: nobody/no-such-dataset\noutput_type: "
                                        "multiple_choice\ntest_split: test\ndoc_to_text: q\ndoc_to_target: 0\n"
                                        "doc_to_choice: ['a', 'b']\n")
    code, out = lm_eval(monkeypatch, capsys, "run", "--model", "gac", "--tasks", "mine", "--include_path",
                        str(tmp_path), "--model_args", json.dumps({"members": members(tiny_dirs)}))
    assert code == 1 and "a task's data cannot be loaded with the hub offline" in one_line(out)


@pytest.mark.slow
def test_the_documented_route_runs_offline_and_ensbench_reads_its_run(tiny_dirs, offline_data, tmp_path,
                                                                     monkeypatch, capsys):
    """The issue's example: --batch_size auto --device cpu --log_samples on PIQA with the hub offline, then
    `ensbench table` and `compare` on the run folder named by the model arguments."""
    args = json.dumps({"members": members(tiny_dirs), "method": {"threshold": 0.5}, "batch_size": 2})
    code, out = lm_eval(monkeypatch, capsys, "run", "--model", "gac", "--model_args", args, "--tasks", "piqa",
                        "--limit", "2", "--batch_size", "auto", "--device", "cpu", "--log_samples",
                        "--output_path", str(tmp_path / "out"), "--threads", "1")
    assert code == 0, out.err[-3000:]
    assert "gac: piqa 2 of 2 examples done" in out.err  # progress while the requests run
    run = tmp_path / "out" / "gac-a+b"
    results = json.loads(next((run / "gac").glob("results_*.json")).read_text())
    config = results["config"]
    assert config["model"] == "gac" and config["ensbench"]["params"]["threshold"] == 0.5
    assert config["device"] == "cpu" and config["batch_size"] == "auto" and config["batch_sizes"] == [2]
    assert results["n-samples"]["piqa"]["effective"] == 2 and list((run / "gac").glob("samples_piqa_*.jsonl"))
    assert (run / "summary.md").exists() and "piqa" in (run / "recipe.yaml").read_text()
    code, out = run_cli(monkeypatch, capsys, "table", str(run))
    assert code == 0 and "| gac" in out.out and "piqa" in out.out, out
    code, out = run_cli(monkeypatch, capsys, "compare", str(run))  # it reads the run: one row, nothing to compare
    assert code == 2 and "compare needs two rows or more" in one_line(out)
    timing = json.loads((run / "gac" / "timing.json").read_text())
    assert timing["requests_scored"] == 4 and timing["loglikelihood_ms_per_request"] > 0  # 2 questions x 2 choices
    assert timing["position_ties"] == {"piqa": {"questions": 2, "tied": 0}}  # from the samples (--log_samples)
    code, out = run_cli(monkeypatch, capsys, "plot", str(run), "--out", str(tmp_path / "plot"))
    assert code == 0 and "warning" not in out.err and (tmp_path / "plot.png").exists(), out


def test_model_args_carry_the_seed_and_the_sampling_override(tiny_dirs):
    """--model_args is a recipe fragment: its seed and sampling: reach the model, as a recipe's do."""
    from ensemble_bench.decoding.request_sampling import SamplingPolicy
    from ensemble_bench.decoding.sampling import SamplingOverride
    from ensemble_bench.run.lm import LM_CLASSES

    lm = LM_CLASSES["gac"].create_from_arg_obj({"members": members(tiny_dirs), "seed": 7,
                                                "sampling": {"temperature": 0.5}}, {})
    assert lm.sampling == SamplingPolicy(7, SamplingOverride(temperature=0.5))
    info = lm.get_model_info()["ensbench"]
    assert (info["sampling_seed"], info["sampling_override"]) == (7, {"temperature": 0.5})
