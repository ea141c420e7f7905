"""decoding/sampling.py: the transforms against plain-Python references, lm-eval's reading of
gen_kwargs, the per-request generators and the draw."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from ensemble_bench.decoding.sampling import (
    MinP,
    SamplingOverride,
    SamplingParams,
    Temperature,
    TopK,
    TopP,
    draw,
    draw_rows,
    request_generator,
    request_key,
)

PROBS = [0.05, 0.4, 0.1, 0.25, 0.2]


def logprobs(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64).log()


def kept(shaped: torch.Tensor) -> list[list[int]]:
    return [[i for i, value in enumerate(row) if value != -math.inf] for row in shaped.tolist()]


def naive_top_p(probs: list[float], p: float) -> list[int]:
    """The smallest set of most probable entries whose mass reaches p (lower index first on ties)."""
    order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
    chosen, mass = [], 0.0
    for i in order:
        if mass >= p:
            break
        chosen.append(i)
        mass += probs[i]
    return sorted(chosen)


@pytest.mark.parametrize("p", [0.3, 0.4, 0.41, 0.65, 0.66, 0.9, 0.96, 1.0])
def test_top_p_keeps_the_smallest_set_reaching_p(p):
    assert kept(TopP(p)(logprobs([PROBS]))) == [naive_top_p(PROBS, p)]


def test_top_k_keeps_the_k_largest_and_their_ties():
    assert kept(TopK(2)(logprobs([PROBS]))) == [[1, 3]]
    assert kept(TopK(2)(logprobs([[0.3, 0.3, 0.3, 0.1]]))) == [[0, 1, 2]]
    assert kept(TopK(10)(logprobs([PROBS]))) == [[0, 1, 2, 3, 4]]


def test_min_p_keeps_entries_within_a_share_of_the_top():
    assert kept(MinP(0.5)(logprobs([PROBS]))) == [[1, 3, 4]]  # >= 0.2
    assert kept(MinP(0.0)(logprobs([PROBS]))) == [[0, 1, 2, 3, 4]]


def test_temperature_is_p_to_the_one_over_t():
    shaped = Temperature(0.5)(logprobs([PROBS]))
    expected = torch.tensor(PROBS, dtype=torch.float64) ** 2
    assert torch.allclose(torch.softmax(shaped, -1)[0], expected / expected.sum())


@pytest.mark.parametrize("make, bad", [(Temperature, 0.0), (Temperature, math.inf), (TopK, 0), (TopP, 0.0),
                                       (TopP, 1.5), (MinP, -0.1), (MinP, 2.0)])
def test_transforms_refuse_values_out_of_range(make, bad):
    with pytest.raises(ValueError):
        make(bad)


def test_the_transforms_apply_in_transformers_order():
    params = SamplingParams(do_sample=True, temperature=0.5, top_k=3, top_p=0.9, min_p=0.3)
    assert [type(t) for t in params.transforms()] == [Temperature, TopK, TopP, MinP]
    assert SamplingParams(do_sample=True).transforms() == []  # temperature 1 and nothing else changes nothing
    # by hand: T = 0.5 squares 0.4, 0.25, 0.2 (top 3); top_p 0.9 of (0.16, 0.0625, 0.04)/0.2625 keeps 0.4 and 0.25
    assert kept(params.shape(logprobs([PROBS]))) == [[1, 3]]


@pytest.mark.parametrize("gen_kwargs, expected", [
    ({}, SamplingParams(temperature=0.0)),
    ({"until": ["\n"], "do_sample": False}, SamplingParams(temperature=0.0)),
    ({"do_sample": False, "temperature": 1.0}, SamplingParams(do_sample=False, temperature=1.0)),  # longbench
    ({"do_sample": True, "temperature": 0.2}, SamplingParams(do_sample=True, temperature=0.2)),
    ({"temperature": 0.7}, SamplingParams(do_sample=True, temperature=0.7)),  # lm-eval: do_sample from T > 0
    ({"do_sample": True}, SamplingParams(do_sample=True, temperature=0.0)),  # lm-eval: temperature 0, greedy
    ({"do_sample": True, "temperature": 1, "top_p": 0.95, "top_k": 50, "min_p": 0.05},
     SamplingParams(do_sample=True, temperature=1.0, top_p=0.95, top_k=50, min_p=0.05)),
])
def test_gen_kwargs_read_as_lm_eval_normalises_them(gen_kwargs, expected):
    assert SamplingParams.from_gen_kwargs(gen_kwargs) == expected


def test_greedy_unless_do_sample_and_a_temperature():
    assert SamplingParams().greedy and SamplingParams(do_sample=True, temperature=0.0).greedy
    assert not SamplingParams(do_sample=True).greedy


@pytest.mark.parametrize("gen_kwargs", [{"temperature": -1}, {"do_sample": True, "temperature": 1, "top_p": 0},
                                        {"do_sample": True, "temperature": 1, "top_k": -3},
                                        {"temperature": float("nan")}])
def test_gen_kwargs_out_of_range_are_refused(gen_kwargs):
    with pytest.raises(ValidationError):
        SamplingParams.from_gen_kwargs(gen_kwargs)


def test_an_override_replaces_the_settings_it_gives():
    task = SamplingParams(do_sample=True, temperature=0.2)
    assert SamplingOverride(do_sample=False).over(task).greedy
    assert SamplingOverride(temperature=0.9, top_p=0.5).over(SamplingParams(temperature=0.0)) == SamplingParams(
        do_sample=True, temperature=0.9, top_p=0.5)
    assert SamplingOverride(top_k=5).over(task) == SamplingParams(do_sample=True, temperature=0.2, top_k=5)
    entry = SamplingOverride(top_p=0.5).merged(SamplingOverride(temperature=0.7, top_p=0.9))
    assert entry == SamplingOverride(temperature=0.7, top_p=0.5)
    with pytest.raises(ValidationError):
        SamplingOverride()


def test_request_keys_and_generators_are_stable_and_distinct():
    key = request_key("Question: 2 + 2?", {"until": ["\n"], "do_sample": True, "temperature": 0.5})
    assert key == request_key("Question: 2 + 2?", {"temperature": 0.5, "do_sample": True, "until": ["\n"]})
    assert key != request_key("Question: 2 + 3?", {"until": ["\n"], "do_sample": True, "temperature": 0.5})

    def numbers(seed, repeat, request=key):
        generator = request_generator(seed, request, repeat)
        return torch.rand(4, generator=generator).tolist()

    assert numbers(1234, 0) == numbers(1234, 0)
    assert len({tuple(numbers(seed, repeat)) for seed in (1, 2) for repeat in (0, 1, 2)}) == 6
    assert numbers(1, 0) != numbers(1, 0, request_key("other", {}))


def test_greedy_draw_is_the_argmax():
    values = logprobs([PROBS, [0.5, 0.5, 0.0, 0.0, 0.0]])
    assert draw(values, SamplingParams(), [torch.Generator()] * 2).tolist() == [1, 0]


def test_draws_follow_the_shaped_distribution():
    """20,000 draws at a fixed seed against the shaped distribution: chi-square below the 0.999 quantile (4 df)."""
    params = SamplingParams(do_sample=True, temperature=0.8, top_k=4)
    expected = torch.softmax(params.shape(logprobs([PROBS]))[0], -1).tolist()
    generator = torch.Generator().manual_seed(5)
    counts = [0] * len(PROBS)
    for _ in range(20):
        rows = logprobs([PROBS] * 1000)
        for index in draw(rows, params, [generator] * 1000).tolist():
            counts[index] += 1
    assert counts[0] == 0  # outside the top 4
    chi2 = sum((counts[i] - 20000 * p) ** 2 / (20000 * p) for i, p in enumerate(expected) if p > 0)
    assert chi2 < 16.27


def test_each_row_draws_from_its_own_generator_whatever_its_neighbours():
    from ensemble_bench.decoding.sampling import Sampler

    params = [SamplingParams(do_sample=True, temperature=t) for t in (0.5, 1.0, 2.0, 1.0)]
    rows = logprobs([PROBS, PROBS[::-1], PROBS, [0.2] * 5])

    def samplers():
        return [Sampler(p, request_generator(7, f"request {k}", 0)) for k, p in enumerate(params)]

    together = draw_rows(rows, samplers())
    alone = [draw_rows(rows[k:k + 1], [s])[0] for k, s in enumerate(samplers())]
    assert together == alone
    again = samplers()
    assert len({tuple(draw_rows(rows, again)) for _ in range(10)}) > 1  # each generator moves on as it draws
