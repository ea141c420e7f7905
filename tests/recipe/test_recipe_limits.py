"""Recipe-level limits (issue 30): every value that would fail or poison a run after the members are
loaded is refused by the dry run in one line, exit 2: non-finite floats, all-zero weights, seeds out
of range, a benchmark listed twice, more shots than the few-shot pool holds, a limit past lm-eval's
slicing, and YAML past its limits (size, nesting, alias expansion)."""

import math
import sys
from types import UnionType
from typing import Union, get_args, get_origin

import pytest
import yaml
from pydantic import ValidationError

from ensemble_bench.errors import UserError
from ensemble_bench.methods import METHODS
from ensemble_bench.recipe import (
    LIMIT_MAX,
    MAX_RECIPE_BYTES,
    MAX_YAML_DEPTH,
    SEED_MAX,
    load_recipe,
    parse_recipe,
    validate_method,
)
from ensemble_bench.tasks import get_benchmark, list_benchmarks
from tests.cli_helpers import dry_run, one_line

RECIPE = """\
name: limits
members:
  - {{model: smollm2-135m, name: a{member}}}
  - {{model: qwen2.5-0.5b, name: b}}
method: {{name: {method}}}
tasks: {tasks}
data: {data}
output: {output}
{extra}"""


def recipe_text(tmp_path, method="gac", member="", tasks="[piqa]", data="offline", extra="") -> str:
    return RECIPE.format(method=method, member=member, tasks=tasks, data=data, output=tmp_path / "out", extra=extra)


def refused(monkeypatch, capsys, tmp_path, **fields) -> str:
    """The one line a dry run of the recipe prints; it must exit 2."""
    code, out = dry_run(monkeypatch, capsys, tmp_path, recipe_text(tmp_path, **fields))
    line = one_line(out)
    assert code == 2, line
    return line


def parsed(tmp_path, **fields):
    return parse_recipe(yaml.safe_load(recipe_text(tmp_path, **fields)), "recipe.yaml")


# ---------------------------------------------------------------- numbers are finite

NON_FINITE = {
    "member weight inf": ({"member": ", weight: .inf"}, "members[0].weight", "inf"),
    "member weight nan": ({"member": ", weight: .nan"}, "members[0].weight", "nan"),
    "member num_gpus": ({"member": ", num_gpus: .inf"}, "members[0].num_gpus", "inf"),
    "ray resources": ({"member": ", resources: {node_a: .nan}"}, "members[0].resources.node_a", "nan"),
    "placement timeout": ({"extra": "placement: {kind: ray, schedule_timeout_s: .inf}"},
                          "placement.schedule_timeout_s", "inf"),
    "gac weights list": ({"method": "gac, weights: [.nan, 1.0]"}, "method.weights[0]", "nan"),
    "unite weights list": ({"method": "unite, weights: [1.0, -.inf]"}, "method.weights[1]", "-inf"),
    "gac scores": ({"method": "gac, weights: score, scores: [0.5, .inf]"}, "method.scores[1]", "inf"),
    "gac threshold": ({"method": "gac, threshold: .inf"}, "method.threshold", "inf"),
    "sampling temperature": ({"extra": "sampling: {temperature: .nan}"}, "sampling.temperature", "nan"),
    "entry top_p": ({"method": "gac, sampling: {top_p: .inf}"}, "method.sampling.top_p", "inf"),
    "deepen eta": ({"method": "deepen, eta: .inf"}, "method.eta", "inf"),
    "packllm tau": ({"method": "packllm, tau: .NaN"}, "method.tau", "nan"),
    "sweetspan lambda": ({"method": "sweetspan, lambda: .inf"}, "method.lambda", "inf"),
    "safe sharpen": ({"method": "safe, sharpen: .nan"}, "method.sharpen", "nan"),
}


