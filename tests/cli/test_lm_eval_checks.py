"""`ensbench-lm-eval run` checks its command line as `ensbench run` checks a recipe (issue 47, item 5): each
input below reached a traceback (exit 70) or passed silently on bb736f1; now each is one line, exit 2,
before lm-eval matches the tasks and before any model loads."""

import json

import pytest

from ensemble_bench.cli.lm_eval_checks import nesting
from ensemble_bench.yaml_limits import MAX_YAML_DEPTH
from tests.cli.test_lm_eval_route import lm_eval, members
from tests.cli_helpers import one_line


@pytest.fixture
def nothing_loads(monkeypatch):
    """A member loading, or lm-eval matching the tasks, fails the test."""
    from lm_eval.config.evaluate_config import EvaluatorConfig

    import ensemble_bench.run.build

    monkeypatch.setattr(ensemble_bench.run.build, "load_member", lambda **kwargs: pytest.fail("a member loaded"))
    monkeypatch.setattr(EvaluatorConfig, "process_tasks", lambda *_, **__: pytest.fail("the tasks loaded"))


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("argv, option", [
    (["--model", "gac", "--model_args", '{{"members": {m}, "extra": ' + deep(12_000) + "}}"], "--model_args"),
    (["--model", "gac", "-a", '{{"members": {m}, "extra": ' + deep(40_000) + "}}"], "-a"),
    (["--model", "gac", "--model_args", '{{"members": {m}}}', "--gen_kwargs", '{{"until": ' + deep(20_000) + "}}"],
     "--gen_kwargs"),
])
def test_deeply_nested_json_is_one_line_before_lm_eval_parses_it(tiny_dirs, nothing_loads, monkeypatch, capsys,
                                                                 argv, option):
    """lm-eval's json.loads of --model_args ended in RecursionError (exit 70) at 12,000-40,000 levels."""
    argv = [a.format(m=json.dumps(members(tiny_dirs))) for a in argv]
    code, out = lm_eval(monkeypatch, capsys, "run", *argv, "--tasks", "piqa")
    assert code == 2 and one_line(out).startswith(f"error: {option}: a value nested more than {MAX_YAML_DEPTH} levels")


def test_nesting_counts_brackets_up_to_the_limit():
    assert nesting('{"a": [1, {"b": (2,)}]}') == 4
    assert nesting(deep(MAX_YAML_DEPTH)) == MAX_YAML_DEPTH
    assert nesting(deep(10**6)) == MAX_YAML_DEPTH + 1  # stops counting there


@pytest.mark.parametrize("argv, words", [
    (["--model", "nosuchmethod"], "error: --model 'nosuchmethod': no such model;"),
    (["--model", "gacc", "--model_args", '{{"members": {m}}}'], "error: --model 'gacc': no such model (close: gac"),
    (["--model", "gac", "--model_args", '{{"members": {m}}}', "--num_fewshot", "-1"],
     "error: --num_fewshot -1: give 0 or more examples"),
    (["--model", "gac", "--model_args", '{{"members": {m}}}', "--gen_kwargs", "max_gen_toks=-5"],
     "error: --gen_kwargs: max_gen_toks: Input should be greater than 0 (got -5"),
    (["--model", "hf", "--model_args", "pretrained=x", "--gen_kwargs", "temperature=-1", "top_p=2"],
     "error: --gen_kwargs: temperature: Input should be greater than or equal to 0 (got -1"),
])
def test_route_arguments_get_the_recipe_checks_before_the_tasks_load(tiny_dirs, nothing_loads, monkeypatch, capsys,
                                                                     argv, words):
    """--model nosuchmethod: three chained tracebacks 147 s in, after the tasks loaded; --num_fewshot -1 and
    --gen_kwargs max_gen_toks=-5 were accepted silently."""
    argv = [a.format(m=json.dumps(members(tiny_dirs))) for a in argv]
    code, out = lm_eval(monkeypatch, capsys, "run", *argv, "--tasks", "piqa")
    lines = [line for line in out.err.splitlines() if line.startswith("error:")]
    assert code == 2 and "Traceback" not in out.err and lines[0].startswith(words), out.err
    if "top_p=2" in argv:  # every mistake at once
        assert lines[1].startswith("error: --gen_kwargs: top_p: Input should be less than or equal to 1 (got 2)")


def test_settings_lm_eval_alone_takes_pass_through(tiny_dirs, monkeypatch, capsys):
    """A gen_kwargs key recipes do not name (lm-eval's own) is lm-eval's to check."""
    from lm_eval.config.evaluate_config import EvaluatorConfig

    from ensemble_bench.errors import UserError

    def stop(*_, **__):
        raise UserError("stopped at the tasks")

    monkeypatch.setattr(EvaluatorConfig, "process_tasks", stop)
    code, out = lm_eval(monkeypatch, capsys, "run", "--model", "gac", "--model_args",
                        json.dumps({"members": members(tiny_dirs)}), "--tasks", "piqa", "--num_fewshot", "0",
                        "--gen_kwargs", "max_gen_toks=5", "repetition_penalty=1.1")
    assert code == 2 and one_line(out) == "error: stopped at the tasks"
