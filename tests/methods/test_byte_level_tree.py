"""byte_level's multiple-choice scoring read as one token tree per member (vocab/byte_tree.py)
against the byte-by-byte loop it replaces (one forward per member per byte, kept for members that
do not read trees): same log-probabilities within float tolerance, same greedy flags, the same
error for a model that gives NaN."""

import math

import pytest
import torch

from ensemble_bench.decoding.feeding import canonical_tail
from ensemble_bench.decoding.method import NonFiniteScore
from ensemble_bench.members import LocalMember, Prompt
from ensemble_bench.methods import LoglikelihoodRequest, byte_level
from ensemble_bench.methods.byte_level import ByteLevel, ByteLevelParams
from ensemble_bench.vocab.byte_tree import ContinuationTree
from tests.methods.test_byte_level import SCORED, nihon_member  # noqa: F401 (a fixture)
from tests.naive import naive_live_score
from tests.tiny import CORPUS
from tests.tolerances import TINY_MODEL, assert_close

LONGER = SCORED + [
    LoglikelihoodRequest(Prompt(text="Question: How do I keep bread fresh?\nAnswer:"),
                         " Store the bread in a sealed bag in the freezer."),
    LoglikelihoodRequest(Prompt(text="Question: How do I keep bread fresh?\nAnswer:"),
                         " Store the bread in an open bowl next to the oven."),
    LoglikelihoodRequest(Prompt(text=CORPUS[1][:20]), CORPUS[1][20:90]),
    LoglikelihoodRequest(Prompt(text="Caf\u00e9"), " na\u00efve \u00fcber alles"),  # 2-byte characters
]


class LoopMember(LocalMember):
    """A member that reads no token trees: byte_level scores it with the byte-by-byte loop."""

    reads_trees = False


def members(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, trees: bool):
    kind = LocalMember if trees else LoopMember
    return [kind(bpe_model, bpe_tokenizer, "bpe"), kind(sp_model, sp_tokenizer, "sp")]


def scores(members_, weights, batch_size, requests=LONGER):
    return ByteLevel(members_, ByteLevelParams(weights=weights), batch_size=batch_size).loglikelihood(requests)


def assert_same(read, looped):
    for a, b in zip(read, looped, strict=True):
        assert a.is_greedy == b.is_greedy
        same_nan = math.isnan(a.logprob) and math.isnan(b.logprob)  # every branch's mass underflowed in both
        assert same_nan or TINY_MODEL.holds(a.logprob, b.logprob) or max(a.logprob, b.logprob) < -600


@pytest.mark.parametrize("weights,batch_size", [([1.0, 1.0], 1), ([2.0, 1.0], 3), ([1.0, 3.0], 8)])
def test_tree_read_scores_equal_the_byte_by_byte_loop(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, weights,
                                                      batch_size):
    methods = [ByteLevel(members(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, trees),
                         ByteLevelParams(weights=weights), batch_size=batch_size) for trees in (True, False)]
    read, looped = (method.loglikelihood(LONGER) for method in methods)
    assert_same(read, looped)
    assert any(s.logprob > -600 for s in read[5:])
    assert methods[0].stats == methods[1].stats  # the same covering trees, byte by byte


def test_peaked_members_tree_read_equals_the_loop(bpe_tokenizer, sp_tokenizer):
    """Heads scaled until some next-token probabilities underflow float32 (the shifted opening's
    clamp). Where the loop's float32 masses underflow (a score below -600) the two may differ."""
    from tests.tiny import tiny_llama

    def pair(trees):
        built = []
        for seed, tok in enumerate((bpe_tokenizer, sp_tokenizer)):
            model = tiny_llama(len(tok), seed=seed + 5)
            with torch.no_grad():
                model.lm_head.weight.mul_(15.0)
            built.append((LocalMember if trees else LoopMember)(model, tok, f"p{seed}"))
        return built
    read = pair(True)
    probe = read[0].prefill([read[0].encode("The quick")])
    assert float((probe < -87).float().mean()) > 0.05
    read, looped = scores(read, None, 3), scores(pair(False), None, 3)
    assert_same(read, looped)
    assert sum(-600 < s.logprob < 0 for s in read) >= 2


def test_rows_split_into_groups_score_the_same(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, monkeypatch):
    whole = scores(members(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, True), None, 8)
    monkeypatch.setattr(byte_level, "TREE_NODES", 10)
    assert byte_level.tree_groups([[ContinuationTree(tokens=[1] * 6)]] * 3) == [[0], [1], [2]]
    grouped = scores(members(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, True), None, 8)
    assert_same(grouped, whole)


