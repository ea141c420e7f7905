"""f_ensemble (methods/f_ensemble.py, arXiv 2603.05432): the operators against a naive reference on
the members' own next-byte distributions (each member alone through byte_level's covering loop), the
first byte's draws against the locally normalised f (chi-square, fixed seeds, and a wrong operator
fails it), samples the same at batch 1 and 4, one-line errors. Identity, batch invariance of greedy
outputs: tests/methods/test_method_contract.py."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from ensemble_bench.decoding.fused import NonFiniteFusion
from ensemble_bench.decoding.sampling import RequestSampling, SamplingParams, request_key
from ensemble_bench.members import Prompt
from ensemble_bench.methods import GenerationRequest, get_method
from tests.chi_square import fits
from tests.tiny import outputs, sampled

PROMPT = Prompt(text="Question: What is 12 plus 30? Answer:")
DRAWS = 2000
WEIGHTS = [0.25, 0.75]


def make(members, batch_size: int = 1, **params):
    cls = get_method("f_ensemble")
    return cls(members, cls.Params.model_validate(params), batch_size=batch_size)


def first_step(method, rows: int, params: SamplingParams | None = None, seed: int = 3):
    """Prefill ``rows`` copies of PROMPT; (q of the first byte [rows, 257], the first advances)."""
    key = request_key(PROMPT.text, {})
    states = [method.start(GenerationRequest(PROMPT, (), 4, None if params is None else
                                             RequestSampling(params, seed, key, k))) for k in range(rows)]
    dists = [m.prefill([method.render(i, PROMPT)] * rows) for i, m in enumerate(method.members)]
    advances = method.choose(dists, states).advances
    return method.mixed_rows(states), advances


def own_byte_distribution(member) -> torch.Tensor:
    """The member's next-byte distribution alone (byte_level over it): [257], the end of text last."""
    (mixed, _), _ = first_step(get_method("byte_level")([member], get_method("byte_level").Params()), 1)
    return mixed[0]


def naive(operator: str, dists: list[torch.Tensor], exponent: float | None = None) -> torch.Tensor:
    """f byte by byte in plain Python, then normalised (the reference)."""
    values = []
    for b in range(dists[0].shape[0]):
        p = [float(d[b]) for d in dists]
        if operator == "sum":
            values.append(sum(w * x for w, x in zip(WEIGHTS, p)))
        elif operator == "product":
            values.append(math.prod(x ** w for w, x in zip(WEIGHTS, p)))
        elif operator == "min":
            values.append(min(p))
        elif operator == "max":
            values.append(max(p))
        else:
            values.append(sum(w * x ** exponent for w, x in zip(WEIGHTS, p) if x > 0) ** (1 / exponent)
                          if all(x > 0 for x in p) or exponent > 0 else 0.0)
    total = sum(values)
    return torch.tensor([v / total for v in values], dtype=torch.float64)


CASES = [("sum", None), ("product", None), ("min", None), ("max", None), ("power_mean", 2.0), ("power_mean", -1.5)]


@pytest.mark.parametrize("operator, exponent", CASES)
def test_q_is_the_normalised_operator_of_the_members_byte_distributions(pair, operator, exponent):
    members = pair()
    own = [own_byte_distribution(m) for m in members]
    method = make(pair(), weights=WEIGHTS, operator=operator, exponent=exponent)
    (mixed, alive), _ = first_step(method, 1)
    assert bool(alive[0])
    assert mixed[0].double().tolist() == pytest.approx(naive(operator, own, exponent).tolist(), abs=1e-6)


def symbol_of(advance) -> int:
    return 256 if advance.finish else advance.data[0]


@pytest.mark.parametrize("operator, exponent", [("product", None), ("power_mean", -1.5)])
def test_the_first_byte_is_drawn_from_q(pair, operator, exponent):
    method = make(pair(), weights=WEIGHTS, operator=operator, exponent=exponent)
    params = SamplingParams(do_sample=True, temperature=1.0)
    (mixed, _), advances = first_step(method, DRAWS, params)
    counts = Counter(symbol_of(a) for a in advances)
    q = mixed[0].double()
    assert fits(counts, {b: float(q[b]) for b in range(q.shape[0]) if q[b] > 0})
    wrong = make(pair(), weights=WEIGHTS, operator="max")  # the check has power: another f's q fails it
    (other, _), _ = first_step(wrong, 1)
    assert not fits(counts, {b: float(other[0, b]) for b in range(other.shape[1]) if other[0, b] > 0})


@pytest.mark.parametrize("operator", ["product", "min"])
def test_samples_are_the_same_at_batch_1_and_4(pair, operator):
    requests = [*sampled(temperature=1.3), *sampled(repeat=1, temperature=0.8, top_p=0.9)]
    one = outputs(make(pair(), batch_size=1, operator=operator), requests)
    assert one == outputs(make(pair(), batch_size=4, operator=operator), requests)
    assert one[:5] != one[5:]


@pytest.mark.parametrize("bad, message", [({"operator": "power_mean"}, "needs a finite exponent"),
                                          ({"operator": "power_mean", "exponent": 0}, "needs a finite exponent"),
                                          ({"operator": "min", "exponent": 2}, "applies to operator power_mean"),
                                          ({"operator": "median"}, "operator")])
def test_bad_operator_settings_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        get_method("f_ensemble").Params.model_validate(bad)


def test_whole_text_scores_are_the_global_operator(pair):
    """Perplexity: log f(P_1(x), P_2(x)) of the members' own whole-text log-probabilities."""
    texts = ["The quick brown fox", "Question: What is 12"]
    per_member = [get_method("single")([m], get_method("single").Params()).loglikelihood_rolling(texts)
                  for m in pair()]
    product = make(pair(), weights=WEIGHTS).loglikelihood_rolling(texts)
    assert product == pytest.approx([WEIGHTS[0] * a + WEIGHTS[1] * b for a, b in zip(*per_member)], abs=1e-6)
    highest = make(pair(), operator="max").loglikelihood_rolling(texts)
    assert highest == pytest.approx([max(a, b) for a, b in zip(*per_member)], abs=1e-6)


def test_a_non_finite_combination_stops_the_row(pair):
    """decoding/fused.py: a byte distribution gone infinite (the covering arithmetic's, past the loop's
    check of the members' token distributions) made q a row of NaN that sampling and argmax read on;
    the check names the row instead."""
    method = make(pair(), operator="sum")
    finite = torch.tensor([[0.5, 0.5, 0.0], [0.25, 0.25, 0.5]], dtype=torch.float64)
    broken = finite.clone()
    broken[1, 0] = math.inf
    q, alive = method.combine([finite, finite])
    assert alive.all() and torch.allclose(q.sum(dim=1), torch.ones(2, dtype=torch.float64))
    with pytest.raises(NonFiniteFusion) as caught:
        method.combine([finite, broken])
    assert caught.value.row == 1


def test_a_row_without_a_live_member_has_no_continuation_under_a_negative_power_mean(pair):
    """(sum_i w_i M_i^r)^(1/r) over no live member was 0^(1/r) = inf for r < 0: a NonFiniteFusion where
    the row should end with no_continuation (a zero row of q, not alive)."""
    method = make(pair(), operator="power_mean", exponent=-1.0)
    dead = torch.zeros((1, 3), dtype=torch.float64)
    q, alive = method.combine([dead, dead])
    assert not bool(alive[0]) and q.abs().sum() == 0
