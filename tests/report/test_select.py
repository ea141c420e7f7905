"""`ensbench select`: UniTE's determine-then-ensemble rule on hand-written scores and on run folders."""

import json
import sys

import pytest
import yaml

from ensemble_bench.cli.main import main
from ensemble_bench.errors import UserError
from ensemble_bench.methods.unite_selection import Candidate, select_models
from ensemble_bench.recipe import parse_recipe
from ensemble_bench.report.select import load_candidates


def candidate(label, nq, arc, words):
    return Candidate(label, {"model": "smollm2-135m", "name": label}, {"nq": nq, "arc_c": arc}, words, "")


POOL = [candidate("a", 0.70, 0.70, 50), candidate("b", 0.65, 0.65, 60), candidate("c", 0.58, 0.58, 55),
        candidate("d", 0.66, 0.66, 150), candidate("e", 0.64, 0.64, 40)]


def test_determine_then_ensemble_hand_checked():
    decisions = select_models(POOL, max_models=3)
    assert [(d.candidate.label, d.verdict) for d in decisions] == [
        ("a", "chosen (best)"), ("d", "rejected: length ratio > 2"), ("b", "chosen"), ("e", "chosen"),
        ("c", "rejected: gap > 0.10")]
    assert decisions[1].length_ratio == pytest.approx(3.0) and decisions[4].gap == pytest.approx(0.12)
    capped = select_models(POOL, max_models=2)
    assert [d.verdict for d in capped][3] == "not needed (2 chosen)"
    judged_on_one_task = select_models([candidate("a", 0.9, 0.1, 10), candidate("b", 0.2, 0.5, 10)], tasks=["arc_c"])
    assert judged_on_one_task[0].candidate.label == "b"


def test_unknown_task_is_a_user_error():
    with pytest.raises(UserError, match="not scored for every candidate"):
        select_models(POOL, tasks=["gsm8k"])


def fake_run(tmp_path, name, rows):
    """A finished run folder: recipe.yaml, summary.md and lm-eval result/sample files per row."""
    run = tmp_path / name
    members = [{"model": "smollm2-135m", "name": label} for label in rows]
    recipe = {"name": name, "members": members, "method": "single", "data": "offline",
              "tasks": [{"name": "nq", "limit": 4}, {"name": "arc_c", "limit": 4}]}
    run.mkdir()
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (run / "summary.md").write_text("done\n")
    for label, (nq, arc, answers) in rows.items():
        row = run / label
        row.mkdir()
        (row / "timing.json").write_text("{}")
        results = {"results": {"nq_open": {"exact_match,remove_whitespace": nq},
                               "arc_challenge": {"acc,none": arc}},
                   "n-samples": {"nq_open": {"effective": 4}, "arc_challenge": {"effective": 4}}}
        (row / "results_1.json").write_text(json.dumps(results))
        (row / "samples_nq_open_1.jsonl").write_text(
            "".join(json.dumps({"doc_id": i, "resps": [[text]]}) + "\n" for i, text in enumerate(answers)))
        (row / "samples_arc_challenge_1.jsonl").write_text(json.dumps({"doc_id": 0, "resps": [[[-1.0, True]]]}) + "\n")
    return run


def test_select_from_run_folders_writes_a_valid_recipe(tmp_path, monkeypatch, capsys):
    run = fake_run(tmp_path, "pool", {"small": (0.25, 0.50, ["Paris", "two words"]),
                                      "big": (0.30, 0.55, ["Paris is it", "one"]),
                                      "chatty": (0.30, 0.50, ["a very long answer with many many words in it"] * 2)})
    found = {c.label: c for c in load_candidates([run])}
    assert found["big"].scores == {"nq": 0.30, "arc_c": 0.55} and found["small"].mean_words == 1.5
    out = tmp_path / "chosen.yaml"
    monkeypatch.setattr(sys, "argv", ["ensbench", "select", str(run), "--out", str(out)])
    main()
    printed = capsys.readouterr().out
    assert "chatty" in printed and "rejected" in printed
    recipe = parse_recipe(yaml.safe_load(out.read_text()), str(out))
    assert [m.label for m in recipe.members] == ["big", "small"]
    assert recipe.method.name == "unite" and recipe.method.lead == "big"


def test_unfinished_run_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "half").mkdir()
    monkeypatch.setattr(sys, "argv", ["ensbench", "select", str(tmp_path / "half")])
    with pytest.raises(SystemExit) as stopped:
        main()
    assert stopped.value.code == 2
    assert "neither a finished ensbench run nor a folder holding one" in capsys.readouterr().err
