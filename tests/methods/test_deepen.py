"""DeePEn: hand-checked relative matrix and inverse step, anchors, the row cache, and fast == a
naive dense implementation (exact and with a restricted support). Identity, batch invariance and
Ray: tests/methods/test_method_contract.py."""

import math

import pytest
import torch

from ensemble_bench.methods.deepen import Deepen, DeepenParams, resolve_deepen_weights
from ensemble_bench.vocab import VocabView
from ensemble_bench.vocab.relative import RelativeSpace, anchor_ids, inverse_transform, kl_divergence
from tests.naive import naive_deepen
from tests.tiny import REQUESTS
from tests.tolerances import FLOAT32_SUMS, assert_close


# ------------------------------------------------------------------ hand-checked maths
def test_relative_rows_and_one_inverse_step_hand_checked():
    embeddings = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]])
    space = RelativeSpace(embeddings, [0, 1])  # anchors: tokens 0 and 1
    e = math.e
    # Eq. 2: cosine to each anchor; Eq. 4: softmax over the anchors
    expected_rows = [[e / (e + 1), 1 / (e + 1)], [1 / (e + 1), e / (e + 1)], [0.5, 0.5], [e / (e + 1), 1 / (e + 1)]]
    assert space.rows(torch.arange(4)).flatten().tolist() == pytest.approx(sum(expected_rows, []))
    p = [0.5, 0.2, 0.2, 0.1]
    r = [sum(p[v] * expected_rows[v][a] for v in range(4)) for a in range(2)]  # r = p R^
    assert space.represent(torch.tensor(p), torch.arange(4)).tolist() == pytest.approx(r)
    target = [0.3, 0.7]
    eta = 0.2
    # Eq. 7, one step: p_v += eta * sum_a R^[v, a] * target_a / (p R^)_a
    stepped = [p[v] + eta * sum(expected_rows[v][a] * target[a] / r[a] for a in range(2)) for v in range(4)]
    updated = inverse_transform(torch.tensor(p), torch.arange(4), space, torch.tensor(target), eta, steps=1)
    assert updated.tolist() == pytest.approx(stepped)
    # the step lowers the loss of Eq. 6
    after = space.represent(updated, torch.arange(4))
    assert kl_divergence(torch.tensor(target), after) < kl_divergence(torch.tensor(target), torch.tensor(r))
    # token 1 leans to anchor 1, which the target favours: it gains the most
    assert int((updated - torch.tensor(p)).argmax()) == 1


def test_anchors_are_the_common_tokens_by_bytes():
    a = VocabView((b"<s>", b" the", b"a", b" James", b"a"), frozenset({0}), "byte-level")  # 'a' twice
    b = VocabView((b" the", b"</s>", b" Jam", b"a", None), frozenset({1}), "sentencepiece")
    assert anchor_ids([a, b]) == [[1, 2], [0, 3]]  # ' the' and 'a' (A's lowest id); specials never


def test_adapt_weights_follow_the_paper():
    params = DeepenParams(weights="adapt", scores=[0.70, 0.55], chance=0.25)
    assert resolve_deepen_weights(params, 2) == pytest.approx([0.45 / 0.75, 0.30 / 0.75])
    assert resolve_deepen_weights(DeepenParams(), 4) == [0.25] * 4


def test_row_cache_returns_the_computed_rows_under_eviction():
    torch.manual_seed(0)
    embeddings = torch.randn(50, 8)
    space = RelativeSpace(embeddings, list(range(0, 50, 5)), cache_bytes=4 * 10 * 12)  # room for 12 rows
    for ids in ([1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [2, 30, 31, 1], list(range(20, 32)), [3, 3, 40]):
        index = torch.tensor(ids)
        # equal up to float rounding: a row computed in another batch may differ in the last bits
        assert_close(space.rows(index), space.compute_rows(index), FLOAT32_SUMS)
    assert space.fits(12) and not space.fits(13)


# ------------------------------------------------------------------ fast == the naive dense reference (tests/naive.py)
@pytest.mark.parametrize("support,main", [(None, 0), (None, 1), (6, 1)])
def test_cached_batched_path_equals_naive_dense_reference(pair, bpe_model, sp_model, support, main):
    fast = Deepen(pair(), DeepenParams(retokenize="local", support=support, main=main, eta=0.3),
                  batch_size=3).generate(REQUESTS)
    for request, generation in zip(REQUESTS, fast):
        assert generation.text == naive_deepen(pair(), [bpe_model, sp_model], request, support, main, eta=0.3)
