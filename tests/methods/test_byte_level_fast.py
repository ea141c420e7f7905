"""byte_level's batched covering-tree step (issue 28) against the row-by-row, branch-by-branch
computation it replaced: exp value for value, masses and mixtures per branch, generations and
scores of whole runs."""

import math

import pytest
import torch

from ensemble_bench.members import LocalMember
from ensemble_bench.methods.byte_level import ByteLevel, ByteLevelParams
from ensemble_bench.vocab.covering import END, SortedVocab, exact_exp, next_byte_distribution, open_branches
from tests.methods.test_byte_level import PIECES, SCORED, SHORT
from tests.tiny import outputs
from tests.tolerances import FLOAT32_SUMS, assert_close


def row_by_row_mass(vocab: SortedVocab, branch) -> torch.Tensor:
    """The replaced Branch.next_byte_mass: the branch's range in sorted order, one scatter-add."""
    sorted_probs = branch.probs[vocab.order]
    mass = torch.zeros(END + 1, dtype=sorted_probs.dtype)
    mass.index_add_(0, vocab.bytes_at[branch.lo:branch.hi, branch.depth], sorted_probs[branch.lo:branch.hi])
    mass[END] = (branch.end if branch.mass is None else float(branch.mass[END])) if branch.depth == 0 else 0.0
    return mass


def row_by_row_distribution(vocab: SortedVocab, branches) -> torch.Tensor:
    """The replaced next_byte_distribution: a Python sum over branches weighted by P(c_j) / P(c_top)."""
    top = max(b.logp for b in branches)
    total = sum(torch.exp(torch.tensor(b.logp - top)) * row_by_row_mass(vocab, b) for b in branches)
    return total / total.sum()


class RowByRow(ByteLevel):
    """Today's path as the reference: every row's every member's distribution on its own."""

    def member_distributions(self, i, states):
        return torch.stack([row_by_row_distribution(self.vocabs[i], s.trees[i].branches) for s in states])


@pytest.mark.parametrize("scale", [0.1, 1.0, 30.0, 300.0])
def test_exact_exp_is_exp_value_for_value(scale):
    torch.manual_seed(0)
    logprobs = (torch.randn(3, 5000) * scale).log_softmax(-1)
    logprobs[0, :4] = torch.tensor([-float("inf"), -87.5, -103.9, -104.5])
    assert torch.equal(exact_exp(logprobs), logprobs.exp())
    logprobs[1, 7] = float("nan")
    assert torch.isnan(exact_exp(logprobs)[1, 7])


def test_opened_branches_sum_as_one_row_at_a_time():
    vocab = SortedVocab(PIECES, frozenset({6}))
    torch.manual_seed(1)
    logprobs = (torch.randn(4, 8) * 3).log_softmax(-1)
    opened = open_branches(vocab, [0.0, -1.0, -2.5, -0.5], logprobs, [6])
    for k, branch in enumerate(opened):
        assert branch.logp == [0.0, -1.0, -2.5, -0.5][k]
        assert_close(branch.mass, row_by_row_mass(vocab, branch), FLOAT32_SUMS)
        assert float(branch.mass[END]) == pytest.approx(float(logprobs[k, 6].exp()))
    grown = [b.grow(vocab, b"a") for b in opened]
    mixed = next_byte_distribution(vocab, grown[:2] + opened[2:])
    reference = row_by_row_distribution(vocab, grown[:2] + opened[2:])
    assert_close(mixed, reference, FLOAT32_SUMS)


def members_of(order, bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    both = [(bpe_tokenizer, bpe_model), (sp_tokenizer, sp_model)]
    return [LocalMember(model, tok, f"m{i}") for i, (tok, model) in enumerate(both[i] for i in order)]


@pytest.mark.parametrize("order,weights,batch_size", [((0, 1), [1.0, 1.0], 3), ((1, 0), [1.0, 3.0], 1),
                                                      ((0, 1), [2.0, 1.0], 5)])
def test_generations_equal_the_row_by_row_path(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, order, weights,
                                               batch_size):
    members = members_of(order, bpe_tokenizer, bpe_model, sp_tokenizer, sp_model)
    fast = ByteLevel(members, ByteLevelParams(weights=weights), batch_size=batch_size)
    slow = RowByRow(members, ByteLevelParams(weights=weights), batch_size=batch_size)
    assert outputs(fast, SHORT) == outputs(slow, SHORT)
    assert fast.stats == slow.stats


@pytest.mark.parametrize("order,weights,batch_size", [((0, 1), [1.0, 1.0], 3), ((1, 0), [1.0, 3.0], 2)])
def test_scores_equal_the_row_by_row_path(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, order, weights,
                                          batch_size):
    members = members_of(order, bpe_tokenizer, bpe_model, sp_tokenizer, sp_model)
    fast = ByteLevel(members, ByteLevelParams(weights=weights), batch_size=batch_size).loglikelihood(SCORED)
    slow = RowByRow(members, ByteLevelParams(weights=weights), batch_size=batch_size).loglikelihood(SCORED)
    for a, b in zip(fast, slow):
        assert a.is_greedy == b.is_greedy
        assert FLOAT32_SUMS.holds(a.logprob, b.logprob) or (a.logprob < -600 and b.logprob < -600)


def test_peaked_members_equal_the_row_by_row_path(bpe_tokenizer, sp_tokenizer):
    """Heads scaled until most next-token probabilities underflow float32 (exact_exp's fast path)."""
    from tests.tiny import tiny_llama

    models = []
    for seed, tok in enumerate((bpe_tokenizer, sp_tokenizer)):
        model = tiny_llama(len(tok), seed=seed + 5)
        with torch.no_grad():
            model.lm_head.weight.mul_(40.0)
        models.append(LocalMember(model, tok, f"p{seed}"))
    probe = models[0].prefill([models[0].encode("The quick")])
    assert float((probe < -87).float().mean()) > 0.3
    fast = ByteLevel(models, ByteLevelParams(), batch_size=3)
    slow = RowByRow(models, ByteLevelParams(), batch_size=3)
    assert outputs(fast, SHORT) == outputs(slow, SHORT)
    for a, b in zip(fast.loglikelihood(SCORED[:3]), slow.loglikelihood(SCORED[:3])):
        assert a.is_greedy == b.is_greedy
        same_nan = math.isnan(a.logprob) and math.isnan(b.logprob)  # every branch's mass underflowed: 0 / 0 in both
        assert same_nan or FLOAT32_SUMS.holds(a.logprob, b.logprob) \
            or min(a.logprob, b.logprob) < -600
