"""Sampled generation requests through the lm-eval adapter and lm-eval's own response cache (CachingLM):
lm-eval's ``repeats`` give different samples; batch 1, batch 8 and a run killed after its first chunk
and resumed give the same samples; a resumed run draws only the samples not cached, whether lm-eval
caches the request itself (no ``do_sample``) or not."""

from __future__ import annotations

import pytest
from lm_eval.api.instance import Instance
from lm_eval.api.model import CachingLM

from ensemble_bench.decoding.request_sampling import SamplingPolicy
from ensemble_bench.methods.gac import Gac, GacParams
from ensemble_bench.run.lm import EnsembleLM
from tests.tiny import CORPUS

REPEATS = 3


def instances(gen_kwargs: dict) -> list[Instance]:
    """Four questions, each passed REPEATS times (the same object, as lm-eval's evaluator passes repeats)."""
    made = [Instance("generate_until", {}, (CORPUS[k][: 20 + 7 * k], {"until": ["\n\n"], "max_gen_toks": 8,
                                                                      **gen_kwargs}), k, ("t", k, REPEATS))
            for k in range(4)]
    return [request for request in made for _ in range(REPEATS)]


class Killed(Exception):
    pass


def answers(pair, db: str, requests: list[Instance], batch_size: int, seed: int = 5, chunks: int | None = None):
    """The texts a sitting gives (``chunks``: killed once that many chunks are cached) and what it computed."""
    lm = EnsembleLM(Gac(pair(), GacParams(), batch_size=batch_size), "gac", sampling=SamplingPolicy(seed))
    done = []
    if chunks is not None:
        def count() -> None:
            done.append(1)
            if len(done) == chunks:
                raise Killed
        lm.after_chunk = count
    cached = CachingLM(lm, db)
    return cached.generate_until(requests), lm.requests_computed


@pytest.mark.parametrize("gen_kwargs", [{"do_sample": True, "temperature": 1.5}, {"temperature": 1.5, "top_p": 0.9}],
                         ids=["do_sample", "temperature-only"])
def test_samples_equal_at_batch_1_and_8_and_after_a_kill(pair, tmp_path, gen_kwargs):
    requests = instances(gen_kwargs)
    whole, computed = answers(pair, str(tmp_path / "one.db"), requests, batch_size=1)
    assert computed == len(requests)
    assert any(len(set(whole[k:k + REPEATS])) > 1 for k in range(0, len(requests), REPEATS))  # repeats differ
    assert len({tuple(whole[k:k + REPEATS]) for k in range(0, len(requests), REPEATS)}) == 4
    assert answers(pair, str(tmp_path / "eight.db"), requests, batch_size=8)[0] == whole
    assert answers(pair, str(tmp_path / "seed.db"), requests, batch_size=8, seed=6)[0] != whole

    killed = str(tmp_path / "killed.db")
    with pytest.raises(Killed):
        answers(pair, killed, requests, batch_size=2, chunks=2)  # two chunks of two cached, then killed
    resumed, computed = answers(pair, killed, requests, batch_size=2)
    assert resumed == whole and computed == len(requests) - 4


def test_a_finished_pass_answers_every_repeat_again_from_its_own_samples(pair, tmp_path):
    """lm-eval caches a request without do_sample under its arguments, one answer for all its repeats:
    ensbench takes those entries out when every later pass starts, and answers each repeat from its own key
    (also after a killed and resumed pass, whose first sitting's samples are answered from the cache)."""
    requests = instances({"temperature": 1.5})
    db = str(tmp_path / "cache.db")
    with pytest.raises(Killed):
        answers(pair, db, requests, batch_size=4, chunks=1)
    first, computed = answers(pair, db, requests, batch_size=4)
    assert computed == len(requests) - 4
    for _ in range(2):
        again, computed = answers(pair, db, requests, batch_size=4)
        assert again == first and computed == 0
    assert any(len(set(first[k:k + REPEATS])) > 1 for k in range(0, len(requests), REPEATS))


def test_greedy_requests_keep_lm_eval_s_cache(pair, tmp_path):
    requests = instances({"do_sample": False})
    db = str(tmp_path / "cache.db")
    first, computed = answers(pair, db, requests, batch_size=4)
    assert computed == len(requests) and all(len(set(first[k:k + REPEATS])) == 1 for k in range(0, 12, REPEATS))
    assert answers(pair, db, requests, batch_size=4) == (first, 0)


# ------------------------------------------------------------------ end to end: ensbench run, an own task
VOTE_TASK = """\
task: my_vote
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}}}
test_split: test
output_type: generate_until
doc_to_text: "Q: {{{{question}}}}\\nA:"
doc_to_target: " {{{{answer}}}}"
generation_kwargs: {{until: ["\\n"], do_sample: true, temperature: 1.5, max_gen_toks: 6}}
repeats: 5
filter_list:
  - name: vote
    filter: [{{function: majority_vote}}, {{function: take_first}}]
metric_list: [{{metric: exact_match, aggregation: mean, higher_is_better: true}}]
metadata: {{version: 1}}
"""


def test_a_sampled_task_with_repeats_runs_votes_and_records_its_sampling(tiny_dirs, tmp_path, monkeypatch, capsys):
    import json
    import textwrap

    from tests.cli_helpers import run_cli

    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a} plus {a}?", "answer": str(2 * a)}) + "\n" for a in range(3)))
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "my_vote.yaml").write_text(VOTE_TASK.format(data=data))
    recipe = tmp_path / "vote.yaml"
    recipe.write_text(textwrap.dedent(f"""\
        name: vote
        members: [{{model: {tiny_dirs[0]}, name: bpe}}, {{model: {tiny_dirs[1]}, name: sp}}]
        methods: [gac, {{name: gac, label: gac-greedy, sampling: {{do_sample: false}}}}]
        tasks: [{{name: my_vote, repeats: 3}}]
        include_path: {folder}
        batch_size: 2
        data: offline
        output: {tmp_path / "results"}
        """))
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe))
    assert code == 0, out.err
    [run_dir] = (tmp_path / "results" / "vote").iterdir()
    responses = {}
    for row in ("gac", "gac-greedy"):
        [samples] = (run_dir / row).glob("samples_my_vote_*.jsonl")
        records = [json.loads(line) for line in samples.read_text().splitlines()]
        responses[row] = [record["resps"][0] for record in records]  # one request: its repeats' answers
        assert all(len(answers) == 3 for answers in responses[row])  # the recipe's repeats, not the task's 5
        [results] = (run_dir / row).glob("results_*.json")
        applied = json.loads(results.read_text())["config"]["sampling"]
        expected = ({"my_vote": {"do_sample": True, "temperature": 1.5, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                                 "seed": 1234, "repeats": 3}} if row == "gac" else {"my_vote": {"do_sample": False}})
        assert applied == expected
    assert any(len(set(answers)) > 1 for answers in responses["gac"])  # sampled: the repeats differ
    assert all(len(set(answers)) == 1 for answers in responses["gac-greedy"])  # greedy: all the same
    assert "note: tasks[0] 'my_vote' samples: temperature 1.5, 3 samples per request, seed 1234" in out.out
    assert "note: method gac-greedy: sampling: {'do_sample': False} over the tasks' settings" in out.out
