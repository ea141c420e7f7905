"""Smaller report items of issue 39 (item 7): the response-cache line says how many requests the cache
answered (none: said so), speculative rows show acceptance and forwards per token in the summary, and
``speculative_agreement`` is given only for the members whose agreement was counted."""

import json

import pytest

from ensemble_bench.decoding.speculation_stats import RowRecord, SpeculationStats
from ensemble_bench.methods import RunStats
from ensemble_bench.report.summary import reuse_section, timing_cells


def write_row(row_dir, computed: int, docs: int, choices: int) -> None:
    row_dir.mkdir(parents=True)
    (row_dir / "timing.json").write_text(json.dumps({"requests_computed": computed}))
    samples = [{"doc_id": d, "filter": f, "arguments": {f"gen_args_{k}": {} for k in range(choices)}}
               for d in range(docs) for f in ("none", "strict")]  # two filters: each document counts once
    (row_dir / "samples_piqa_2026.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))


def test_the_cache_line_counts_the_requests_the_cache_answered(tmp_path):
    write_row(tmp_path / "x", computed=4, docs=5, choices=2)   # 10 asked, 4 computed: 6 from the cache
    write_row(tmp_path / "y", computed=10, docs=5, choices=2)  # all computed: the cache answered none
    (tmp_path / "reused.json").write_text(json.dumps({"x": {"cache_from": "a/cache/x.db"},
                                                      "y": {"cache_from": "a/cache/y.db"}}))
    lines = reuse_section(tmp_path).strip().splitlines()
    assert lines[-2] == "- x: answers already in `a/cache/x.db`'s response cache were reused (6 of 10 requests)"
    assert lines[-1] == "- y: `a/cache/y.db`'s response cache held none of its 10 requests (all computed)"


@pytest.mark.parametrize("stored", ["under the method's name", "flat (runs stored before)"])
def test_a_speculative_row_shows_its_acceptance_and_forwards_per_token(tmp_path, stored):
    own = {"speculative_acceptance_rate": 0.625, "speculative_forwards_per_token": {"a": 1.0, "b": 0.3125}}
    shared = {"method": "gac", "params": {}, "tokens_generated": 8}
    stats = RunStats.from_json({**shared, "gac": own} if stored.startswith("under") else {**shared, **own})
    assert stats.method_stats == own and stats.tokens_generated == 8
    cells = timing_cells(stats, tmp_path)
    assert cells["accepted %"] == 62.5 and cells["forwards/token"] == "a 1.00, b 0.31"
    assert "accepted %" not in timing_cells(RunStats.from_json({"method": "gac", "params": {}}), tmp_path)


def test_agreement_is_given_for_the_counted_members_only():
    stats = SpeculationStats(forwards=[0, 0], agreed=[3, 0], positions=4)
    stats.add([RowRecord(1, 4, 3, 4, [4, 1])])
    fixed = stats.summary(["a", "b"], proposer=0)["speculative_agreement"]
    assert fixed == {"a": 0.75, "b": None}  # b verified, its agreement was never counted (was 0.0)
    auto = SpeculationStats(agreed=[3, 2], positions=4).summary(["a", "b"], proposer=None)["speculative_agreement"]
    assert auto == {"a": 0.75, "b": 0.5}


def test_the_summary_says_which_rows_sampled(tmp_path):
    """The header said "greedy" whatever the run decoded: it names the rows whose results record
    sampled settings (``config.sampling``)."""
    from ensemble_bench.report.summary import decoding_words, run_rows
    from tests.fake_runs import ROWS, fake_run

    run = fake_run(tmp_path / "run", ROWS)
    assert decoding_words(run, run_rows(run)) == "greedy"
    results = run / "gac" / "results_1.json"
    sampled = {"config": {"sampling": {"nq_open": {"do_sample": True, "temperature": 0.7}}}}
    results.write_text(json.dumps({**json.loads(results.read_text()), **sampled}))
    greedy = {"config": {"sampling": {"nq_open": {"do_sample": False}}}}
    results = run / "a" / "results_1.json"
    results.write_text(json.dumps({**json.loads(results.read_text()), **greedy}))
    assert decoding_words(run, run_rows(run)).startswith("greedy except gac (sampled: ")