@pytest.mark.parametrize("fields, path, shown", NON_FINITE.values(), ids=NON_FINITE.keys())
def test_a_non_finite_float_is_one_line(tmp_path, monkeypatch, capsys, fields, path, shown):
    line = refused(monkeypatch, capsys, tmp_path, **fields)
    assert f"{tmp_path / 'recipe.yaml'}: {path}: Input should be a finite number (got {shown})" in line


def test_a_non_finite_sweep_value_is_refused_like_the_field(tmp_path, monkeypatch, capsys):
    line = refused(monkeypatch, capsys, tmp_path, extra="sweep: {threshold: [0.5, .nan]}")
    assert "sweep {'threshold': nan}: method.threshold: Input should be a finite number (got nan)" in line


def float_shapes(annotation) -> set[str]:
    """'float' and/or 'list' for the ways ``annotation`` (a union, perhaps) holds floats."""
    options = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    return ({"float"} if float in options else set()) | (
        {"list"} if any(get_origin(o) is list and get_args(o) == (float,) for o in options) else set())


def float_fields():
    """(method, field, a non-finite value of the field's shape) for every float in every Params."""
    for name, method in sorted(METHODS.items()):
        for field, info in method.Params.model_fields.items():
            for shape in sorted(float_shapes(info.annotation)):
                for bad in (math.nan, math.inf, -math.inf):
                    yield name, field, [bad, 1.0] if shape == "list" else bad


@pytest.mark.parametrize("method, field, value", list(float_fields()))
def test_every_float_of_every_method_is_finite(method, field, value):
    with pytest.raises(ValidationError, match="finite number"):
        METHODS[method].Params.model_validate({field: value})


def test_the_float_fields_are_found():
    found = {(method, field) for method, field, _ in float_fields()}
    assert {("gac", "weights"), ("gac", "threshold"), ("deepen", "scores"), ("sweetspan", "filter_ratio"),
            ("packllm", "tau"), ("safe", "gate_threshold")} <= found


WEIGHTED = ["gac", "unite", "deepen", "chared", "safe", "byte_level"]


@pytest.mark.parametrize("method", WEIGHTED)
def test_all_zero_weights_never_reach_a_division(tmp_path, monkeypatch, capsys, method):
    line = refused(monkeypatch, capsys, tmp_path, method=f"{method}, weights: [0, 0.0]")
    assert "method.weights: " in line and "positive sum" in line


@pytest.mark.parametrize("method", WEIGHTED)
def test_weights_beyond_float32_are_refused_before_they_become_inf(tmp_path, monkeypatch, capsys, method):
    line = refused(monkeypatch, capsys, tmp_path, method=f"{method}, weights: [1.0e+39, 1]")
    assert "method.weights: " in line and "sum of at most 3.4e+38" in line


@pytest.mark.parametrize("method", ["packllm", "voting", "coolfusion", "single"])
def test_a_member_weight_on_a_method_without_weights_is_refused(tmp_path, monkeypatch, capsys, method):
    """A member's weight used to be dropped without a word by a method that takes none."""
    line = refused(monkeypatch, capsys, tmp_path, method=method, member=", weight: 3.0")
    assert f"method '{method}' takes no member weights" in line


def test_a_member_weight_still_becomes_a_weighted_methods_weights(tmp_path):
    recipe = parsed(tmp_path, method="gac", member=", weight: 3.0")
    assert validate_method(recipe, recipe.ensembles[0], "recipe.yaml")[1].weights == [3.0, 1.0]


# ---------------------------------------------------------------- seeds

@pytest.mark.parametrize("seed, message", [
    (-1, "greater than or equal to 0 (got -1)"),
    (2**32, f"less than or equal to {SEED_MAX} (got {2**32})"),
    (99999999999, "less than or equal to 4294967295 (got 99999999999)"),
])
def test_a_seed_out_of_range_is_one_line(tmp_path, monkeypatch, capsys, seed, message):
    line = refused(monkeypatch, capsys, tmp_path, extra=f"seed: {seed}")
    assert f"recipe.yaml: seed: Input should be {message}" in line


