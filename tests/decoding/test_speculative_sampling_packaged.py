"""Speculative sampling on the packaged pair (issue 51, test 2): GaC over SmolLM2-135M and Qwen2.5-0.5B,
2,000 draws of 3 new tokens after a short prompt with ``speculative: 2`` (SmolLM2 proposing) against
2,000 every-token draws: the first tokens and the 3-token continuations pass a two-sample chi-square at
level 0.001 (tests/chi_square.py), at fixed seeds. The exact check on tiny members is
tests/decoding/test_speculative_exact.py; this one shows the real vocabularies' union, their stop ids and
their proposer agree with it."""

from __future__ import annotations

from collections import Counter

import pytest

from ensemble_bench.decoding.sampling import RequestSampling, SamplingParams, request_key
from ensemble_bench.members import Prompt
from ensemble_bench.methods import GenerationRequest
from ensemble_bench.methods.gac import Gac, GacParams
from tests.chi_square import same_distribution, two_sample

DRAWS = 2000
PROMPT = "Question: What is the capital of France?\nAnswer:"
SETTINGS = SamplingParams(do_sample=True, temperature=1.0, top_k=8)


@pytest.fixture(scope="module")
def packaged_pair():
    from ensemble_bench.members import load_member

    return [load_member("smollm2-135m", dtype="float32", chat_template=False, name="smollm2"),
            load_member("qwen2.5-0.5b", dtype="float32", chat_template=False, name="qwen2.5")]


class FirstPicks(Gac):
    """GaC that keeps each request's first pick (the union entry's bytes; None: a stop), by repeat index."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.first: dict[int, bytes | None] = {}

    def _advance(self, state, gated, pick):
        if state.count == 0:
            state.first_pick = pick[1]
        return super()._advance(state, gated, pick)

    def result(self, state, request):
        self.first[request.sampling.repeat] = state.first_pick
        return super().result(state, request)


def draws(members, params: GacParams, seed: int) -> tuple[Counter, Counter]:
    """DRAWS repeats of the prompt, 3 new tokens each, every repeat its own generator: the first picks
    and the texts drawn, counted."""
    key = request_key(PROMPT, {})
    requests = [GenerationRequest(Prompt(text=PROMPT), (), 3, RequestSampling(SETTINGS, seed, key, repeat))
                for repeat in range(DRAWS)]
    method = FirstPicks(members, params, batch_size=200)
    texts = Counter(generation.text for generation in method.generate(requests))
    return Counter(method.first.values()), texts


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.long  # 5 min on 2 cores (one prefill, 4,000 rows of 3 tokens): make test-long
def test_speculative_draws_on_the_packaged_pair_have_the_every_token_distribution(packaged_pair):
    every_token = draws(packaged_pair, GacParams(), seed=11)
    speculative = draws(packaged_pair, GacParams(speculative=2, proposer=0), seed=12)
    assert len(every_token[1]) > 10  # the test has categories to compare
    for name, every, spec in zip(("first token", "3 tokens"), every_token, speculative):
        assert same_distribution(spec, every), f"{name}: chi-square {two_sample(spec, every)}"
