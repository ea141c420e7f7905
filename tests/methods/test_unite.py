"""UniTE: hand-checked alignment rules and fast == a naive Algorithm 1 (identity, scoring flags, batch
invariance and Ray: tests/methods/test_method_contract.py)."""

import pytest
import torch

from ensemble_bench.methods.unite import Unite, UniteParams
from ensemble_bench.vocab import VocabView
from ensemble_bench.vocab.topk import (
    RULE_FIRST_SUBTOKEN,
    RULE_TOPK,
    RULE_VOCAB,
    STOP,
    TopKAligner,
    average_aligned,
    member_topk,
    union_keys,
)
from tests.naive import naive_unite
from tests.tiny import REQUESTS

# ------------------------------------------------------------------ hand-checked alignment (Alg. 1)
# A has ' James' as one token; B only has ' Jam' + 'es' (the paper's example). A lacks ' a' and
# spells it ' ' + 'a'.
A = VocabView((b"</s>", b" James", b" Jam", b"es", b" the", b" ", b"a"), frozenset({0}), "byte-level")
B = VocabView((b"<|im_end|>", b" Jam", b"es", b" the", b" a"), frozenset({0}), "byte-level")
A_SPLITS = {b" a": [5, 6]}
B_SPLITS = {b" James": [1, 2]}
PA = torch.tensor([0.05, 0.45, 0.05, 0.10, 0.30, 0.03, 0.02])
PB = torch.tensor([0.10, 0.50, 0.05, 0.15, 0.20])


def aligners():
    return (TopKAligner(A, frozenset({0}), lambda data: A_SPLITS[data]),
            TopKAligner(B, frozenset({0}), lambda data: B_SPLITS[data]))


def test_alignment_rules_hand_checked():
    a, b = aligners()
    top_a = member_topk(a, PA.topk(2).indices.tolist(), PA)  # ' James' .45, ' the' .30
    top_b = member_topk(b, PB.topk(2).indices.tolist(), PB)  # ' Jam' .50, ' a' .20
    keys = union_keys([top_a, top_b])
    assert keys == [b" James", b" the", b" Jam", b" a"]
    aligned_a = [a.align(k, PA, top_a) for k in keys]
    aligned_b = [b.align(k, PB, top_b) for k in keys]
    # rule 1: in the member's top-k; rule 2: in its vocabulary; rule 3: its first sub-token
    assert [(x.token, x.rule) for x in aligned_a] == [(1, RULE_TOPK), (4, RULE_TOPK), (2, RULE_VOCAB),
                                                       (5, RULE_FIRST_SUBTOKEN)]
    assert [(x.token, x.rule) for x in aligned_b] == [(1, RULE_FIRST_SUBTOKEN), (3, RULE_VOCAB), (1, RULE_TOPK),
                                                       (4, RULE_TOPK)]
    assert [x.prob for x in aligned_b] == pytest.approx([0.50, 0.15, 0.50, 0.20])
    averaged = average_aligned([aligned_a, aligned_b], [1.0, 1.0])
    # softmax over each aligned set = probabilities renormalised over it, then the mean
    a_norm = [0.45 / 0.83, 0.30 / 0.83, 0.05 / 0.83, 0.03 / 0.83]
    b_norm = [0.50 / 1.35, 0.15 / 1.35, 0.50 / 1.35, 0.20 / 1.35]
    assert averaged == pytest.approx([(x + y) / 2 for x, y in zip(a_norm, b_norm)])
    # ' James' wins: B's probability of ' Jam' counts for it. A primary emits ' James', B its ' Jam'.
    best = max(range(len(keys)), key=lambda j: averaged[j])
    assert keys[best] == b" James"
    assert aligned_a[best].token == 1 and aligned_b[best].token == 1
    # without rule 3 (the GaC-style zero for a missing token) ' James' would lose to ' Jam'
    zeroed_b = [0.0 if x.rule == RULE_FIRST_SUBTOKEN else x.prob for x in aligned_b]
    zeroed = [(x + y / sum(zeroed_b)) / 2 for x, y in zip(a_norm, zeroed_b)]
    assert keys[max(range(len(keys)), key=lambda j: zeroed[j])] == b" Jam"


def test_stop_tokens_share_one_key_and_each_member_uses_its_most_probable_stop():
    a, b = aligners()
    stop_heavy = torch.tensor([0.60, 0.10, 0.05, 0.10, 0.10, 0.03, 0.02])
    top_a = member_topk(a, stop_heavy.topk(1).indices.tolist(), stop_heavy)
    assert top_a == {STOP: 0}
    aligned = b.align(STOP, PB, member_topk(b, [1], PB))
    assert (aligned.token, aligned.prob, aligned.rule) == (0, pytest.approx(0.10), RULE_VOCAB)


# ------------------------------------------------------------------ fast == the naive reference (tests/naive.py)
@pytest.mark.parametrize("primary", [0, 1])
def test_cached_batched_path_equals_naive_reference(pair, bpe_model, sp_model, primary):
    method = Unite(pair(), UniteParams(retokenize="local", k=5, primary=primary), batch_size=3)
    fast = method.generate(REQUESTS)
    for request, generation in zip(REQUESTS, fast):
        assert generation.text == naive_unite(pair(), [bpe_model, sp_model], request, 5, primary)
    assert 5 <= method.info()["tokens_manipulated_per_step"] <= 10