def test_the_seed_range_is_what_lm_eval_takes(tmp_path):
    assert parsed(tmp_path, extra="seed: 0").seed == 0
    assert parsed(tmp_path, extra=f"seed: {2**32 - 1}").seed == 2**32 - 1
    with pytest.raises(UserError, match=r"'seed' is no longer a GaC parameter: .* the seed is the recipe's seed"):
        parsed(tmp_path, method="gac, seed: 3")


# ---------------------------------------------------------------- tasks

def test_a_benchmark_listed_twice_is_one_line(tmp_path, monkeypatch, capsys):
    line = refused(monkeypatch, capsys, tmp_path, tasks="[piqa, nq, {name: piqa, limit: 3}]")
    assert "recipe.yaml: tasks[2].name: benchmark 'piqa' is listed already (tasks[0])" in line


def test_two_variants_of_one_benchmark_are_refused_too(tmp_path):
    """Results and tables hold one score per benchmark name: the second would overwrite the first."""
    with pytest.raises(UserError, match=r"tasks\[1\].name: benchmark 'mmlu' is listed already"):
        parsed(tmp_path, tasks="[{name: mmlu, variant: generative}, {name: mmlu, variant: loglikelihood}]")


@pytest.mark.parametrize("task, message", [
    ("{name: mmlu, shots: 6}", "at most 5 for 'mmlu' with data: offline (its few-shot pool), got 6"),
    ("{name: gsm8k, shots: 1319}", "at most 1318 for 'gsm8k' with data: offline (its few-shot pool), got 1319"),
    ("{name: flores_de-en, shots: 7}", "at most 6 for 'flores_de-en' with data: offline"),
])
def test_more_shots_than_the_pool_is_one_line(tmp_path, monkeypatch, capsys, task, message):
    line = refused(monkeypatch, capsys, tmp_path, tasks=f"[piqa, {task}]")
    assert f"recipe.yaml: tasks[1].shots: {message}" in line


def test_the_shot_limit_follows_the_data_mode(tmp_path):
    assert parsed(tmp_path, tasks="[{name: gsm8k, shots: 1318}]").tasks[0].shots == 1318
    assert parsed(tmp_path, tasks="[{name: mbpp, shots: 10}]", data="hub", extra="allow_code_execution: true")
    with pytest.raises(UserError, match=r"tasks\[0\].shots: at most 10 for 'mbpp' with data: hub"):
        parsed(tmp_path, tasks="[{name: mbpp, shots: 11}]", data="hub", extra="allow_code_execution: true")
    with pytest.raises(UserError, match=r"at most 1119 for 'arc_c' with data: hub"):
        parsed(tmp_path, tasks="[{name: arc_c, shots: 1120}]", data="hub")


def test_every_benchmark_knows_its_pool_and_its_default_fits():
    for bench in list_benchmarks():
        for data in ("offline", "hub"):
            assert bench.max_shots(data) is not None and bench.default_shots <= bench.max_shots(data), (bench, data)


def rows(root, path) -> int:
    return sum(1 for line in (root / path).read_text().split("\n") if line.strip())  # not splitlines: U+2028 in text


def test_offline_pools_are_the_built_data_less_the_scored_document():
    """Copies without a train split draw shots from the scored split, minus the scored document."""
    from ensemble_bench.tasks import data_store

    root = data_store.ensure_offline_data([b for b in list_benchmarks() if b.offline and b.name != "bbh"])
    scored = {"gsm8k": "openai/gsm8k/main/test.jsonl", "triviaqa": "mandarjoshi/trivia_qa/rc.wikipedia.nocontext/"
              "validation.jsonl", "nq": "google-research-datasets/nq_open/default/validation.jsonl",
              "piqa": "baber/piqa/default/validation.jsonl", "arc_c": "allenai/ai2_arc/ARC-Challenge/test.jsonl",
              "mbpp": "google-research-datasets/mbpp/full/test.jsonl"}
    for name, path in scored.items():
        assert get_benchmark(name).offline_shots == rows(root, path) - 1, name
    dev = {rows(root, p.relative_to(root)) for p in (root / "cais/mmlu").glob("*/dev.jsonl")}
    assert dev == {get_benchmark("mmlu").offline_shots}
    assert rows(root, "facebook/flores/deu_Latn/dev.jsonl") == get_benchmark("flores_de-en").offline_shots


