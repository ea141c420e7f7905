"""Speculative sampling across tokenizers (decoding/speculative_sampling.py) on GaC over the two tiny
members (byte-level BPE and SentencePiece): the texts drawn speculatively have the distribution of
every-token sampling (a two-sample chi-square at fixed seeds), which a wrong acceptance rule fails;
samples do not depend on the batch; greedy requests beside sampled ones keep their every-token texts."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from ensemble_bench.decoding.acceptance import SamplingAcceptance
from ensemble_bench.decoding.sampling import RequestSampling, SamplingParams, request_key
from ensemble_bench.methods import GenerationRequest
from ensemble_bench.methods.gac import Gac, GacParams
from tests.chi_square import same_distribution
from tests.tiny import REQUESTS, outputs, sampled

DRAWS = 1500
SETTINGS = SamplingParams(do_sample=True, temperature=1.0, top_k=3)


def draws(members, speculative: int, seed: int = 5, batch_size: int = 100) -> tuple[Counter, Gac]:
    """DRAWS repeats of one request, 4 new tokens each: the texts drawn and the method."""
    request = REQUESTS[1]
    key = request_key(request.prompt.text, {})
    requests = [GenerationRequest(request.prompt, (), 4, RequestSampling(SETTINGS, seed, key, k)) for k in range(DRAWS)]
    params = GacParams(speculative=speculative, proposer=1) if speculative else GacParams()
    method = Gac(members, params, batch_size=batch_size)
    return Counter(g.text for g in method.generate(requests)), method


@pytest.fixture(scope="module")
def every_token(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    from ensemble_bench.members import LocalMember

    return draws([LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(sp_model, sp_tokenizer, "b")], 0, seed=9)[0]


def test_speculative_draws_have_the_every_token_distribution(pair, every_token):
    counts, method = draws(pair(), speculative=3)
    assert same_distribution(counts, every_token)
    stats = method.speculation.stats
    assert 0 < stats.accepted < stats.drafted  # drafts accepted and rejected: both paths taken
    assert len(every_token) > 10


def test_a_wrong_acceptance_rule_fails_the_check(pair, every_token, monkeypatch):
    """Accepting every draft (the proposer's own distribution wherever it drafts) is caught."""
    rule = SamplingAcceptance.verify
    monkeypatch.setattr(SamplingAcceptance, "verify", staticmethod(
        lambda p, q, drafted, generator: drafted if drafted >= 0 else rule(p, q, drafted, generator)))
    counts, _ = draws(pair(), speculative=3)
    assert not same_distribution(counts, every_token)


def test_samples_do_not_depend_on_the_batch(pair):
    requests = [*sampled(temperature=1.2), *sampled(repeat=1, temperature=0.9, top_p=0.9)]
    params = GacParams(speculative=3, proposer=1)
    one = outputs(Gac(pair(), params, batch_size=1), requests)
    assert one == outputs(Gac(pair(), params, batch_size=4), requests)
    assert one[:5] != one[5:]


def test_greedy_requests_beside_sampled_ones_keep_their_every_token_texts(pair):
    params = GacParams(speculative=4, proposer=0)
    mixed = outputs(Gac(pair(), params, batch_size=4), [*REQUESTS, *sampled(temperature=1.0)])
    assert mixed[:5] == outputs(Gac(pair(), GacParams(), batch_size=4))
    greedy = SamplingParams(do_sample=True, temperature=0.0)  # greedy settings: the greedy path
    as_greedy = [replace(r, sampling=RequestSampling(greedy, 1, "k")) for r in REQUESTS]
    assert outputs(Gac(pair(), params, batch_size=4), as_greedy) == mixed[:5]
