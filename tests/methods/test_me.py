"""ME (methods/me.py, arXiv 2605.00419): a step's draw is the mixture sum_i lambda_i shape(M_i) over the
union (Sec. 2.2); samples do not depend on the batch; at batch 1 a sampled step runs fewer members
than the conventional ensemble. Identity and batch 1 vs 3 greedy: tests/methods/test_method_contract.py."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch

from ensemble_bench.decoding.sampling import RequestSampling, SamplingParams, request_key, shape
from ensemble_bench.members import Prompt
from ensemble_bench.methods import GenerationRequest, get_method
from tests.chi_square import fits
from tests.tiny import REQUESTS, outputs, sampled

PROMPT = Prompt(text="Question: What is 12 plus 30? Answer:")
DRAWS = 3000
STOPPED = "stop"


def make(members, batch_size: int = 1, **params):
    return get_method("me")(members, get_method("me").Params.model_validate(params), batch_size=batch_size)


def first_draws(method, params: SamplingParams, seed: int = 7) -> Counter:
    """What the first step draws for DRAWS repeats of one request (each its own generator): union entries."""
    key = request_key(PROMPT.text, {})
    states = [method.start(GenerationRequest(PROMPT, (), 1, RequestSampling(params, seed, key, k)))
              for k in range(DRAWS)]
    dists = [m.prefill([m.render(PROMPT)]).expand(DRAWS, -1) for m in method.members]
    entries = {entry: index for index, entry in enumerate(method.union.entries)}
    return Counter(STOPPED if a.finish else entries[a.data] for a in method.choose(dists, states).advances)


def expected_mixture(method, params: SamplingParams, mix_after_shaping: bool = True) -> dict:
    """sum_i lambda_i shape(P_i) over the union (ME), or with ``mix_after_shaping`` false shape(sum_i
    lambda_i P_i) (the conventional ensemble's shaped distribution: ME's only at temperature 1)."""
    union = method.union
    if mix_after_shaping:
        projected = [union.maps[i].project(torch.softmax(shape(params, in_union(union.maps[i], m)), -1), union.size)
                     for i, m in enumerate(method.members)]
        mixed = sum(w * p for w, p in zip(method.weights, projected))[0]
    else:
        projected = [union.maps[i].project(m.prefill([m.render(PROMPT)]).exp(), union.size)
                     for i, m in enumerate(method.members)]
        mixed = torch.softmax(shape(params, sum(w * p for w, p in zip(method.weights, projected)).log()), -1)[0]
    probabilities: dict = {STOPPED: float(mixed[union.stop_mask].sum())}
    for index in (mixed > 0).nonzero().flatten().tolist():
        if not union.is_stop(index):
            probabilities[index] = float(mixed[index])
    return probabilities


def in_union(mapping, member) -> torch.Tensor:
    """The member's first log-probs [1, V] with the ids that map to no union entry (specials) at -inf."""
    logprobs = member.prefill([member.render(PROMPT)])
    mapped = torch.zeros(logprobs.shape[-1], dtype=torch.bool)
    mapped[mapping.src_ids] = True
    return logprobs.masked_fill(~mapped, float("-inf"))


@pytest.mark.parametrize("settings", [{"temperature": 1.0}, {"temperature": 0.6, "top_k": 12}])
@pytest.mark.parametrize("weights", [None, [1.0, 3.0]])
def test_a_step_draws_from_the_weighted_mixture_of_the_shaped_members(pair, settings, weights):
    method = make(pair(), weights=weights)
    params = SamplingParams(do_sample=True, **settings)
    counts = first_draws(method, params)
    assert fits(counts, expected_mixture(method, params))
    assert sum(counts.values()) == DRAWS and len(counts) > 5
    assert sum(method.stats.steps_per_member) == DRAWS
    share = method.stats.steps_per_member[1] / DRAWS  # the member picks themselves follow lambda
    assert abs(share - method.weights[1]) < 4 * (method.weights[1] * method.weights[0] / DRAWS) ** 0.5


def test_the_bound_rejects_the_wrong_distribution(pair):
    """The check has power: at temperature 0.6 the draws do not fit the conventional ensemble's shaped q."""
    method = make(pair())
    params = SamplingParams(do_sample=True, temperature=0.6)
    assert not fits(first_draws(method, params), expected_mixture(method, params, mix_after_shaping=False))


def test_a_member_with_itself_draws_from_the_member(same_model):
    """Two copies of one member: the mixture is the member's own shaped distribution."""
    method = make([same_model("a"), same_model("b")])
    params = SamplingParams(do_sample=True, temperature=0.8)
    own = torch.softmax(shape(params, in_union(method.union.maps[0], method.members[0])), -1)
    union = method.union.maps[0].project(own, method.union.size)[0]
    expected = {STOPPED: float(union[method.union.stop_mask].sum())}
    expected |= {i: float(union[i]) for i in (union > 0).nonzero().flatten().tolist() if not method.union.is_stop(i)}
    assert fits(first_draws(make([same_model("a"), same_model("b")]), params), expected)


def test_samples_are_the_same_at_batch_1_and_4(pair):
    requests = [*sampled(temperature=1.2), *sampled(repeat=1, temperature=0.9, top_p=0.9)]
    one = outputs(make(pair(), batch_size=1), requests)
    assert one == outputs(make(pair(), batch_size=4), requests)
    assert one[:5] != one[5:]


def test_a_sampled_step_runs_only_the_picked_member_at_batch_1(pair):
    """The lazy synchronisation: fewer member calls per step than the two of the conventional ensemble
    (greedy requests run both every step)."""
    sampling = make(pair(), batch_size=1)
    sampling.generate(sampled(REQUESTS[:3], temperature=1.0))
    greedy = make(pair(), batch_size=1)
    greedy.generate(REQUESTS[:3])
    assert sampling.statistics().member_calls_per_step < 1.6
    assert greedy.statistics().member_calls_per_step == pytest.approx(2.0, abs=0.2)
    assert greedy.statistics().greedy_steps > 0 and sum(greedy.statistics().steps_per_member) == 0


def test_greedy_settings_decode_as_the_conventional_ensemble(pair):
    """do_sample with temperature 0 is greedy: CE's argmax over the union, as GaC's (equal weights)."""
    greedy = SamplingParams(do_sample=True, temperature=0.0)
    requests = [replace(r, sampling=RequestSampling(greedy, 1, "k")) for r in REQUESTS]
    gac = get_method("gac")(pair(), get_method("gac").Params(), batch_size=2)
    assert outputs(make(pair(), batch_size=2), requests) == outputs(gac)
