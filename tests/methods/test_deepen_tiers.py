"""DeePEn's second bound tiers against the dense transform and the exact path.

- The pairwise bound (vocab/relative.py ``_pairwise_low``): the winner against each head rival on
  their difference of rows. It decides rows the intervals alone leave, and every row it decides is
  the dense argmax.
- The support taken from the log-probs (``Deepen._supports_from_logprobs``): the same ids, in the
  same order, with the same float32 probabilities as the top of exp(log-probs), ties and subnormal
  probabilities included, also when its top-k comes from the vocabulary's blocks (``candidate_topk``).
- The wide tier (``WIDE_HEAD`` exact rows for the rows the first tier leaves): generation equals
  the exact path.
- Rows of R^ computed in place in reused blocks (``RelativeSpace.held_rows``) equal fresh ones.
"""

import pytest
import torch

from ensemble_bench.members import LocalMember
from ensemble_bench.methods import deepen as deepen_module
from ensemble_bench.methods.deepen import Deepen, DeepenParams, candidate_topk
from ensemble_bench.vocab import relative
from ensemble_bench.vocab.relative import RelativeSpace, Scratch, bounded_choice
from tests.methods.test_deepen_fast import (
    bounds_off,
    make_slice,
    peaked,
    random_members,
    random_probs,
)
from tests.naive import dense_argmax, dense_relative
from tests.tiny import REQUESTS
from tests.tolerances import FLOAT32_SUMS, assert_close


def decide(spaces, probs, supports, head, main, eta, steps):
    slices = [make_slice(s, p, ids, head) for s, p, ids in zip(spaces, probs, supports)]
    winner, decided = bounded_choice(slices, [0.5, 0.5], main, eta, steps, Scratch())
    return slices[main].head_ids.gather(1, winner[:, None])[:, 0], decided


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("eta,steps", [(0.15, 5), (0.3, 2), (0.1, 1)])
def test_pairwise_bound_decides_more_rows_and_each_is_the_dense_argmax(seed, eta, steps, monkeypatch):
    embeddings, anchors, generator = random_members(seed, sizes=(80, 60), dim=8, common=45)
    spaces = [RelativeSpace(e, a) for e, a in zip(embeddings, anchors)]
    dense = [dense_relative(e, a) for e, a in zip(embeddings, anchors)]
    main = seed % 2
    with_pairs = without_pairs = 0
    for sharpness in (2.0, 4.0, 8.0):
        probs = [random_probs(generator, 32, e.shape[0], sharpness) for e in embeddings]
        supports = [p.topk(24, dim=-1).indices for p in probs]
        chosen, decided = decide(spaces, probs, supports, 4, main, eta, steps)
        for row in decided.nonzero()[:, 0].tolist():
            expected = dense_argmax(dense, [p[row] for p in probs], [s[row] for s in supports],
                                    [0.5, 0.5], main, eta, steps)
            assert int(chosen[row]) == expected, (sharpness, row)
        with_pairs += int(decided.sum())
        with monkeypatch.context() as patch:  # the intervals alone
            patch.setattr(relative, "_pairwise_low", lambda own, bounds, winner, rows, eta: torch.full(
                (len(rows), own.head_probs.shape[1]), float("-inf")))
            without_pairs += int(decide(spaces, probs, supports, 4, main, eta, steps)[1].sum())
    assert with_pairs > without_pairs


def old_supports(method: Deepen, index: int, logprobs: torch.Tensor):
    probs = logprobs.exp()
    ids = method._supports(index, probs)
    return ids, probs.gather(1, ids)


def method_with(members, support) -> Deepen:
    return Deepen(members, DeepenParams(support=support), batch_size=1)


@pytest.mark.parametrize("support", [None, 1, 7, 40])
def test_supports_from_logprobs_equal_the_top_of_the_probabilities(pair, support):
    method = method_with(pair(), support)
    generator = torch.Generator().manual_seed(5)
    size = method.valid[0].shape[0]
    for scale in (1.0, 30.0, 300.0):  # 300: most probabilities subnormal or zero
        logprobs = (torch.randn(6, size, generator=generator) * scale).log_softmax(dim=-1)
        logprobs[1, 10:20] = logprobs[1, 5]  # ties in the support
        logprobs[2, 3] = logprobs[2, 4] + 1e-7  # exps that may or may not round apart
        ids, probs = method._supports_from_logprobs(0, logprobs)
        expected_ids, expected_probs = old_supports(method, 0, logprobs)
        assert torch.equal(ids, expected_ids), scale
        assert torch.equal(probs.view(torch.int32), expected_probs.view(torch.int32)), scale


