"""Sampled generation requests through the lm-eval adapter and lm-eval's own response cache (CachingLM):
lm-eval's ``repeats`` give different samples; batch 1, batch 8 and a run killed after its first chunk
and resumed give the same samples; a resumed run draws only the samples not cached, whether lm-eval
caches the request itself (no ``do_sample``) or not."""

from __future__ import annotations

import pytest
from lm_eval.api.instance import Instance
from lm_eval.api.model import CachingLM

from ensemble_bench.decoding.request_sampling import SamplingPolicy
from ensemble_bench.lm import EnsembleLM
from ensemble_bench.methods.gac import Gac, GacParams
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
