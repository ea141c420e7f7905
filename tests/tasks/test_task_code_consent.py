"""Task code by consent, whichever way it is reached (issue 47, item 2): a ``!function`` with an absolute
module path, a module beside the task YAML that is a link to a file elsewhere, and a module reached
through an ``include:`` chain (absolute or relative) all need ``allow_task_code: true``; the dry run
names the real file; ``ensbench-lm-eval --include_path`` (and a task YAML in ``--tasks``) needs
``--allow_task_code``. Each case refuses before any model loads and before the module runs."""

import json
import sys

import pytest

from ensemble_bench.tasks.task_code import task_code
from ensemble_bench.tasks.task_sources import MAX_INCLUDE_DEPTH
from tests.cli.test_lm_eval_route import lm_eval, members
from tests.cli_helpers import one_line, run_cli
from tests.tasks.test_any_task import QA, task_yaml


def evil_module(folder, mark):
    """``evil.py`` in ``folder``: importing it creates ``mark`` (so a test sees whether it ran)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "evil.py").write_text(f"open({str(mark)!r}, 'w').close()\n\ndef keep(docs):\n    return docs\n")
    return (folder / "evil.py").resolve()


def own_task(tmp_path, extra: str):
    """my_tasks/my_qa.yaml on local data, with ``extra`` appended."""
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in QA))
    folder = tmp_path / "my_tasks"
    folder.mkdir(exist_ok=True)
    (folder / "my_qa.yaml").write_text(task_yaml("my_qa", str(data), "qa") + extra)
    return folder


def reached(way, tmp_path, mark):
    """The task folder for one way of reaching ``elsewhere/evil.py``, and the YAML naming it."""
    elsewhere = tmp_path / "elsewhere"
    module = evil_module(elsewhere, mark)
    if way == "absolute":
        return own_task(tmp_path, f"process_docs: !function {elsewhere}/evil.keep\n"), module
    if way == "link":
        folder = own_task(tmp_path, "process_docs: !function evil.keep\n")
        (folder / "evil.py").symlink_to(module)  # resolved before the inside-the-folder test used to run
        return folder, module
    (elsewhere / "base.yml").write_text("process_docs: !function evil.keep\n")  # evil.py beside base.yml
    (elsewhere / "middle.yml").write_text("include: base.yml\n")  # a relative include, one step further
    target = {"include_absolute": elsewhere / "base.yml", "include_relative": "../elsewhere/base.yml",
              "include_chain": elsewhere / "middle.yml"}[way]
    return own_task(tmp_path, f"include: {target}\n"), module


def recipe(tiny_dirs, tmp_path, folder, extra=""):
    """The path of a one-row recipe running my_qa from ``folder`` (``extra`` appended)."""
    from tests.run.test_row_truth import recipe_text

    path = tmp_path / "coded.yaml"
    path.write_text(recipe_text(tiny_dirs, tmp_path, folder, "coded", extra))
    return str(path)


WAYS = ["absolute", "link", "include_absolute", "include_relative", "include_chain"]


@pytest.mark.parametrize("way", WAYS)
def test_task_code_outside_the_folder_is_named_and_refused(way, tiny_dirs, tmp_path, monkeypatch, capsys):
    """Each way, the dry run showed no note and the run imported and called the module (bb736f1)."""
    import ensemble_bench.run.build

    mark = tmp_path / "ran"
    folder, module = reached(way, tmp_path, mark)
    monkeypatch.setattr(ensemble_bench.run.build, "load_member", lambda **kwargs: pytest.fail("a member loaded"))
    code, out = run_cli(monkeypatch, capsys, "run", recipe(tiny_dirs, tmp_path, folder))
    assert code == 2 and "Traceback" not in out.err
    assert f"tasks[0].name: 'my_qa' imports and runs {module}" in out.err and "set allow_task_code: true" in out.err
    code, out = run_cli(monkeypatch, capsys, "run", recipe(tiny_dirs, tmp_path, folder, "allow_task_code: true\n"),
                        "--dry-run")
    note = next(line for line in out.out.split("note: ") if line.startswith("task code:"))
    assert code == 0 and note.startswith(f"task code: {module}") and "runs when the tasks load" in note, out.err
    assert not mark.exists()


@pytest.mark.parametrize("way", WAYS)
def test_the_module_found_is_the_one_lm_eval_imports(way, tmp_path):
    """lm-eval's own loader, run on the task YAML, imports exactly the file task_code names (and runs it)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    mark = tmp_path / "ran"
    folder, module = reached(way, tmp_path, mark)
    [found], problems = task_code([folder / "my_qa.yaml"])
    assert problems == [] and found.module == module
    before = set(sys.modules)
    load_yaml(folder / "my_qa.yaml", resolve_func=True)
    loaded = [getattr(sys.modules[name], "__file__", None) for name in set(sys.modules) - before]
    assert mark.exists() and str(module) in loaded


