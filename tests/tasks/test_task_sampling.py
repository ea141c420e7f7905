"""The plan's sampling lines (tasks/task_sampling.py): which tasks sample and how, and the one-line refusal
of a row whose method cannot sample (or decodes speculatively) while a task asks it to."""

from __future__ import annotations

import textwrap

import pytest

from ensemble_bench.decoding.sampling import SamplingParams
from ensemble_bench.errors import UserError
from ensemble_bench.recipe import parse_recipe
from ensemble_bench.tasks import REGISTRY
from ensemble_bench.tasks.recipe_tasks import include_folders, task_index_of
from ensemble_bench.tasks.task_sampling import sampling_notes, sampling_problems, task_settings
from tests.cli_helpers import run_cli

SAMPLING = {"do_sample": True, "temperature": 0.7, "top_p": 0.9}


def indexed(parsed):
    """The recipe and its lm-eval task index, as run/setup.py reads them once."""
    return parsed, task_index_of(parsed, include_folders(parsed))


def recipe(method, tasks=None, **extra):
    return parse_recipe({"name": "x", "members": [{"model": "m", "name": "a"}, {"model": "n", "name": "b"}],
                         "method": method, "tasks": tasks or [{"name": "gsm8k", "gen_kwargs": SAMPLING}], **extra})


def test_the_plan_reads_each_built_in_benchmark_s_settings_as_the_run_writes_them(tmp_path):
    """task_settings reads a built-in benchmark from the recipe and its template, without lm-eval's index: the
    generation settings and repeats of the configs the run writes, for every generating built-in benchmark."""
    from ensemble_bench.tasks import get_benchmark
    from ensemble_bench.tasks.lm_eval_tasks import leaf_configs, task_index
    from ensemble_bench.tasks.task_configs import write_task_configs

    generating = [get_benchmark(name, variant) for name, variants in REGISTRY.items() for variant in variants
                  if not get_benchmark(name, variant).primary_metric.startswith("acc,")]
    sampled = set()
    for k, bench in enumerate(generating):
        group = write_task_configs([(bench, None)], tmp_path, "hub", f"_{k}")
        index = task_index([tmp_path])
        written = [(cfg.get("generation_kwargs") or {}, cfg.get("repeats") or 1)
                   for cfg in leaf_configs(index[group], index) if cfg.get("output_type") == "generate_until"]
        settings = task_settings(*indexed(recipe({"name": "gac"}, [{"name": bench.name, "variant": bench.variant}],
                                        allow_code_execution=True)))
        read = {(SamplingParams.from_gen_kwargs(s.gen_kwargs), s.repeats) for s in settings}
        assert read == {(SamplingParams.from_gen_kwargs(g), r) for g, r in written}, bench
        sampled |= {bench.task for params, _ in read if not params.greedy}
    assert sampled == {"mbpp_pass_at_k"}


def test_a_method_that_cannot_sample_is_refused_in_one_line_per_row():
    lines = sampling_problems(*indexed(recipe({"name": "safe"})))
    assert lines == ["row safe: method 'safe' decodes greedily only, but tasks[0] 'gsm8k' samples (temperature 0.7, "
                     "top_p 0.9, seed 1234): use a method that samples (docs/sampling.md), or give the entry "
                     "sampling: {do_sample: false}"]
    assert sampling_problems(*indexed(recipe({"name": "safe", "sampling": {"do_sample": False}}))) == []
    assert sampling_problems(*indexed(recipe({"name": "gac"}))) == []
    assert sampling_problems(*indexed(recipe({"name": "safe"}, [{"name": "gsm8k"}]))) == []  # greedy task


def test_speculative_with_sampling_is_refused_and_an_override_can_ask_for_sampling():
    [line] = sampling_problems(*indexed(recipe({"name": "gac", "speculative": 2, "threshold": 0.5})))
    assert line.startswith("row gac: method 'gac' with speculative and a threshold or CoRE decodes greedily only")
    assert "speculative: 0" in line
    assert sampling_problems(*indexed(recipe({"name": "gac", "speculative": 2}))) == []  # speculative sampling
    [line] = sampling_problems(*indexed(recipe({"name": "unite", "speculative": 2}, [{"name": "nq"}],
                                               sampling={"temperature": 0.5})))
    assert "tasks[0] 'nq' samples (temperature 0.5, seed 1234)" in line


