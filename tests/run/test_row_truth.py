"""A reused row must still be true (issue 41): a row is keyed by the bytes of the data its tasks read,
a stored row proves its scores from its samples before it is reused, the task code that ``!function``
imports from a task folder runs only with consent, and task folders that would hang or flood lm-eval's
task index are refused first (tiny models; own tasks on local JSON-lines files)."""

import json
import os
import re
import textwrap

import pytest

from ensemble_bench.errors import UserError, lines_of
from ensemble_bench.recipe import parse_recipe
from ensemble_bench.run.row_check import damage
from ensemble_bench.tasks import recipe_tasks, task_sources
from tests.cli_helpers import run_cli
from tests.tasks.test_any_task import QA, task_yaml


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture(params=["beside", "elsewhere"])
def qa_data(tmp_path, request):
    """qa.jsonl, kept beside its task YAML or in another folder (an absolute path, as
    docs/own_experiment.md shows)."""
    data = (tmp_path / "my_tasks" if request.param == "beside" else tmp_path) / "qa.jsonl"
    data.parent.mkdir(exist_ok=True)
    write_rows(data, QA)
    return data


@pytest.fixture
def qa_task(tmp_path, qa_data):
    """A folder with one task of one's own, my_qa, reading ``qa_data``."""
    folder = tmp_path / "my_tasks"
    folder.mkdir(exist_ok=True)
    (folder / "my_qa.yaml").write_text(task_yaml("my_qa", str(qa_data), "qa"))
    return folder


def recipe_text(dirs, tmp_path, tasks_folder, name, extra=""):
    return textwrap.dedent(f"""\
        name: {name}
        members:
          - {{model: {dirs[0]}, name: bpe}}
        method: single
        tasks: [{{name: my_qa, limit: 3, gen_kwargs: {{max_gen_toks: 3}}}}]
        include_path: {tasks_folder}
        data: offline
        output: {tmp_path / "results"}
        """) + extra


def run(monkeypatch, capsys, tmp_path, text, *flags):
    name = re.search(r"name: (\S+)", text).group(1)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    code, out = run_cli(monkeypatch, capsys, "run", str(path), *flags)
    return code, out


def row_dir(tmp_path, name):
    [run_dir] = (tmp_path / "results" / name).iterdir()
    return run_dir / "bpe"


def questions(folder):
    return [json.loads(line)["doc"]["question"] for p in folder.glob("samples_my_qa_*.jsonl")
            for line in p.read_text().splitlines()]


@pytest.mark.slow
def test_a_row_is_recomputed_when_its_task_data_changes(tiny_dirs, qa_task, qa_data, tmp_path, monkeypatch, capsys):
    code, out = run(monkeypatch, capsys, tmp_path, recipe_text(tiny_dirs, tmp_path, qa_task, "first"))
    assert code == 0, out.err
    code, out = run(monkeypatch, capsys, tmp_path, recipe_text(tiny_dirs, tmp_path, qa_task, "same-data"))
    assert code == 0 and "bpe: reused from first/" in out.out  # unchanged data: the row is reused
    write_rows(qa_data, [{**row, "question": "Edited " + row["question"]} for row in QA])
    code, out = run(monkeypatch, capsys, tmp_path, recipe_text(tiny_dirs, tmp_path, qa_task, "new-data"))
    assert code == 0, out.err
    assert "reused from" not in out.out
    assert f"bpe: computed again: {qa_data.resolve()} has other bytes than when first/" in out.out
    assert all(q.startswith("Edited ") for q in questions(row_dir(tmp_path, "new-data")))
    assert not any(q.startswith("Edited ") for q in questions(row_dir(tmp_path, "first")))


@pytest.mark.slow
def test_a_resumed_run_sets_aside_a_row_whose_data_changed(tiny_dirs, qa_task, qa_data, tmp_path, monkeypatch, capsys):
    text = recipe_text(tiny_dirs, tmp_path, qa_task, "resumed")
    assert run(monkeypatch, capsys, tmp_path, text)[0] == 0
    [run_dir] = (tmp_path / "results" / "resumed").iterdir()
    (run_dir / "summary.md").unlink()  # as if interrupted after the row
    write_rows(qa_data, [{**row, "question": "Edited " + row["question"]} for row in QA])
    code, out = run(monkeypatch, capsys, tmp_path, text)
    assert code == 0, out.err
    assert "bpe: set aside (its task configs or the data its tasks read changed since it was computed)" in out.out
    assert all(q.startswith("Edited ") for q in questions(run_dir / "bpe"))