def test_max_shots_is_exactly_where_lm_eval_stops(tmp_path):
    """lm-eval builds a prompt with the most shots allowed, and fails with one more (the error a run
    would meet after loading the members). Tasks whose YAML ensbench writes: no stock index needed."""
    from lm_eval.tasks import TaskManager

    from ensemble_bench.tasks import task_configs

    benches = [get_benchmark("flores_de-en"), get_benchmark("mbpp"), get_benchmark("humaneval")]
    group = task_configs.write_task_configs([(b, None) for b in benches], tmp_path, "offline")
    loaded = TaskManager(include_path=str(tmp_path), include_defaults=False).load([group])
    for bench in benches:
        task = loaded["tasks"][bench.task]
        doc = next(iter(task.eval_docs))
        assert task.fewshot_context(doc, num_fewshot=bench.offline_shots)
        with pytest.raises((ValueError, AssertionError)):
            task.fewshot_context(doc, num_fewshot=bench.offline_shots + 1)


def test_bbh_lists_as_many_examples_per_task_as_its_pool():
    from pathlib import Path

    import lm_eval.tasks

    files = [p for p in Path(lm_eval.tasks.__file__).parent.joinpath("bbh/cot_fewshot").glob("*.yaml")
             if not p.name.startswith("_")]
    assert len(files) == 27
    for path in files:
        samples = yaml.safe_load(path.read_text())["fewshot_config"]["samples"]
        assert len(samples) == get_benchmark("bbh").hub_shots == get_benchmark("bbh").offline_shots, path


def test_a_huge_limit_is_fine_up_to_what_lm_eval_can_slice(tmp_path, monkeypatch, capsys):
    from lm_eval.utils import create_iterator

    assert sys.maxsize == LIMIT_MAX
    assert len(list(create_iterator(enumerate("abc"), limit=LIMIT_MAX))) == 3  # lm-eval caps it at the data
    with pytest.raises(ValueError):
        list(create_iterator(enumerate("abc"), limit=LIMIT_MAX + 1))
    assert parsed(tmp_path, tasks=f"[{{name: piqa, limit: {LIMIT_MAX}}}]").tasks[0].limit == LIMIT_MAX
    line = refused(monkeypatch, capsys, tmp_path, extra=f"limit: {LIMIT_MAX + 1}")
    assert f"recipe.yaml: limit: Input should be less than or equal to {LIMIT_MAX}" in line


# ---------------------------------------------------------------- YAML

def cli_line(monkeypatch, capsys, tmp_path, text) -> str:
    code, out = dry_run(monkeypatch, capsys, tmp_path, text)
    line = one_line(out)
    assert code == 2, line
    return line


def test_a_recipe_larger_than_the_limit_is_one_line(tmp_path, monkeypatch, capsys):
    text = recipe_text(tmp_path, extra="description: '" + "x" * MAX_RECIPE_BYTES + "'\n")
    line = cli_line(monkeypatch, capsys, tmp_path, text)
    assert f"recipe.yaml: larger than {MAX_RECIPE_BYTES} bytes (1 MiB), the most a recipe may have" in line


def test_reading_stops_at_the_limit(tmp_path):
    with pytest.raises(UserError, match="larger than"):
        load_recipe("/dev/zero")  # endless: only the first MiB is read


