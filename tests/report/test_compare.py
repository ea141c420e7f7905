"""Paired statistics from per-sample files: the run summary's section, `ensbench compare` (on a
fabricated run with lm-eval-shaped samples files and on the committed CI baseline), its one-line
errors, and the output that must read well anywhere (80 columns, plain logs, a closed pipe)."""

import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

from ensemble_bench.cli import main as cli
from ensemble_bench.cli.main import PlainProgress, main
from ensemble_bench.recipe import parse_recipe
from ensemble_bench.report.compare import build_report, render_csv
from ensemble_bench.report.summary import write_summary
from tests.fake_runs import fake_run
from tests.tolerances import FLOAT64_SUMS, assert_rounded

REPO = Path(__file__).resolve().parents[2]
RECIPE = {"name": "pair", "members": [{"model": "smollm2-135m", "name": "a"}, {"model": "qwen2.5-0.5b", "name": "b"}],
          "method": "gac", "singles": True, "data": "offline", "tasks": [{"name": "arc_c", "limit": 10},
                                                                         {"name": "nq", "limit": 4}]}
# arc_c, per document (right = 1): gac beats a on docs 3, 4, 5 and loses none (McNemar 3:0, p = 2/8);
# beats b on docs 0, 5 (2:0, p = 2/4); some member is right on docs 0-4 (oracle 5/10);
# a and b pick the same choice on docs 1, 2 (both right) and 5-9 (both wrong): agreement 7/10.
ARC = {"a": [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
       "b": [0, 1, 1, 1, 1, 0, 0, 0, 0, 0],
       "gac": [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]}
# nq: (answer, exact match); the ensemble answers like neither member on doc 2
NQ = {"a": [("Paris", 1), ("1990", 0), ("blue", 0), ("x", 0)],
      "b": [("Lyon", 0), ("1991", 1), ("red", 0), ("x", 0)],
      "gac": [("Paris", 1), ("1991", 1), ("green", 0), ("x", 0)]}


def arc_sample(doc_id: int, right: int) -> dict:
    target = doc_id % 2
    chosen = target if right else 1 - target
    logliks = [[str(-1.0 if k == chosen else -5.0), "False"] for k in range(2)]
    return {"doc_id": doc_id, "doc": {"question": f"question {doc_id}?"}, "target": target,
            "arguments": {f"gen_args_{k}": {"arg_0": f"Question: question {doc_id}?\nAnswer:", "arg_1": f" choice {k}"}
                          for k in range(2)},
            "resps": [[r] for r in logliks], "filtered_resps": logliks, "filter": "none",
            "metrics": ["acc", "acc_norm"], "doc_hash": f"h{doc_id}", "acc": float(right), "acc_norm": 0.0}


def nq_sample(doc_id: int, answer: str, right: int) -> list[dict]:
    base = {"doc_id": doc_id, "doc": {"question": f"who is {doc_id}", "answer": ["gold"]}, "target": "['gold']",
            "arguments": {"gen_args_0": {"arg_0": f"Q: who is {doc_id}?\nA:", "arg_1": {"until": ["\n"]}}},
            "resps": [[" " + answer]], "metrics": ["exact_match"], "doc_hash": f"n{doc_id}"}
    # two filters, as lm-eval writes them: only remove_whitespace (the primary metric's) may count
    return [{**base, "filtered_resps": [" " + answer], "filter": "none", "exact_match": 1.0 - right},
            {**base, "filtered_resps": [answer], "filter": "remove_whitespace", "exact_match": float(right)}]


def write_samples(run: Path) -> Path:
    for label in ARC:
        lines = [arc_sample(k, right) for k, right in enumerate(ARC[label])]
        lines += [s for k, (answer, right) in enumerate(NQ[label]) for s in nq_sample(k, answer, right)]
        arc = [json.dumps(s) for s in lines if "acc" in s]
        nq = [json.dumps(s) for s in lines if "exact_match" in s]
        (run / label / "samples_arc_challenge_2026-01-01T00-00-00.0.jsonl").write_text("\n".join(arc) + "\n")
        (run / label / "samples_nq_open_2026-01-01T00-00-00.0.jsonl").write_text("\n".join(nq) + "\n")
    return run


@pytest.fixture()
def run(tmp_path):
    rows = {label: ("single" if label != "gac" else "gac",
                    {"arc_c": (sum(ARC[label]) / 10, 10), "nq": (sum(r for _, r in NQ[label]) / 4, 4)}, {})
            for label in ARC}
    return write_samples(fake_run(tmp_path / "results" / "pair" / "20260101-000000-abc", rows, RECIPE))


def cli_run(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["ensbench", *args])
    try:
        main()
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    return code, capsys.readouterr()


def test_the_paired_statistics_by_hand(run):
    view = build_report(run, benchmark="arc_c").views[0]
    (comparison,) = view.comparisons
    a, b = comparison.against("a"), comparison.against("b")
    assert (a.paired.wins, a.paired.losses, a.paired.ties) == (3, 0, 7) and a.paired.p_value == pytest.approx(0.25)
    assert (b.paired.wins, b.paired.losses, b.paired.ties) == (2, 0, 8) and b.paired.p_value == pytest.approx(0.5)
    assert a.paired.test == "McNemar exact" and comparison.best_member == "b"
    assert comparison.oracle == pytest.approx(0.5) and comparison.agreement == pytest.approx(0.7)
    assert (a.answers_differ, b.answers_differ) == (3, 2)
    assert len(view.differing) == 4  # docs 0, 3, 4, 5: the rows' answers are not all the same
    score, interval = view.intervals["gac"]
    assert score == pytest.approx(0.6) and interval.how == "Wilson" and interval.low < 0.6 < interval.high


def test_only_the_primary_metrics_filter_counts(run):
    view = build_report(run, benchmark="nq").views[0]
    (comparison,) = view.comparisons
    assert view.intervals["gac"][0] == pytest.approx(0.5)  # remove_whitespace lines, not the "none" ones
    a = comparison.against("a")
    assert (a.paired.wins, a.paired.losses, a.answers_differ) == (1, 0, 2)
    assert comparison.oracle == pytest.approx(0.5)


def test_the_run_summary_shows_intervals_and_what_the_ensemble_changed(run):
    recipe = parse_recipe(RECIPE, "pair")
    frame = write_summary(run, recipe)
    gac = frame.set_index("model").loc["gac"]
    assert gac["arc_c (acc)"] == 60.0
    assert_rounded((31.3, 83.2), (gac["arc_c low"], gac["arc_c high"]), 1, FLOAT64_SUMS)  # Wilson, 6 of 10
    text = (run / "summary.md").read_text()
    assert "60.0 [31.3, 83.2]" in text and "What the ensemble changed" in text
    paired = pd.read_csv(run / "paired.csv")
    arc = paired[paired.benchmark == "arc_c"].set_index("vs")
    assert arc.loc["a", "wins"] == 3 and arc.loc["b (best)", "p"] == 0.5 and arc.loc["a", "oracle %"] == 50.0


def test_compare_command_prints_statistics_examples_and_writes_files(run, tmp_path, monkeypatch, capsys):
    code, out = cli_run(monkeypatch, capsys, "compare", str(run.parent), "--show", "1", "--out", str(tmp_path / "cmp"))
    assert code == 0
    assert "| a | 3 | 0 | 7 | 0.250 | McNemar exact | 3 of 10 |" in out.out
    assert "Rows answer differently on 4 of 10 examples; the first 1:" in out.out
    assert "oracle (some of them right) 50.0%, they answer alike on 70.0%" in out.out
    last = out.out.split("## In short")[1].strip().splitlines()  # the last lines: what changed
    assert last[0] == "arc_c: gac 60.0 [31.3, 83.2] on 10 examples"
    assert last[1].startswith("  vs a 30.0 [") and last[1].endswith("3 answers differ, 3 won / 0 lost, p=0.250")
    assert last[3] == "  oracle (some of them right) 50.0%, they answer alike on 70.0%"
    written = pd.read_csv(tmp_path / "cmp.csv")
    assert len(written) == 4 + 3 and list(written.columns[-2:]) == ["gac answer", "gac score"]
    assert (tmp_path / "cmp.md").read_text().startswith("# compare")


def test_two_chosen_rows(run, monkeypatch, capsys):
    code, out = cli_run(monkeypatch, capsys, "compare", str(run), "--row", "a", "--row", "b", "--benchmark", "arc_c")
    assert code == 0 and "| a vs |" in out.out
    assert "| b (best) | 1 | 2 | 7 | 1.000 | McNemar exact | 3 of 10 |" in out.out  # McNemar 1:2 = 2 x 4/8
    assert "oracle (some of them right) 50.0%, they answer alike on 70.0%" in out.out  # of the pair


@pytest.mark.parametrize("args,message", [
    (["--row", "gac", "--row", "nope"], "unknown row 'nope' (rows of this run: a, b, gac)"),
    (["--row", "gac"], "compare needs two rows or more"),
    (["--benchmark", "gsm8k"], "unknown benchmark 'gsm8k' for this run"),
])
def test_bad_compare_arguments_are_one_line(run, monkeypatch, capsys, args, message):
    code, out = cli_run(monkeypatch, capsys, "compare", str(run), *args)
    assert code == 2 and message in out.err and "Traceback" not in out.err and len(out.err.strip().splitlines()) == 1


def test_a_run_without_per_sample_files_is_one_line(run, monkeypatch, capsys):
    """A lost file of an earlier run is an environment fault, exit 1 (docs/reliability.md's table): it was 2."""
    for samples in run.glob("*/samples_*.jsonl"):
        samples.unlink()
    code, out = cli_run(monkeypatch, capsys, "compare", str(run))
    assert code == 1 and "no per-sample file for arc_c" in out.err and "Traceback" not in out.err


def test_compare_works_on_the_committed_baseline(monkeypatch, capsys):
    code, out = cli_run(monkeypatch, capsys, "compare", str(REPO / "results/baseline/ci_regress"),
                        "--benchmark", "piqa", "--show", "1")
    assert code == 0
    assert "| smollm2 | 5 | 3 | 92 | 0.727 | McNemar exact | 8 of 100 |" in out.out
    assert "(text not stored; doc hash" in out.out


def test_text_free_extracts_give_the_same_statistics(run, tmp_path):
    from ensemble_bench.report.samples import write_extracts

    stored = tmp_path / "stored"
    row_files = [f"{label}/{f.name}" for label in ARC for f in (run / label).glob("*.json")]
    for path in ["recipe.yaml", "summary.md", *row_files]:
        (stored / path).parent.mkdir(parents=True, exist_ok=True)
        (stored / path).write_text((run / path).read_text())
    for label in ARC:
        write_extracts(run / label, stored / label)
    assert "question" not in (stored / "a" / "scores_arc_challenge.jsonl").read_text()
    lines = render_csv(build_report(stored, benchmark="arc_c")).splitlines()
    assert len(lines) == 1 + 4
    original, copy = build_report(run).views, build_report(stored).views
    assert [c.against("a").paired for v in copy for c in v.comparisons] == \
        [c.against("a").paired for v in original for c in v.comparisons]


def test_plain_progress_writes_counts_and_rate():
    lines = []
    progress = PlainProgress(write=lambda text, flush=False: lines.append(text))
    progress.on_progress("gac", 8, None)
    progress.on_progress("gac", 8, 32)
    assert lines[0].startswith("gac: 8 examples done") and lines[1].startswith("gac: 16 of 32 examples done")
    assert "examples/s" in lines[1]


def test_list_reads_at_80_columns(monkeypatch, capsys):
    from ensemble_bench.tasks import Benchmark, list_benchmarks

    blocked = Benchmark("wmt_de-en", "default", "wmt16_de_en", 0, "bleu,none", offline=False,
                        needs="no offline source: " + "a long reason that would wrap word by word " * 3)
    from ensemble_bench.cli import listing  # `list` lives there (moved out of cli/main.py)

    monkeypatch.setattr(listing, "list_benchmarks", lambda: [*list_benchmarks(), blocked])
    monkeypatch.setattr(cli, "console", cli.PipeConsole(width=80))
    code, out = cli_run(monkeypatch, capsys, "list")
    lines = out.out.splitlines()
    assert code == 0 and max(map(len, lines)) <= 80
    rows = [line for line in lines if line.startswith("│ wmt_de-en")]
    assert len(rows) == 1  # one line; the reason in a note below the table, numbered after what else is missing here
    [note] = re.findall(r"needs \[(\d+)\]", rows[0])
    assert any(line.startswith(f"[{note}] wmt_de-en: no offline source: a long reason") for line in lines)


def test_a_closed_stdout_ends_quietly(monkeypatch, capsys):
    def closed(**_):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "app", closed)
    code, out = cli_run(monkeypatch, capsys, "table", "x", "--layout", "gac_table3")
    assert code == 0 and out.err == ""