def test_the_trie_shares_the_prefixes_of_every_re_tokenisation(bpe_tokenizer, bpe_model):
    member = LocalMember(bpe_model, bpe_tokenizer, "bpe")
    tail = canonical_tail(member)
    forced = b" the quick brown fox"
    tree = ContinuationTree.of(tail, forced)
    assert len(tree.plans) == len(forced) and len(tree.fed) == len(forced) - 1
    held = []
    for plan, fed in zip(tree.plans, tree.fed):
        held = held[:plan.keep] + list(plan.ids)
        if fed is not None:  # the fed nodes spell the new ids, under the kept ones
            assert [tree.tokens[n] for n in fed] == list(plan.ids)
    path, node = [], fed[-1] if (fed := next(f for f in reversed(tree.fed) if f)) else -1
    while node >= 0:
        path.append(tree.tokens[node])
        node = tree.parents[node]
    assert path[::-1] == held
    assert len(tree.tokens) < sum(len(p.ids) for p in tree.plans)  # shared prefixes are read once


def test_sliding_window_members_keep_the_loop(bpe_tokenizer, bpe_model):
    member = LocalMember(bpe_model, bpe_tokenizer, "bpe")
    assert member.reads_trees
    bpe_model.config.sliding_window = 16
    try:
        assert not member.reads_trees
    finally:
        bpe_model.config.sliding_window = None


def test_a_nan_model_fails_as_the_loop_does(bpe_tokenizer, bpe_model, sp_tokenizer):
    from tests.tiny import tiny_llama

    broken = tiny_llama(len(sp_tokenizer), seed=1)  # not the shared fixture: its head is spoilt
    with torch.no_grad():
        broken.lm_head.weight[3].fill_(float("nan"))
    both = [LocalMember(bpe_model, bpe_tokenizer, "bpe"), LocalMember(broken, sp_tokenizer, "sp")]
    with pytest.raises(NonFiniteScore, match="member 'sp'"):
        scores(both, None, 2, LONGER[:2])


# ------------------------------------------------------------------ members without a live branch
DEAD_END = LoglikelihoodRequest(Prompt(text="Caf\u00e9"), " na\u00efve \u00fcber \u65e5\u672c")  # 3-byte characters
NIHON = LoglikelihoodRequest(Prompt(text="The quick"), " \u65e5\u672c")


@pytest.mark.parametrize("chosen", [(0,), (1,), (0, 1)])
def test_no_member_with_a_live_branch_scores_minus_infinity_on_both_paths(bpe_tokenizer, bpe_model, sp_tokenizer,
                                                                          sp_model, chosen):
    """Neither tiny vocabulary spells a 3-byte character but in byte tokens: inside it no branch
    is live in any member, so log q = -inf (not NaN, no IndexError) and the rows beside it keep their scores."""
    requests = [LONGER[0], DEAD_END, LONGER[1]]
    results = []
    for trees in (True, False):
        both = members(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, trees)
        results.append(scores([both[i] for i in chosen], [1.0] * len(chosen), 3, requests))
        alone = scores([both[i] for i in chosen], [1.0] * len(chosen), 3, [requests[0], requests[2]])
        assert_same([results[-1][0], results[-1][2]], alone)
    read, looped = results
    assert read[1].logprob == looped[1].logprob == -math.inf
    assert not read[1].is_greedy and not looped[1].is_greedy
    assert_same(read, looped)


@pytest.mark.parametrize("weights", [[1.0, 2.0], [3.0, 1.0]])
def test_a_member_without_a_live_branch_is_left_out_of_the_average(nihon_member, sp_tokenizer, sp_model,  # noqa: F811
                                                                   weights):
    """Inside the 3-byte character the SentencePiece member has no live branch (byte tokens only):
    the average renormalises over the member that spells it, on both paths, as the naive reference does."""
    tokenizer, model = nihon_member
    read, looped = (scores([kind(model, tokenizer, "nihon"), kind(sp_model, sp_tokenizer, "sp")], weights, 2,
                           [NIHON, LONGER[0]]) for kind in (LocalMember, LoopMember))
    assert_same(read, looped)
    both = [LocalMember(model, tokenizer, "nihon"), LocalMember(sp_model, sp_tokenizer, "sp")]
    expected, dead = naive_live_score(both, [model, sp_model], NIHON, weights)
    assert dead >= 2  # the member was left out at some bytes
    assert_close(read[0].logprob, expected, TINY_MODEL)
    assert math.isfinite(read[0].logprob)
