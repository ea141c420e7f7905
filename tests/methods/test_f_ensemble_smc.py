"""f_ensemble's sequential Monte Carlo (methods/f_ensemble_smc.py, arXiv 2603.05432 Sec. 4): after two
bytes, the particles' weighted distribution of the first byte matches the exact two-byte target
f(P_1(b1 b2), P_2(b1 b2)) enumerated over every pair of bytes of two tiny members, where q alone, the
proposal, does not (the check has power; a weight without the 1 / q factor fails it);
greedy requests keep q's argmax; samples do not depend on the batch."""

from __future__ import annotations

import pytest
import torch

from ensemble_bench.decoding.decode import EveryToken, prefill
from ensemble_bench.decoding.sampling import RequestSampling, SamplingParams, request_key
from ensemble_bench.members import Prompt
from ensemble_bench.methods import GenerationRequest, get_method
from ensemble_bench.methods.f_ensemble_smc import effective_sample_size, log_aggregate
from tests.tiny import outputs, sampled

PROMPT = Prompt(text="Question: What is 12 plus 30? Answer:")
WEIGHTS = [0.25, 0.75]
PARTICLES = 4000
TOLERANCE = 0.02  # the estimate is off by 0.002-0.011 at this seed; q by 0.046-0.136 (asserted > 0.04)


def make(members, batch_size: int = 1, **params):
    cls = get_method("f_ensemble")
    return cls(members, cls.Params.model_validate(params), batch_size=batch_size)


def exact_first_byte(method) -> tuple[torch.Tensor, torch.Tensor]:
    """(pi(b1), q(b1)) [257]: the first byte's marginal of the two-byte target gamma(b1 b2) = f(P(b1 b2))
    (gamma($) = f(P($)) for the text ending at once), each member's P from its own next-byte distributions
    (a member with no live branch after b1 follows q, as the sampler has it), and the proposal's first byte."""
    states = [method.start(GenerationRequest(PROMPT, (), 64)) for _ in range(257)]
    dists = prefill(method.members, [[method.render(i, PROMPT)] * 257 for i in range(len(method.members))], [64] * 257)
    method.begin(dists, states)
    first = torch.stack([method.member_distributions(i, states)[0] for i in range(len(method.members))]).double()
    q, _ = method.combine(list(first[:, None, :]))
    advances = [method.plan(state, b) for state, b in zip(states[:256], range(256))]
    dists = [d[:256] for d in dists]
    for member in method.members:
        member.keep(list(range(256)))
    method.feed(dists, states[:256], advances)
    second = torch.stack([method.member_distributions(i, states[:256]) for i in range(len(method.members))]).double()
    follow, _ = method.combine(list(second))                                    # q(b2 | b1) [256, 257]
    live = second.sum(dim=2, keepdim=True) > 0                                  # [K, 256, 1]
    both = first[:, :256, None].log() + torch.where(live, second, follow[None]).log()
    gamma = log_aggregate(method.params.operator, method.params.exponent, both.reshape(2, -1), method.weights)
    marginal = torch.cat([gamma.reshape(256, 257).exp().sum(dim=1),
                          log_aggregate(method.params.operator, method.params.exponent, first[:, 256:].log(),
                                        method.weights).exp()])
    return marginal / marginal.sum(), q[0]


def smc_first_byte(method, seed: int = 5, temperature: float = 1.0) -> tuple[torch.Tensor, int]:
    """The particles' weighted first-byte distribution after two rounds of the loop (resampling before the
    second, where the ESS asks for it), and how many times they were resampled."""
    params = SamplingParams(do_sample=True, temperature=temperature)
    request = GenerationRequest(PROMPT, (), 64, RequestSampling(params, seed, request_key(PROMPT.text, {}), 0))
    states = method._particles(request)
    prompts = [[method.render(i, PROMPT)] * len(states) for i in range(len(method.members))]
    rounds = EveryToken(method)
    rounds.begin(prefill(method.members, prompts, [64] * len(states)), prompts, states)
    live = list(range(len(states)))
    for _ in range(2):
        rounds.round(live)
        still = [k for k, i in enumerate(live) if states[i].finish is None]
        rounds.keep(still)
        live = [live[k] for k in still]
    logs = torch.tensor([s.log_weight for s in states], dtype=torch.float64)
    weights = (logs - logs.amax()).exp()
    estimate = torch.zeros(257, dtype=torch.float64)
    for state, weight in zip(states, weights):
        estimate[state.symbols[0] if state.symbols else 256] += weight  # ended at once: $
    return estimate / estimate.sum(), states[0].population.resamplings


@pytest.mark.parametrize("operator, ess", [("product", 1.0), ("min", 0.0), ("max", 1.0)])
def test_the_particles_converge_to_the_exact_two_byte_target(pair, operator, ess):
    """The target's mass on the first bytes it favours over q (S = {b1: pi(b1) > q(b1)}): the weighted
    particles match it within TOLERANCE, q misses it by more than twice that."""
    settings = {"weights": WEIGHTS, "operator": operator}
    target, q = exact_first_byte(make(pair(), **settings))
    estimate, resamplings = smc_first_byte(make(pair(), particles=PARTICLES, ess_threshold=ess, **settings))
    favoured = target > q
    assert resamplings == (1 if ess else 0)
    assert abs(float(estimate[favoured].sum() - target[favoured].sum())) < TOLERANCE
    assert float(target[favoured].sum() - q[favoured].sum()) > 2 * TOLERANCE  # the proposal alone is told apart


def test_greedy_requests_keep_q_argmax(pair):
    assert outputs(make(pair(), particles=4)) == outputs(make(pair()))


def test_samples_do_not_depend_on_the_batch(pair):
    requests = sampled(temperature=1.0)
    one = outputs(make(pair(), particles=4, batch_size=1), requests)
    assert one == outputs(make(pair(), particles=4, batch_size=3), requests)
    assert one != outputs(make(pair(), batch_size=1), requests)  # the particles change the answers


def test_effective_sample_size():
    assert effective_sample_size(torch.zeros(4, dtype=torch.float64)) == pytest.approx(4.0)
    assert effective_sample_size(torch.tensor([0.0, -torch.inf, -torch.inf])) == pytest.approx(1.0)
    assert effective_sample_size(torch.full((3,), -torch.inf)) == 0.0


@pytest.mark.parametrize("bad", [{"particles": 0}, {"ess_threshold": 1.5}])
def test_bad_smc_settings_are_refused(bad):
    with pytest.raises(ValueError):
        get_method("f_ensemble").Params.model_validate(bad)