def billion_laughs(levels=10, width=10) -> str:
    lines = ['l0: &l0 ["lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_at_once(tmp_path, monkeypatch, capsys):
    line = cli_line(monkeypatch, capsys, tmp_path, recipe_text(tmp_path) + billion_laughs())  # 10**10 values
    assert "recipe.yaml: line " in line and "more than 100000 values with every alias written out" in line


def test_a_recursive_alias_is_one_line(tmp_path, monkeypatch, capsys):
    line = cli_line(monkeypatch, capsys, tmp_path, recipe_text(tmp_path, extra="sweep: &s {threshold: [*s]}"))
    assert "a recipe cannot be recursive" in line


def test_deep_nesting_is_one_line(tmp_path, monkeypatch, capsys):
    deep = "[" * 100_000 + "]" * 100_000
    line = cli_line(monkeypatch, capsys, tmp_path, recipe_text(tmp_path, extra=f"sweep: {{threshold: {deep}}}"))
    assert f"nested deeper than {MAX_YAML_DEPTH} mappings and lists" in line


def test_a_number_python_cannot_read_is_one_line(tmp_path, monkeypatch, capsys):
    line = cli_line(monkeypatch, capsys, tmp_path, recipe_text(tmp_path, extra="seed: " + "9" * 5000))
    assert "recipe.yaml: not valid YAML: Exceeds the limit" in line


def test_ordinary_anchors_and_merge_keys_still_work(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text(recipe_text(tmp_path, tasks="[{name: piqa, limit: &few 5}, {name: nq, limit: *few}]")
                    .replace("  - {model: smollm2-135m, name: a}", "  - &small {model: smollm2-135m, name: a, "
                             "dtype: bfloat16}")
                    .replace("  - {model: qwen2.5-0.5b, name: b}", "  - {<<: *small, model: qwen2.5-0.5b, name: b}"))
    recipe = load_recipe(path)
    assert [t.limit for t in recipe.tasks] == [5, 5]
    assert [(m.model, m.name, m.dtype) for m in recipe.members] == [
        ("smollm2-135m", "a", "bfloat16"), ("qwen2.5-0.5b", "b", "bfloat16")]


@pytest.mark.parametrize("method", WEIGHTED)
@pytest.mark.parametrize("weights", ["[1.0e-320, 1.0e-320]", "[1.0e-39, 1.0e-39]", "[0, 5.0e-39]"])
def test_weights_too_small_for_float32_are_refused_by_the_dry_run(tmp_path, monkeypatch, capsys, method, weights):
    """Issue 41: [1e-320, 1e-320] passed the dry run, then log(0) raised 'math domain error' in GaC after
    the member rows were computed; every weighted method refuses a weight float32 cannot hold."""
    line = refused(monkeypatch, capsys, tmp_path, method=f"{method}, weights: {weights}")
    assert "method.weights: " in line and "must be at least 1.18e-38" in line


def test_small_weights_with_a_normal_sum_and_zeros_still_pass():
    """A weight that underflows beside others is a zero weight (tests/cli/test_fuzz.py scores with [1e-300, 1])."""
    from ensemble_bench.decoding.method import weights_problem

    assert weights_problem([1.0e-30, 1.0e-30, 0.0]) is None
    assert weights_problem([1.0e-300, 1.0]) is None
    assert weights_problem([2.0e-38, 0.0]) is None


@pytest.mark.parametrize("method, value, says", [
    ("gac, speculative: 4, proposer: true", "True",
     "method.proposer: Input should be a valid integer or a valid string"),
    ("gac, weights: true", "True", "method.weights: Input should be 'score' or 'score_minus_ece' or a valid list"),
    ("deepen, weights: 3", "3", "method.weights: Input should be 'adapt' or a valid list"),
])
def test_a_value_no_branch_of_a_union_takes_is_one_line(tmp_path, monkeypatch, capsys, method, value, says):
    """Issue 41: `proposer: true` (int | str) gave a line per branch, 'method.proposer.int: ...' and
    'method.proposer.str: ...'; now one line names the field and every type it takes."""
    line = refused(monkeypatch, capsys, tmp_path, method=method)
    assert line.endswith(f"{says} (got {value})")