def test_the_summary_has_latency_for_every_row_and_its_wall_time(tmp_path):
    """ms/token for generation, ms/request and ms/scored token for multiple choice, a row of one
    round its first round's ms/token, and every row's wall time (lm-eval's evaluation time)."""
    rows = {"a": ("single", {"arc_c": (0.3, 10)}, {"loglikelihood_ms_per_request": 12.34,
                                                   "loglikelihood_ms_per_token": 3.21}),
            "b": ("single", {"nq": (0.25, 4)}, {"decode_ms_per_token": 80.0}),
            "gac": ("gac", {"nq": (0.5, 4)}, {"decode_ms_per_token": None, "first_round_ms_per_token": 40.0})}
    run = fake_run(tmp_path / "run", rows, RECIPE, {"total_evaluation_time_seconds": "7.25"})
    frame = write_summary(run, parse_recipe(RECIPE))
    cells = frame.set_index("model")[["ms/token", "ms/request", "ms/scored token", "wall s"]]
    assert cells.loc["a"].tolist()[1:] == [12.3, 3.2, 7.2] and pd.isna(cells.loc["a", "ms/token"])
    assert cells.loc["b", "ms/token"] == 80.0 and cells.loc["gac", "ms/token"] == 40.0
    summary = (run / "summary.md").read_text()
    assert re.search(r"\|\s+wall s\s+\|", summary) and "wall s = the row's evaluation time" in summary
