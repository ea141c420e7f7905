"""GaC: hand-checked union maths, thresholds, seeded sampling, and fast == a naive uncached Eq. 3/5
(identity, batch invariance and Ray: tests/methods/test_method_contract.py)."""

import math

import pytest
import torch

from ensemble_bench.decoding.feeding import member_continuation
from ensemble_bench.members import LocalMember, Prompt
from ensemble_bench.methods import LoglikelihoodRequest
from ensemble_bench.methods.gac import Gac, GacParams
from ensemble_bench.methods.single import Single
from ensemble_bench.vocab import VocabView
from ensemble_bench.vocab.append import TextAppender, single_byte_ids
from ensemble_bench.vocab.union import STOP_KEY, build_union
from tests.naive import naive_gac
from tests.tiny import REQUESTS, outputs, sampled
from tests.tolerances import TINY_MODEL, assert_close


# ------------------------------------------------------------------ hand-checked union maths
def test_union_by_bytes_hand_checked():
    # A: byte-level style. id 4 is a partial UTF-8 piece (first byte of 'é'), id 6 a padded head row.
    a = VocabView((b"<|im_end|>", b" James", b"a", b"es", b"\xc3", b"\xa9", None), frozenset({0}), "byte-level")
    # B: SentencePiece style. ' James' is two ids (' Jam' + 'es'); id 4 is the byte-fallback <0xC3>;
    # ids 1 and 5 both spell ' Jam' (a duplicate inside one vocabulary); id 6 is <unk>, special.
    b = VocabView((b"</s>", b" Jam", b"es", b"a", b"\xc3", b" Jam", b"<unk>"), frozenset({0, 6}), "sentencepiece")
    union = build_union([a, b], [[0], [0]])
    assert set(union.entries) == {STOP_KEY + b"<|im_end|>", STOP_KEY + b"</s>", b" James", b"a", b"es",
                                  b"\xc3", b"\xa9", b" Jam"}
    assert union.size == 8 and int(union.stop_mask.sum()) == 2
    at = {e: k for k, e in enumerate(union.entries)}
    pa = torch.tensor([[0.05, 0.40, 0.10, 0.05, 0.20, 0.20, 0.00]])
    pb = torch.tensor([[0.10, 0.25, 0.05, 0.10, 0.20, 0.25, 0.05]])
    qa, qb = union.maps[0].project(pa, union.size), union.maps[1].project(pb, union.size)
    assert qb[0, at[b" Jam"]] == pytest.approx(0.50)  # duplicates add up
    assert qb.sum() == pytest.approx(0.95)             # <unk> (special, not a stop) maps nowhere
    mixed = (qa + qb) / 2                               # Eq. 3, average
    expected = {b" James": 0.20, b" Jam": 0.25, b"a": 0.10, b"es": 0.05, b"\xc3": 0.20, b"\xa9": 0.10,
                STOP_KEY + b"<|im_end|>": 0.025, STOP_KEY + b"</s>": 0.05}
    for entry, value in expected.items():
        assert float(mixed[0, at[entry]]) == pytest.approx(value), entry
    assert union.entries[int(mixed.argmax())] == b" Jam"
    weighted = (1 * qa + 3 * qb) / 4                    # Sec. 4.3 weights
    assert float(weighted[0, at[b" James"]]) == pytest.approx(0.10)
    assert int(union.maps[1].to_member[at[b" Jam"]]) == 1  # lowest id among duplicates
    assert int(union.maps[0].to_member[at[b" Jam"]]) == -1


def test_appending_bytes_to_a_member_hand_checked(bpe_tokenizer, bpe_model):
    member = LocalMember(bpe_model, bpe_tokenizer, "bpe")
    union = build_union([member.vocab], [sorted(member.stop_ids)])
    appender = TextAppender(member.vocab.pieces, union.maps[0].by_bytes,
                            single_byte_ids(member.vocab.pieces, member.vocab.special_ids),
                            member_continuation(member), window=4)
    caf = member.encode("Caf", add_special_tokens=False)
    # bytes that are exactly one of the member's tokens: that token, nothing re-tokenised
    first = appender.plan(caf, b"\xc3")  # half of 'é' (a partial UTF-8 byte-level piece)
    assert first.drop == 0 and first.ids == (union.maps[0].by_bytes[b"\xc3"],)
    # bytes that are not one token: the window is re-encoded and replaced where it parts
    tail = caf + list(first.ids)
    second = appender.plan(tail, b"\xa9 is")
    rebuilt = tail[:len(tail) - second.drop] + list(second.ids)
    assert second.drop > 0
    assert rebuilt == member.encode("Café is", add_special_tokens=False)
    # a word that is one id in A and two ids in B
    sp_like = appender.encode_bytes(b" James went")
    assert member.vocab.join(sp_like) == b" James went"


# ------------------------------------------------------------------ generation invariants
def test_threshold_one_ensembles_every_token_and_zero_none(pair, bpe_tokenizer, bpe_model):
    def gated(threshold):
        return Gac(pair(),
                   GacParams(threshold=threshold, gate=0), batch_size=2)
    everything = gated(1.0)
    everything.generate(REQUESTS)
    assert everything.stats.ensembled == everything.stats.steps > 0
    ungated = Gac(pair(),
                  GacParams(), batch_size=2)
    assert outputs(everything) == outputs(ungated)
    nothing = gated(0.0)
    alone = outputs(Single([LocalMember(bpe_model, bpe_tokenizer, "solo")], Single.Params(), batch_size=2))
    assert outputs(nothing) == alone
    assert nothing.stats.ensembled == 0


# ------------------------------------------------------------------ fast == the naive reference (tests/naive.py)
@pytest.mark.parametrize("gated", [False, True])
def test_cached_batched_path_equals_naive_reference(pair, bpe_model, sp_model, gated):
    members = pair()
    params = GacParams(weights=[1.0, 1.5], threshold=0.2, gate=1) if gated else GacParams(weights=[1.0, 1.5])
    fast = Gac(members, params, batch_size=3).generate(REQUESTS)
    reference_members = pair()
    for request, generation in zip(REQUESTS, fast):
        slow = naive_gac(reference_members, [bpe_model, sp_model], request, [1.0, 1.5],
                         gate=1 if gated else None, threshold=0.2)
        from ensemble_bench.decoding.stopping import cut_at_until
        assert generation.text == cut_at_until(slow, request.until)


def test_loglikelihood_is_weighted_average_of_sequence_probabilities(pair):
    a, b = pair()
    gac = Gac([a, b], GacParams(weights=[1.0, 3.0]))
    request = LoglikelihoodRequest(Prompt(text="Question: 12 plus 30?\nAnswer:"), " 42")
    [score] = gac.loglikelihood([request])
    la = a.score([a.encode_pair(request.prompt.text, request.continuation)])[0].logprob
    lb = b.score([b.encode_pair(request.prompt.text, request.continuation)])[0].logprob
    assert_close(score.logprob, math.log((math.exp(la) + 3 * math.exp(lb)) / 4), TINY_MODEL)


def test_sampling_is_seeded_and_batch_invariant(pair):
    def run(seed, batch_size):
        members = pair()
        return outputs(Gac(members, GacParams(), batch_size=batch_size), sampled(seed=seed))
    first = run(7, 3)
    assert run(7, 3) == first and run(7, 1) == first
    assert run(8, 3) != first != outputs(Gac(pair(), GacParams(), batch_size=3))  # not the greedy texts
