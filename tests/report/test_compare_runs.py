"""`ensbench compare` across runs (issue 39, item 7): a one-row run says how to compare it with another
run, and several runs compare side by side (a label two runs share is named with its run)."""

import json

import pytest

from ensemble_bench.errors import UserError
from ensemble_bench.report.compare import build_report, render_markdown
from tests.fake_runs import fake_run
from tests.report.test_compare import ARC, NQ, RECIPE, arc_sample, cli_run, nq_sample, write_samples


def one_row_run(root, label: str, method: str = "unite"):
    """A finished run of one ensemble row whose answers are run A's gac row's."""
    recipe = {**RECIPE, "name": f"solo-{label}", "method": {"name": method, "label": label}, "singles": False}
    rows = {label: (method, {"arc_c": (sum(ARC["gac"]) / 10, 10), "nq": (0.5, 4)}, {})}
    run = fake_run(root / "results" / recipe["name"] / "20260102-000000-def", rows, recipe)
    arc = [arc_sample(k, right) for k, right in enumerate(ARC["gac"])]
    nq = [s for k, (answer, right) in enumerate(NQ["gac"]) for s in nq_sample(k, answer, right)]
    for task, samples in (("arc_challenge", arc), ("nq_open", nq)):
        (run / label / f"samples_{task}_2026-01-02T00-00-00.0.jsonl").write_text(
            "".join(json.dumps(sample) + "\n" for sample in samples))
    return run


@pytest.fixture()
def pair_run(tmp_path):
    rows = {label: ("single" if label != "gac" else "gac",
                    {"arc_c": (sum(ARC[label]) / 10, 10), "nq": (sum(r for _, r in NQ[label]) / 4, 4)}, {})
            for label in ARC}
    return write_samples(fake_run(tmp_path / "results" / "pair" / "20260101-000000-abc", rows, RECIPE))


def test_a_one_row_run_says_how_to_compare_across_runs(tmp_path, monkeypatch, capsys):
    solo = one_row_run(tmp_path, "unite")
    code, out = cli_run(monkeypatch, capsys, "compare", str(solo))
    assert code == 2
    [line] = out.err.strip().splitlines()
    assert "this run has one row (unite)" in line and "ensbench compare RUN OTHER_RUN" in line


def test_two_runs_compare_the_first_row_with_the_others(tmp_path, pair_run, monkeypatch, capsys):
    solo = one_row_run(tmp_path, "unite")
    report = build_report([solo, pair_run], benchmark="arc_c")
    assert report.rows == ["unite", "a", "b", "gac"]
    [comparison] = report.views[0].comparisons
    assert comparison.row == "unite" and [m.member for m in comparison.members] == ["a", "b", "gac"]
    assert comparison.against("gac").answers_differ == 0  # the same answers as run A's gac
    assert (comparison.against("a").paired.wins, comparison.against("a").paired.losses) == (3, 0)
    code, out = cli_run(monkeypatch, capsys, "compare", str(solo), str(pair_run), "--benchmark", "arc_c")
    assert code == 0 and f"# compare {solo}, {pair_run}" in out.out


def test_a_label_two_runs_share_is_named_with_its_run(tmp_path, pair_run):
    solo = one_row_run(tmp_path, "gac", method="gac")
    report = build_report([pair_run, solo], benchmark="nq")
    assert report.rows == ["a", "b", "pair/20260101-000000-abc/gac", "solo-gac/20260102-000000-def/gac"]
    text = render_markdown(report, show=1)
    assert "rows: a, b, pair/20260101-000000-abc/gac, solo-gac/20260102-000000-def/gac" in text
    with pytest.raises(UserError, match="unknown row 'gac' \\(rows of these runs: a, b, pair/"):
        build_report([pair_run, solo], rows=["gac", "a"])