@pytest.mark.slow
def test_a_resumed_run_recomputes_a_row_whose_scores_were_edited(tiny_dirs, qa_task, tmp_path, monkeypatch, capsys):
    text = recipe_text(tiny_dirs, tmp_path, qa_task, "edited")
    assert run(monkeypatch, capsys, tmp_path, text)[0] == 0
    [run_dir] = (tmp_path / "results" / "edited").iterdir()
    [results] = (run_dir / "bpe").glob("results_*.json")
    stored = json.loads(results.read_text())
    honest = stored["results"]["my_qa"]["exact_match,none"]
    stored["results"]["my_qa"]["exact_match,none"] = 0.987
    results.write_text(json.dumps(stored))
    (run_dir / "summary.md").unlink()  # as if interrupted after the row
    code, out = run(monkeypatch, capsys, tmp_path, text)
    assert code == 0, out.err
    assert re.search(rf"bpe: damaged \(samples_my_qa_\S+\.jsonl does not give {re.escape(results.name)}: its "
                     r"exact_match,none of my_qa is 0\.987, but its samples give [^)]+\): recomputed from the response "
                     "cache", out.out), out.out
    [again] = (run_dir / "bpe").glob("results_*.json")
    assert json.loads(again.read_text())["results"]["my_qa"]["exact_match,none"] == honest
    assert json.loads((run_dir / "bpe" / "timing.json").read_text())["requests_computed"] == 0


@pytest.mark.slow
def test_a_tampered_stored_row_is_not_reused(tiny_dirs, qa_task, tmp_path, monkeypatch, capsys):
    assert run(monkeypatch, capsys, tmp_path, recipe_text(tiny_dirs, tmp_path, qa_task, "first"))[0] == 0
    [results] = row_dir(tmp_path, "first").glob("results_*.json")
    stored = json.loads(results.read_text())
    honest = stored["results"]["my_qa"]["exact_match,none"]
    stored["results"]["my_qa"]["exact_match,none"] = 0.987
    results.write_text(json.dumps(stored))
    code, out = run(monkeypatch, capsys, tmp_path, recipe_text(tiny_dirs, tmp_path, qa_task, "second"))
    assert code == 0, out.err
    assert "reused from" not in out.out
    assert re.search(r"bpe: not reused: first/[^/]+/bpe fails its check \(samples_my_qa_\S+\.jsonl does not give "
                     rf"{re.escape(results.name)}: its exact_match,none of my_qa is 0\.987, but its samples give "
                     rf"{honest}\); computed again", out.out), out.out
    [again] = row_dir(tmp_path, "second").glob("results_*.json")
    assert json.loads(again.read_text())["results"]["my_qa"]["exact_match,none"] == honest


def rename_filters(results_path, stored):
    for samples in results_path.parent.glob("samples_my_qa_*.jsonl"):
        lines = [{**json.loads(line), "filter": "renamed"} for line in samples.read_text().splitlines()]
        samples.write_text("".join(json.dumps(line) + "\n" for line in lines))


def drop_task_hashes(results_path, stored):
    del stored["task_hashes"]


@pytest.mark.slow
@pytest.mark.parametrize("sidestep, found", [
    (rename_filters, r"samples_my_qa_\S+\.jsonl does not give results_\S+\.json: example \d+'s filter 'renamed' names "
                     r"no score of my_qa \(its scores have filters 'none'\)"),
    (drop_task_hashes, r"results_\S+\.json: it records no task_hashes \(the hash of each task's examples\)"),
])
def test_an_edited_score_cannot_sidestep_the_check(tiny_dirs, qa_task, tmp_path, monkeypatch, capsys, sidestep,
                                                   found):
    """Issue 47: a score edited to 0.987, then every sample's filter renamed (none names a results key) or
    the results file's task_hashes deleted; the row was reused. Now it is computed again."""
    assert run(monkeypatch, capsys, tmp_path, recipe_text(tiny_dirs, tmp_path, qa_task, "first"))[0] == 0
    [results] = row_dir(tmp_path, "first").glob("results_*.json")
    stored = json.loads(results.read_text())
    honest = stored["results"]["my_qa"]["exact_match,none"]
    stored["results"]["my_qa"]["exact_match,none"] = 0.987
    sidestep(results, stored)
    results.write_text(json.dumps(stored))
    code, out = run(monkeypatch, capsys, tmp_path, recipe_text(tiny_dirs, tmp_path, qa_task, "second"))
    assert code == 0, out.err
    assert re.search(rf"bpe: not reused: first/[^/]+/bpe fails its check \({found}\); computed again", out.out), out.out
    [again] = row_dir(tmp_path, "second").glob("results_*.json")
    assert json.loads(again.read_text())["results"]["my_qa"]["exact_match,none"] == honest


