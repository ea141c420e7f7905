"""Multiple-choice questions decided by position (tasks/ties.py): counted from the row's samples into its
timing.json, and said in the summary, for any method."""

from __future__ import annotations

import json
import textwrap

from ensemble_bench.report.tie_notes import tie_warnings
from ensemble_bench.tasks.ties import position_ties, tied_at_the_top
from tests.cli_helpers import run_cli

# two questions whose choices are the same text (every method scores them alike), two ordinary ones
QUESTIONS = [{"question": "Pick one.", "choices": ["same", "same"], "label": 1},
             {"question": "Is 1 even?", "choices": ["yes", "no"], "label": 1},
             {"question": "Pick one again.", "choices": ["twice", "twice", "twice"], "label": 2},
             {"question": "Is 2 even?", "choices": ["yes", "no"], "label": 0}]


def choice_sample(scores, filter_name="none", metrics=("acc",)):
    return {"filtered_resps": [[score, "False"] for score in scores], "filter": filter_name, "metrics": list(metrics)}


def test_a_tie_is_a_shared_best_score_only():
    assert tied_at_the_top([-1.0, -1.0, -3.0])
    assert not tied_at_the_top([-1.0, -3.0, -3.0])  # tied below the best: the argmax is not by position
    assert tied_at_the_top([-1e30, -1e30])


def test_ties_are_counted_per_multiple_choice_task_from_saved_or_live_samples():
    samples = {
        "mc": [choice_sample(["-2.5", "-2.5"]), choice_sample([-1.0, -2.0]), choice_sample(["-2.5", "-2.5"], "other")],
        "mutual": [choice_sample([-1.0, -2.0, -5.0, -5.0], metrics=("acc", "acc_mutual_info"))],  # choices, then bare
        "qa": [{"filtered_resps": ["Paris"], "filter": "none"}],
        "lambada": [{"filtered_resps": [[-3.0, True]], "filter": "none"}],
    }
    assert position_ties(samples) == {"mc": {"questions": 2, "tied": 1}, "mutual": {"questions": 1, "tied": 0}}


def test_a_run_records_its_ties_and_the_summary_warns(tiny_dirs, tmp_path, monkeypatch, capsys):
    data = tmp_path / "mc.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "same_mc.yaml").write_text(textwrap.dedent(f"""\
        task: same_mc
        dataset_path: json
        dataset_kwargs: {{data_files: {{test: {data}}}}}
        test_split: test
        output_type: multiple_choice
        doc_to_text: "{{{{question}}}}"
        doc_to_choice: "{{{{choices}}}}"
        doc_to_target: "{{{{label}}}}"
        metric_list: [{{metric: acc, aggregation: mean, higher_is_better: true}}]
        metadata: {{version: 1}}
        """))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(f"""\
        name: ties
        members: [{{model: {tiny_dirs[0]}, name: bpe}}, {{model: {tiny_dirs[1]}, name: sp}}]
        method: gac
        singles: true
        tasks: [same_mc]
        include_path: {tasks}
        data: offline
        output: {tmp_path / "results"}
        """))
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe))
    assert code == 0, out.err
    [run_dir] = (tmp_path / "results" / "ties").iterdir()
    for label in ("gac", "bpe", "sp"):
        timing = json.loads((run_dir / label / "timing.json").read_text())
        assert timing["position_ties"] == {"same_mc": {"questions": 4, "tied": 2}}, label
    summary = (run_dir / "summary.md").read_text()
    assert "## Ties decided by position" in summary
    assert "- warning: gac, same_mc: 2 of 4 questions had two or more choices tied for the best score" in summary
    assert len(tie_warnings(run_dir, ["gac", "bpe", "sp"])) == 3