def test_notes_say_how_each_task_samples():
    parsed = recipe({"name": "gac", "sampling": {"top_k": 5}}, [{"name": "gsm8k", "gen_kwargs": SAMPLING},
                                                                 {"name": "nq"}], seed=7)
    assert sampling_notes(*indexed(parsed)) == ["tasks[0] 'gsm8k' samples: temperature 0.7, top_p 0.9, seed 7",
                                      "method gac: sampling: {'top_k': 5} over the tasks' settings"]


@pytest.mark.slow
def test_an_lm_eval_task_with_repeats_is_read_from_its_yaml():
    """lm-eval's gsm8k_cot_self_consistency: do_sample, temperature 0.2, 64 repeats (and a vote), from its YAML."""
    parsed = recipe({"name": "safe"}, [{"name": "gsm8k_cot_self_consistency"}])
    [settings] = task_settings(*indexed(parsed))
    assert settings.repeats == 64 and SamplingParams.from_gen_kwargs(settings.gen_kwargs).temperature == 0.2
    assert sampling_notes(*indexed(parsed)) == [
        "tasks[0] 'gsm8k_cot_self_consistency' samples: temperature 0.2, 64 samples per request, seed 1234"]
    [line] = sampling_problems(*indexed(parsed))
    assert "but tasks[0] 'gsm8k_cot_self_consistency' samples (temperature 0.2, 64 samples per request" in line


def test_the_dry_run_refuses_a_greedy_only_method_on_a_sampled_task(tiny_dirs, tmp_path, monkeypatch, capsys):
    path = tmp_path / "safe.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: sampled
        members: [{{model: {tiny_dirs[0]}, name: bpe}}, {{model: {tiny_dirs[1]}, name: sp}}]
        method: safe
        tasks: [{{name: nq, gen_kwargs: {{do_sample: true, temperature: 0.8}}}}]
        data: offline
        output: {tmp_path / "results"}
        """))
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run")
    assert code != 0
    [line] = [text for text in out.err.splitlines() if "decodes greedily only" in text]
    assert "row safe: method 'safe' decodes greedily only, but tasks[0] 'nq' samples (temperature 0.8" in line


def test_a_task_s_repeats_are_the_recipe_s_and_a_pass_at_k_task_needs_k_of_them():
    assert sampling_notes(*indexed(recipe({"name": "gac"}, [{"name": "nq", "repeats": 3}]))) == [
        "tasks[0] 'nq' asks for 3 repeats but decodes greedily: they are all the same answer"]
    with pytest.raises(UserError, match=r"tasks\[0\].repeats: benchmark 'mbpp' \(pass_at_k\) reports pass@2 from its "
                                        "samples: give at least 2 repeats, got 1"):
        recipe({"name": "gac"}, [{"name": "mbpp", "variant": "pass_at_k", "repeats": 1}], allow_code_execution=True)
    sampled = recipe({"name": "gac"}, [{"name": "mbpp", "variant": "pass_at_k", "repeats": 3}],
                     allow_code_execution=True)
    assert sampling_notes(*indexed(sampled)) == [
        "tasks[0] 'mbpp' samples: temperature 0.8, top_p 0.95, 3 samples per request, seed 1234"]


def test_repeats_fewer_than_a_filter_reads_are_refused_before_any_sample():
    """gsm8k_cot_self_consistency's maj@8 takes the first 8 samples: lm-eval asserts at scoring, after
    every sample was drawn, when repeats are fewer. The plan refuses 4 and takes 8."""
    few = recipe({"name": "gac"}, [{"name": "gsm8k_cot_self_consistency", "repeats": 4}])
    assert sampling_problems(*indexed(few)) == [
        "tasks[0] 'gsm8k_cot_self_consistency': its filter 'maj@8' reads the first 8 samples of each request, but "
        "repeats is 4: set repeats to 8 or more"]
    assert sampling_problems(*indexed(recipe({"name": "gac"}, [{"name": "gsm8k_cot_self_consistency", "repeats": 8}]))) == []


def test_settings_out_of_range_in_a_task_s_own_yaml_are_one_line(tmp_path):
    (tmp_path / "hot.yaml").write_text(
        "task: hot\ndataset_path: json\ndataset_kwargs: {data_files: {test: x.jsonl}}\ntest_split: test\n"
        "output_type: generate_until\ndoc_to_text: '{{q}}'\ndoc_to_target: '{{a}}'\n"
        "generation_kwargs: {do_sample: true, temperature: -0.5}\nmetadata: {version: 1}\n")
    lines = sampling_problems(*indexed(recipe({"name": "gac"}, [{"name": "hot"}], include_path=str(tmp_path))))
    assert lines == ["tasks[0] 'hot': generation settings {'do_sample': True, 'temperature': -0.5}: temperature: "
                     "Input should be greater than or equal to 0"]
