"""A task's local data is checked before any model loads (issue 47, item 5): a missing data file, a named
pipe as a data file and a local dataset folder holding a dataset script each reached a traceback (exit
70) after the models loaded, with a silent dry run, on bb736f1. Now each is one line, exit 2, from the
dry run on, in ``ensbench run`` and in ``ensbench-lm-eval``."""

import json
import os

import pytest

from ensemble_bench.tasks.task_sources import data_fingerprint, data_problems
from tests.cli.test_lm_eval_route import lm_eval, members
from tests.cli_helpers import one_line, run_cli
from tests.tasks.test_any_task import QA, task_yaml
from tests.tasks.test_task_code_consent import recipe


def task_reading(tmp_path, data: str, dataset_path: str = "json"):
    """my_tasks/my_qa.yaml reading ``data`` (its data_files) from ``dataset_path``."""
    folder = tmp_path / "my_tasks"
    folder.mkdir(exist_ok=True)
    text = task_yaml("my_qa", data, "qa").replace("dataset_path: json", f"dataset_path: {dataset_path}")
    (folder / "my_qa.yaml").write_text(text)
    return folder


def broken(kind, tmp_path):
    """(task folder, the line's words after ``reads ``) for one kind of unreadable data."""
    if kind in ("missing", "pattern"):
        named = tmp_path / ("gone.jsonl" if kind == "missing" else "q*.jsonl")
        what = "no such file" if kind == "missing" else "no file matches"
        return task_reading(tmp_path, str(named)), f"data file '{named}': {what}"
    if kind == "pipe":
        os.mkfifo(tmp_path / "qa.jsonl")  # datasets would block on it for good
        pipe = tmp_path / "qa.jsonl"
        return task_reading(tmp_path, str(pipe)), f"data file '{pipe}' is a named pipe"
    script = tmp_path / "mydata"
    script.mkdir()
    (script / "mydata.py").write_text("raise SystemExit('a dataset script ran')\n")
    (script / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in QA))
    return task_reading(tmp_path, "test.jsonl", str(script)), f"dataset_path '{script}' is a dataset script"


KINDS = ["missing", "pattern", "pipe", "script"]


@pytest.mark.parametrize("kind", KINDS)
def test_unreadable_data_is_one_line_before_any_model_loads(kind, tiny_dirs, tmp_path, monkeypatch, capsys):
    import ensemble_bench.run.build

    folder, words = broken(kind, tmp_path)
    monkeypatch.setattr(ensemble_bench.run.build, "load_member", lambda **kwargs: pytest.fail("a member loaded"))
    for flags in (["--dry-run"], []):
        code, out = run_cli(monkeypatch, capsys, "run", recipe(tiny_dirs, tmp_path, folder), *flags)
        line = one_line(out)
        assert code == 2 and f"tasks[0].name: 'my_qa' reads {words}" in line, line


@pytest.mark.parametrize("kind", KINDS)
def test_unreadable_data_is_one_line_in_the_lm_eval_route(kind, tiny_dirs, tmp_path, monkeypatch, capsys):
    from lm_eval.config.evaluate_config import EvaluatorConfig

    folder, words = broken(kind, tmp_path)
    monkeypatch.setattr(EvaluatorConfig, "process_tasks", lambda *_, **__: pytest.fail("the tasks loaded"))
    code, out = lm_eval(monkeypatch, capsys, "run", "--model", "gac", "--model_args",
                        json.dumps({"members": members(tiny_dirs)}), "--tasks", "my_qa", "--include_path", str(folder))
    assert code == 2 and one_line(out).startswith(f"error: --tasks: 'my_qa' reads {words}")


def test_data_files_are_read_from_data_dir_and_urls_are_not_local(tmp_path):
    """datasets reads relative data_files from data_dir when one is given; a URL is no local file."""
    (tmp_path / "qa.jsonl").write_text("{}\n")
    cfg = {"dataset_path": "json", "dataset_kwargs": {"data_dir": str(tmp_path), "data_files": {
        "test": "qa.jsonl", "train": "https://example.org/train.jsonl"}}}
    assert data_problems(cfg) == []
    assert list(data_fingerprint([cfg])["files"]) == [str(tmp_path / "qa.jsonl")]