def test_a_link_is_named_with_its_target(tmp_path):
    folder, module = reached("link", tmp_path, tmp_path / "ran")
    [found], _ = task_code([folder / "my_qa.yaml"])
    assert found.shown() == f"{module} (through the link {folder / 'evil.py'})"


def test_installed_code_needs_no_consent(tmp_path):
    """lm-eval's own task YAML imports its utils.py (installed code), also when a task of one's own includes it."""
    import lm_eval

    stock = f"{lm_eval.__path__[0]}/tasks/hellaswag/hellaswag.yaml"
    folder = own_task(tmp_path, f"include: {stock}\nprocess_results: !function math.sqrt\n")
    assert task_code([folder / "my_qa.yaml"]) == ([], [])


def test_include_cycles_end_and_long_chains_are_refused(tmp_path):
    (tmp_path / "a.yml").write_text("include: b.yml\n")
    (tmp_path / "b.yml").write_text("include: a.yml\nprocess_docs: !function evil.keep\n")
    module = evil_module(tmp_path, tmp_path / "ran")
    [found], problems = task_code([tmp_path / "a.yml"])
    assert found.module == module and problems == []
    for k in range(MAX_INCLUDE_DEPTH + 2):
        (tmp_path / f"c{k}.yml").write_text(f"include: c{k + 1}.yml\n")
    code, [line] = task_code([tmp_path / "c0.yml"])
    assert code == [] and f"through more than {MAX_INCLUDE_DEPTH} include: steps" in line


def test_a_named_pipe_reached_by_an_include_is_refused_before_indexing(tiny_dirs, tmp_path, monkeypatch, capsys):
    """The index would open it and block for good."""
    import os

    os.mkfifo(tmp_path / "pipe.yml")
    folder = own_task(tmp_path, f"include: {tmp_path / 'pipe.yml'}\n")
    code, out = run_cli(monkeypatch, capsys, "run", recipe(tiny_dirs, tmp_path, folder), "--dry-run")
    assert code == 2 and f"include_path: '{tmp_path / 'pipe.yml'}' (included by '{folder.resolve() / 'my_qa.yaml'}')" \
        f" is a named pipe" in one_line(out)


# --- ensbench-lm-eval -------------------------------------------------------------------------------------------
def stop_at_the_tasks(monkeypatch):
    """lm-eval's matching of --tasks (where a task YAML file's code is imported) raises a user error instead."""
    from lm_eval.config.evaluate_config import EvaluatorConfig

    from ensemble_bench.errors import UserError

    def stop(*_, **__):
        raise UserError("stopped at the tasks")

    monkeypatch.setattr(EvaluatorConfig, "process_tasks", stop)


@pytest.mark.parametrize("model", ["gac", "hf"])
@pytest.mark.parametrize("given", ["include_path", "task_file"])
def test_lm_eval_route_runs_task_code_only_with_allow_task_code(model, given, tiny_dirs, tmp_path, monkeypatch,
                                                                 capsys):
    """`ensbench-lm-eval --include_path DIR` ran a folder's !function code with no gate at all."""
    mark = tmp_path / "ran"
    folder = own_task(tmp_path, "process_docs: !function evil.keep\n")
    module = evil_module(folder, mark)
    args = json.dumps({"members": members(tiny_dirs)}) if model == "gac" else f"pretrained={tiny_dirs[0]}"
    tasks = ["--tasks", "my_qa", "--include_path", str(folder)] if given == "include_path" else \
        ["--tasks", str(folder / "my_qa.yaml")]
    shown = "my_qa" if given == "include_path" else folder / "my_qa.yaml"
    stop_at_the_tasks(monkeypatch)
    argv = ["run", "--model", model, "--model_args", args, *tasks]
    code, out = lm_eval(monkeypatch, capsys, *argv)
    assert code == 2 and one_line(out) == (f"error: --tasks: '{shown}' imports and runs {module} (!function "
                                           "evil.keep in my_qa.yaml), unsandboxed: add --allow_task_code to run it")
    assert not mark.exists()
    code, out = lm_eval(monkeypatch, capsys, *argv, "--allow_task_code")  # the gate lets it through to lm-eval
    assert code == 2 and one_line(out) == "error: stopped at the tasks"
