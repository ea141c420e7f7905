"""A stored row's proof cannot be sidestepped (issue 47, ensemble_bench/run/row_check.py): every example
counts toward a score of its task, a results file records the hash of every task it scores, and
honest rows as lm-eval writes them (several filters, several metrics, groups, metrics some documents
lack) still pass. The rows are written here as lm-eval lays them out: one samples line per document
and filter, one ``metric,filter`` score per metric of each filter."""

import hashlib
import json

import pytest

from ensemble_bench.run.row_check import damage


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def task_files(folder, task, examples, metrics, filters=("none",), configs=None, values=None):
    """Task ``task`` of ``examples`` documents, each scored on ``metrics`` under each of ``filters``:
    its samples file, and its part of the results file (scores, config, count, hash).
    ``values(doc, metric, filter)`` gives a sample's value (default: 1.0 on even documents)."""
    values = values or (lambda doc, metric, flt: 1.0 if doc % 2 == 0 else 0.0)
    samples = []
    for flt in filters:
        for doc_id in range(examples):
            doc = {"q": f"{task} question {doc_id}"}
            line = {"doc_id": doc_id, "doc": doc, "filter": flt, "doc_hash": sha(json.dumps(doc, indent=2)),
                    "prompt_hash": sha(f"{task} prompt {doc_id}"), "target_hash": sha(f"{task} target {doc_id}")}
            for metric in metrics:
                value = values(doc_id, metric, flt)
                if value is not None:
                    line[metric] = value
            samples.append(line)
    (folder / f"samples_{task}_D.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    scores = {"alias": task, "sample_len": examples}
    for flt in filters:
        for metric in metrics:
            got = [s[metric] for s in samples if s["filter"] == flt and metric in s]
            scores[f"{metric},{flt}"] = sum(got) / len(got)
            scores[f"{metric}_stderr,{flt}"] = "N/A"
    config = configs if configs is not None else {"metric_list": [{"metric": m, "aggregation": "mean"}
                                                                   for m in metrics]}
    return {"scores": scores, "config": config, "count": {"original": 99, "effective": examples},
            "hash": sha("".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"] for s in samples))}


def lm_eval_row(folder, tasks, group="g", edit=None):
    """A row folder holding ``tasks`` (name -> task_files' arguments) under group ``group``, its
    results file passed through ``edit`` (the tampering) before it is written."""
    folder.mkdir()
    (folder / "timing.json").write_text("{}")
    parts = {name: task_files(folder, name, **spec) for name, spec in tasks.items()}
    results = {"results": {**{n: p["scores"] for n, p in parts.items()}, group: {"alias": group}},
               "group_subtasks": {group: list(tasks)},
               "configs": {n: p["config"] for n, p in parts.items()},
               "n-samples": {n: p["count"] for n, p in parts.items()},
               "task_hashes": {n: p["hash"] for n, p in parts.items()}}
    if edit:
        edit(results, folder)
    (folder / "results_D.json").write_text(json.dumps(results))
    return folder


GENERATION = {"examples": 4, "metrics": ["exact_match"], "filters": ["strict-match", "flexible-extract"]}
CHOICE = {"examples": 3, "metrics": ["acc", "acc_norm"]}


@pytest.mark.parametrize("tasks", [
    {"gen": GENERATION},
    {"mc": CHOICE},
    {"gen": GENERATION, "mc": CHOICE},
    {"mc": {**CHOICE, "configs": {}}},  # no metric_list: lm-eval's registered aggregations (mean for acc)
    {"bools": {"examples": 3, "metrics": ["hit"], "values": lambda doc, metric, flt: doc == 1}},
    {"partial": {"examples": 4, "metrics": ["acc", "extra"],  # a document without 'extra': averaged without it
                 "values": lambda doc, metric, flt: None if metric == "extra" and doc == 0 else 1.0}},
    {"bleu": {"examples": 2, "metrics": ["bleu"], "configs": {"metric_list": [{"metric": "bleu",
                                                                                 "aggregation": "bleu"}]}}},
])
def test_honest_rows_as_lm_eval_writes_them_pass(tmp_path, tasks):
    assert damage(lm_eval_row(tmp_path / "row", tasks), ["g"]) is None


def nest(results, folder):
    """Group g inside group outer, which aggregates acc over its tasks (g itself aggregates nothing)."""
    results["group_subtasks"]["outer"] = ["g"]
    results["results"]["outer"] = {"alias": "outer", "acc,none": results["results"]["mc"]["acc,none"]}


def test_an_honest_nested_group_passes(tmp_path):
    assert damage(lm_eval_row(tmp_path / "row", {"gen": GENERATION, "mc": CHOICE}, edit=nest), ["outer"]) is None


def edit_score(task, key, value=0.987):
    def edit(results, folder):
        results["results"][task][key] = value
    return edit


def edit_samples(task, change):
    """A tampering of the samples file of ``task``: ``change(lines)`` edits its lines in place."""
    def edit(results, folder):
        path = folder / f"samples_{task}_D.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        change(lines)
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return edit


def rename_filters(task, name):
    """The tampering of issue 47: every sample's filter renamed, so that none names a results key."""
    return edit_samples(task, lambda lines: [line.update(filter=name) for line in lines])


def set_field(task, index, field, value):
    return edit_samples(task, lambda lines: lines[index].update({field: value}))


def both(*edits):
    def edit(results, folder):
        for one in edits:
            one(results, folder)
    return edit


def drop(*path):
    def edit(results, folder):
        *parents, last = path
        holder = results
        for key in parents:
            holder = holder[key]
        del holder[last]
    return edit


@pytest.mark.parametrize("edit,problem", [
    (both(edit_score("mc", "acc,none"), rename_filters("mc", "renamed")),
     "samples_mc_D.jsonl does not give results_D.json: example 0's filter 'renamed' names no score of mc (its "
     "scores have filters 'none')"),
    (both(edit_score("mc", "acc,none"), drop("task_hashes")),
     "results_D.json: it records no task_hashes (the hash of each task's examples)"),
    (both(edit_score("mc", "acc,none"), drop("task_hashes", "mc")),
     "results_D.json: it records no task hash for task mc"),
    (both(edit_score("mc", "acc,none"), drop("task_hashes", "mc"), drop("configs", "mc"), drop("n-samples", "mc")),
     "results_D.json: it records no task hash for task mc"),
    (both(drop("results", "mc"), edit_score("g", "acc,none")),  # the task's scores gone, its group's edited
     "samples_mc_D.jsonl does not give results_D.json: example 0's filter 'none' names no score of mc"),
    (edit_score("mc", "acc,none", "0.987"),
     "samples_mc_D.jsonl does not give results_D.json: its acc,none of mc is '0.987', its samples' values are "
     "not all numbers"),
    (both(edit_score("mc", "acc_norm,none"), drop("configs", "mc", "metric_list")),  # lm-eval's own aggregation
     "samples_mc_D.jsonl does not give results_D.json: its acc_norm,none of mc is 0.987, but its samples give "
     f"{2 / 3}"),
    (set_field("gen", 0, "filter", "flexible-extract"),  # each filter holds one example of every document
     "samples_gen_D.jsonl does not give results_D.json: its filter 'flexible-extract' has 5 examples of 4 documents, "
     "not one each"),
    (set_field("mc", 1, "acc", "1"),
     f"samples_mc_D.jsonl does not give results_D.json: its acc,none of mc is {2 / 3}, its samples' values are not "
     "all numbers"),
    (both(*(drop(part, "mc") for part in ("results", "configs", "n-samples", "task_hashes")),
          edit_score("g", "acc,none")),  # the task gone from the results file, its group's score edited
     "results_D.json: its group g lists mc, which has no results"),
    (both(drop("results", "mc"), drop("task_hashes", "mc"), drop("configs", "mc"), drop("n-samples", "mc"),
          edit_score("g", "acc,none"), lambda results, folder: results["group_subtasks"]["g"].remove("mc")),
     "results_D.json: its acc,none of group g is 0.987, but none of its tasks has that score"),
    (both(edit_score("mc", "acc,none"), lambda results, folder: results["group_subtasks"].update(g=["g"])),
     "samples_mc_D.jsonl does not give results_D.json: its acc,none of mc is 0.987, but its samples give "
     f"{2 / 3}"),
], ids=["filters-renamed", "no-task-hashes", "one-hash-gone", "task-unlisted", "task-scores-gone", "score-a-string",
        "metric-list-gone", "sample-moved", "value-a-string", "task-gone-group-edited", "group-score-unbacked",
        "group-cycle"])
def test_a_tampered_row_cannot_sidestep_its_check(tmp_path, edit, problem):
    assert damage(lm_eval_row(tmp_path / "row", {"gen": GENERATION, "mc": CHOICE}, edit=edit), ["g"]) == problem


LISTED = {"group_subtasks": {"g": ["mc"]}}


@pytest.mark.parametrize("results", [[], {"results": [], **LISTED},
                                     {"results": {"mc": []}, "task_hashes": {}, **LISTED},
                                     {"configs": {"mc": []}, "task_hashes": [], **LISTED},
                                     {"results": {"g": {"acc,none": 1}}, "group_subtasks": {"g": 3},
                                      "n-samples": [], "task_hashes": {}},
                                     {"results": {"g": {"acc,none": 1}, "h": {}}, "group_subtasks": {"g": ["h"],
                                                                                                 "h": ["g"]},
                                      "task_hashes": {}}])
def test_a_damaged_results_file_is_judged_not_trusted(tmp_path, results):
    """Parts of the results file that are not JSON objects where lm-eval writes objects, or groups
    listed under each other: one problem, no crash."""
    row = lm_eval_row(tmp_path / "row", {"mc": CHOICE})
    (row / "results_D.json").write_text(json.dumps(results))
    assert isinstance(damage(row, ["g"]), str)
