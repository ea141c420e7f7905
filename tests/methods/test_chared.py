"""CharED: hand-checked byte marginals, fast == a naive uncached reference, characters per token,
scoring, parameter errors (identity, batch invariance and Ray: tests/methods/test_method_contract.py)."""

import math

import pytest
import torch
from pydantic import ValidationError

from ensemble_bench.decoding.stopping import cut_at_until
from ensemble_bench.errors import UserError
from ensemble_bench.members import Prompt
from ensemble_bench.methods import METHODS, LoglikelihoodRequest
from ensemble_bench.methods.chared import CharED, CharEDParams, grow_piece, member_readers
from ensemble_bench.vocab.covering import SortedVocab
from tests.naive import naive_chared
from tests.tiny import REQUESTS
from tests.tolerances import TINY_MODEL, assert_close


# ------------------------------------------------------------------ hand-checked marginals
def fake(pieces, probs):
    """A reader of one row of next-token probs over ``pieces`` (id 0 is the member's stop token)."""
    vocab = SortedVocab(tuple(pieces), frozenset({0}))
    [reader] = member_readers(vocab, [0], torch.tensor([probs]).log())
    return reader


def test_one_member_grows_its_most_probable_first_byte_not_its_most_probable_token():
    a = fake([b"<eos>", b"ab", b"ac", b"d", b"a"], [0.05, 0.30, 0.30, 0.35, 0.0])
    # 'a' holds .6 against 'd' .35; after 'a': 'b' .5 = 'c' .5 (ties: the lower byte); after 'ab': ends
    assert grow_piece([a], [1.0]) == b"ab"
    stop = fake([b"<eos>", b"ab", b"d"], [0.6, 0.3, 0.1])
    assert grow_piece([stop], [1.0]) is None  # at s = "" ending is the stop token


def test_two_members_average_their_conditional_marginals():
    a = fake([b"<eos>", b"ab", b"ac", b"d", b"a"], [0.05, 0.30, 0.30, 0.35, 0.0])
    b = fake([b"</s>", b"a", b"d", b"ac"], [0.0, 0.5, 0.1, 0.4])
    # s = "": a (.6 + .9)/2. s = "a": A ends 0, b .5, c .5; B ends .5/.9, c .4/.9 -> c .472 beats end .278
    assert grow_piece([a, b], [0.5, 0.5]) == b"ac"


def test_a_member_with_no_token_continuing_the_piece_votes_to_end_it():
    a = fake([b"<eos>", b"abc", b"x"], [0.0, 0.9, 0.1])
    c = fake([b"<eos>", b"a", b"x"], [0.0, 0.6, 0.4])
    assert grow_piece([a, c], [0.5, 0.5]) == b"a"    # s = "a": A says 'b' 1.0, C says end 1.0: a tie ends the piece
    assert grow_piece([a, c], [0.6, 0.4]) == b"abc"  # C has no token past 'a' and keeps voting end (.4)


def test_parameters_are_validated():
    with pytest.raises(ValidationError, match="weights must be >= 0"):
        CharEDParams(weights=[1.0, -1.0])
    with pytest.raises(UserError, match="expected 2 values"):
        CharED.check_members(CharEDParams(weights=[1.0]), ["a", "b"])
    with pytest.raises(ValidationError):
        CharEDParams(window=-1)
    assert METHODS["chared"] is CharED


# ------------------------------------------------------------------ fast == the naive reference (tests/naive.py)
def test_cached_batched_path_equals_naive_reference(pair, bpe_model, sp_model):
    fast = CharED(pair(), CharEDParams(weights=[1.0, 1.5]), batch_size=3).generate(REQUESTS)
    members = pair()
    for request, generation in zip(REQUESTS, fast):
        text, count = naive_chared(members, [bpe_model, sp_model], request, [0.4, 0.6])
        assert (generation.text, generation.new_tokens) == (cut_at_until(text, request.until), count)


def test_characters_per_token_reported(pair):
    method = CharED(pair(),
                    CharEDParams(), batch_size=3)
    one = method.generate(REQUESTS)
    info = method.info()[method.name]
    assert info["chared_steps"] == sum(g.new_tokens for g in one)
    assert info["chared_characters_per_token"] > 1.0  # a step's piece is a token of some member, mostly several bytes
    assert info["chared_characters_per_token"] <= info["chared_bytes_per_token"]


def test_loglikelihood_is_weighted_average_of_sequence_probabilities(pair):
    a, b = pair()
    request = LoglikelihoodRequest(Prompt(text="Question: 12 plus 30?\nAnswer:"), " 42")
    [score] = CharED([a, b], CharEDParams(weights=[1.0, 3.0])).loglikelihood([request])
    la = a.score([a.encode_pair(request.prompt.text, request.continuation)])[0].logprob
    lb = b.score([b.encode_pair(request.prompt.text, request.continuation)])[0].logprob
    assert_close(score.logprob, math.log((math.exp(la) + 3 * math.exp(lb)) / 4), TINY_MODEL)