@pytest.mark.parametrize("support", [1, 7, 20])
def test_supports_from_logprobs_through_vocabulary_blocks(pair, support, monkeypatch):
    """The support's top-k taken from the vocabulary's blocks (``candidate_topk``): the same ids and
    probabilities as the top of exp(log-probs), ties included."""
    monkeypatch.setattr(deepen_module, "CANDIDATE_BLOCK", 2)  # the tiny vocabulary in blocks of 2: the block path
    method = method_with(pair(), support)
    size = method.valid[0].shape[0]
    assert size // 2 >= 4 * (support + 1)
    generator = torch.Generator().manual_seed(7)
    for scale in (1.0, 30.0):
        logprobs = (torch.randn(5, size, generator=generator) * scale).log_softmax(dim=-1)
        logprobs[1, 10:20] = logprobs[1, 5]  # ties in the support
        ids, probs = method._supports_from_logprobs(0, logprobs)
        expected_ids, expected_probs = old_supports(method, 0, logprobs)
        assert torch.equal(ids, expected_ids), scale
        assert torch.equal(probs.view(torch.int32), expected_probs.view(torch.int32)), scale


@pytest.mark.parametrize("support,main", [(None, 0), (24, 1)])
def test_generation_with_the_wide_tier_equals_the_exact_path(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model,
                                                             monkeypatch, support, main):
    models = [peaked(bpe_model, 10.0), peaked(sp_model, 10.0)]

    def pair():
        return [LocalMember(models[0], bpe_tokenizer, "a"), LocalMember(models[1], sp_tokenizer, "b")]
    params = DeepenParams(retokenize="local", support=support, main=main, eta=0.3)
    monkeypatch.setattr(deepen_module, "HEAD", 1)  # the first tier leaves rows to the wide one
    tiers: list[int] = []
    real_tier = Deepen._bounded_tier

    def counted_tier(self, probs, supports, head_size):
        chosen, decided = real_tier(self, probs, supports, head_size)
        if head_size == deepen_module.WIDE_HEAD:
            tiers.append(int(decided.sum()))
        return chosen, decided
    monkeypatch.setattr(Deepen, "_bounded_tier", counted_tier)
    bounded = [g.text for g in Deepen(pair(), params, batch_size=3).generate(REQUESTS)]
    assert sum(tiers) > 0  # the wide tier decided rows
    bounds_off(monkeypatch)
    assert bounded == [g.text for g in Deepen(pair(), params, batch_size=3).generate(REQUESTS)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_in_reused_blocks_equal_fresh_rows(dtype):
    generator = torch.Generator().manual_seed(2)
    embeddings = torch.randn(60, 7, generator=generator).to(dtype)
    space = RelativeSpace(embeddings, list(range(0, 60, 3)), cache_bytes=4 * 20 * 8)  # 8 rows cached
    fresh = RelativeSpace(embeddings, list(range(0, 60, 3))).compute_rows(torch.arange(60))
    for ids in ([5, 1, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [9, 5, 40]):  # cached, too many, partly cached
        ids = torch.tensor(ids)
        in_place = space.compute_rows(ids, out=torch.empty(len(ids), space.size))
        assert torch.equal(in_place, space.compute_rows(ids))  # the same rounding as a fresh block
        # the right rows, through the cache (a matmul's rounding may vary with how many rows it takes)
        assert_close(space.held_rows(ids, "block"), fresh[ids], FLOAT32_SUMS)


@pytest.mark.parametrize("block", [2, 3, 5])
def test_candidate_topk_equals_topk(block, monkeypatch):
    """``candidate_topk``: the values of ``torch.topk``, sorted, indices holding those values, a last
    partial block included; rows with a NaN are flagged; a mostly -inf row and ties at the top agree too."""
    monkeypatch.setattr(deepen_module, "CANDIDATE_BLOCK", block)
    generator = torch.Generator().manual_seed(block)
    x = torch.randn(7, 203, generator=generator) * torch.tensor([[0.1], [1.0], [10.0], [100.0], [1.0], [1.0], [1.0]])
    x[4, :150] = float("-inf")  # most of a row masked
    x[5, 20:40] = x[5].max()  # ties at the top
    x[6, 201] = float("nan")  # in the last, partial block
    x[1, 17] = float("nan")
    k = 9
    values, indices, complete = candidate_topk(x, k)
    expected = x.topk(k, dim=-1)
    assert complete.tolist() == [True, False, True, True, True, True, False]
    assert torch.equal(values[complete], expected.values[complete])
    assert torch.equal(x.gather(1, indices)[complete], values[complete])
    assert all(len(set(row)) == k for row in indices[complete].tolist())  # k distinct columns