# --- a row's own proof, on its files (no model) ------------------------------------------------------
def fake_row(folder, values, score, doc_edit=None, group_score=None):
    """A row folder as lm-eval writes it: a task t of len(values) examples scored by mean, in group g."""
    import hashlib

    def sha(text):
        return hashlib.sha256(text.encode()).hexdigest()

    folder.mkdir()
    (folder / "timing.json").write_text("{}")
    samples = []
    for i, value in enumerate(values):
        doc = {"q": f"question {i}"}
        samples.append({"doc_id": i, "doc": {**doc, **(doc_edit or {})} if i == 0 else doc, "filter": "none",
                        "acc": value, "doc_hash": sha(json.dumps(doc, indent=2, ensure_ascii=False)),
                        "prompt_hash": sha(f"p{i}"), "target_hash": sha("t")})
    write_rows(folder / "samples_t_D.jsonl", samples)
    task_hash = sha("".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"] for s in samples))
    results = {"results": {"t": {"acc,none": score}, "g": {"acc,none": group_score if group_score is not None
                                                           else score}},
               "group_subtasks": {"g": ["t"]}, "configs": {"t": {"metric_list": [{"metric": "acc",
                                                                                 "aggregation": "mean"}]}},
               "n-samples": {"t": {"original": 9, "effective": len(values)}}, "task_hashes": {"t": task_hash}}
    (folder / "results_D.json").write_text(json.dumps(results))
    return folder


def test_a_row_proves_its_scores_from_its_samples(tmp_path):
    assert damage(fake_row(tmp_path / "honest", [1.0, 0.0, 1.0], 2 / 3), ["g"]) is None
    assert damage(fake_row(tmp_path / "edited", [1.0, 0.0, 1.0], 0.9), ["g"]) == (
        "samples_t_D.jsonl does not give results_D.json: its acc,none of t is 0.9, but its samples give "
        f"{2 / 3}")
    assert damage(fake_row(tmp_path / "doc", [1.0, 0.0], 0.5, doc_edit={"q": "other"}), ["g"]) == (
        "samples_t_D.jsonl does not give results_D.json: example 0's document is not the one its doc_hash records")
    assert damage(fake_row(tmp_path / "group", [1.0, 0.0], 0.5, group_score=0.75), ["g"]) == (
        "results_D.json: its acc,none of group g is 0.75, but its tasks give 0.5")


# --- task code --------------------------------------------------------------------------------------
@pytest.fixture
def coded_task(qa_task, tmp_path):
    """my_qa with ``process_docs: !function helpers.keep``; helpers.py leaves a mark when it is imported."""
    mark = tmp_path / "imported"
    (qa_task / "helpers.py").write_text(f"open({str(mark)!r}, 'w').close()\n\ndef keep(docs):\n    return docs\n")
    text = (qa_task / "my_qa.yaml").read_text() + "process_docs: !function helpers.keep\n"
    (qa_task / "my_qa.yaml").write_text(text)
    return qa_task, mark


def test_task_code_runs_only_with_consent(tiny_dirs, coded_task, tmp_path, monkeypatch, capsys):
    folder, mark = coded_task
    code, out = run(monkeypatch, capsys, tmp_path, recipe_text(tiny_dirs, tmp_path, folder, "coded"))
    assert code == 2 and "Traceback" not in out.err
    assert (f"tasks[0].name: 'my_qa' imports and runs {folder.resolve() / 'helpers.py'} (!function helpers.keep in "
            "my_qa.yaml), unsandboxed: set allow_task_code: true") in out.err
    assert not mark.exists()
    text = recipe_text(tiny_dirs, tmp_path, folder, "coded", "allow_task_code: true\n")
    code, out = run(monkeypatch, capsys, tmp_path, text, "--dry-run")
    assert code == 0, out.err
    assert f"task code: {folder.resolve() / 'helpers.py'} runs when the tasks load" in out.out.replace("\n", " ")
    assert not mark.exists()  # the dry run lists it and imports nothing
    code, out = run(monkeypatch, capsys, tmp_path, text)
    assert code == 0 and mark.exists(), out.err


def test_a_missing_task_module_is_one_dry_run_line(tiny_dirs, qa_task, tmp_path, monkeypatch, capsys):
    text = (qa_task / "my_qa.yaml").read_text() + "process_docs: !function no_such_module_here.keep\n"
    (qa_task / "my_qa.yaml").write_text(text)
    code, out = run(monkeypatch, capsys, tmp_path, recipe_text(tiny_dirs, tmp_path, qa_task, "missing"), "--dry-run")
    assert code == 2 and "Traceback" not in out.err
    assert (f"tasks[0].name: '{(qa_task / 'my_qa.yaml').resolve()}': !function no_such_module_here.keep: no module "
            "'no_such_module_here' beside it nor installed") in out.err


# --- task folders that would hang or flood the index -------------------------------------------------
def folder_lines(folder):
    recipe = parse_recipe({"name": "r", "members": [{"model": "smollm2-135m"}], "method": "single",
                           "tasks": ["piqa"], "include_path": str(folder)})
    with pytest.raises(UserError) as caught:
        recipe_tasks.include_folders(recipe)
    return lines_of(caught.value)


def test_a_named_pipe_in_a_task_folder_is_refused_before_indexing(qa_task):
    os.mkfifo(qa_task / "pipe.yaml")  # opening it would block lm-eval's index for good
    assert folder_lines(qa_task) == (f"include_path: '{qa_task / 'pipe.yaml'}' is a named pipe, not a YAML file: "
                                     "remove it or move it out of the folder",)


def test_an_alias_bomb_in_a_task_file_is_refused(qa_task):
    laughs = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    laughs += [f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 10)}]" for k in range(1, 9)]
    (qa_task / "bomb.yaml").write_text("task: bomb\n" + "\n".join(laughs) + "\n")
    [line] = folder_lines(qa_task)
    assert line.startswith(f"include_path: '{qa_task / 'bomb.yaml'}' line ") and "values with every alias" in line


# --- the key's view of data ----------------------------------------------------------------------------
def test_data_is_hashed_streaming_and_kept_by_stat(tmp_path, monkeypatch):
    data = tmp_path / "big.jsonl"
    data.write_bytes(b"x" * (3 << 20))
    config = {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}}}
    first = task_sources.data_fingerprint([config])
    assert list(first["files"]) == [str(data.resolve())]
    reads = []
    import ensemble_bench.cache as cache

    monkeypatch.setattr(cache, "file_sha256", lambda path: reads.append(path) or "rehashed")
    assert task_sources.data_fingerprint([config]) == first and reads == []  # stat unchanged: not read again
    data.write_bytes(b"y" * (3 << 20))
    assert task_sources.data_fingerprint([config])["files"][str(data.resolve())] == "rehashed"


def test_a_hub_dataset_is_keyed_by_its_revision(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    pinned = {"dataset_path": "org/set", "dataset_kwargs": {"revision": "abc"}}
    assert task_sources.data_fingerprint([pinned])["hub"] == [("org/set", "None", "abc")]
    refs = tmp_path / "datasets--org--set" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("c0ffee\n")
    assert task_sources.data_fingerprint([{"dataset_path": "org/set"}])["hub"] == [("org/set", "None", "c0ffee")]


def test_a_data_link_that_points_elsewhere_is_named_as_the_link(tmp_path):
    """It was "b.jsonl has other bytes" (issue 47): the file is the same, the link changed."""
    from ensemble_bench.run.row_store import RowKey, RowStore

    then, now = tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    then.write_text("{}\n")
    now.write_text('{"a": 1}\n')
    link = tmp_path / "a.jsonl"
    link.symlink_to(then)
    config = {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(link)}}}
    read = task_sources.data_fingerprint([config])
    assert read["links"] == {str(link): str(then)}
    store = RowStore(tmp_path / "out", lambda row_dir: None)
    row = tmp_path / "out" / "first" / "1" / "bpe"
    store.remember(RowKey("k1", "lineage", "apart", read["files"], read["links"]), row, row.parent / "cache.db")
    link.unlink()
    link.symlink_to(now)
    read = task_sources.data_fingerprint([config])
    assert store.data_changed(RowKey("k2", "lineage", "apart", read["files"], read["links"])) == (
        f"the link {link} points to {now}, not to {then} as when first/1/bpe was computed")


@pytest.mark.slow
def test_the_plan_marks_the_rows_a_run_would_reuse(tiny_dirs, qa_task, tmp_path, monkeypatch, capsys):
    code, out = run(monkeypatch, capsys, tmp_path, recipe_text(tiny_dirs, tmp_path, qa_task, "first"), "--dry-run")
    assert code == 0 and "not computed" not in out.out  # nothing finished yet
    assert run(monkeypatch, capsys, tmp_path, recipe_text(tiny_dirs, tmp_path, qa_task, "first"))[0] == 0
    code, out = run(monkeypatch, capsys, tmp_path, recipe_text(tiny_dirs, tmp_path, qa_task, "second"), "--dry-run")
    assert code == 0 and re.search(r"note: row bpe: reused from first/\S+/bpe \(not computed\)", out.out), out.out
    code, out = run(monkeypatch, capsys, tmp_path, recipe_text(tiny_dirs, tmp_path, qa_task, "second"), "--dry-run",
                    "--fresh")
    assert code == 0 and "not computed" not in out.out
