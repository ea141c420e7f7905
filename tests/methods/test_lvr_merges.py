"""LVR's maximal common vocabulary under the members' BPE merges (vocab/common.py, ``vocabulary: merges``).

V is test_lvr.py's vocabulary, here with BPE merges; W a second BPE vocabulary. Their shared tokens
are {a, b, c, ab, bc, cab}; V builds "cab" from "ca" + "b" and "ca" is not in W, so a BPE restricted
to the shared tokens cannot build "cab" for V: the maximal common vocabulary is {a, ab, b, bc, c}.
V's "abc" is re-tokenised by V's own BPE restricted to it, which merges "b c" first (rank 0): "a" "bc",
where the longest common token first would give "ab" "c". The exactness identity of test_lvr.py holds
for this nesting too (it holds for any per-token spelling whose trunks are checked), and fails when
the covers across boundaries are cut.
"""

from __future__ import annotations

import math

import pytest

from ensemble_bench.methods.lvr import Lvr, LvrParams
from ensemble_bench.vocab.common import BpeSpeller, CommonSpeller, common_vocabulary, member_merges
from tests import tiny
from tests.methods.test_lvr import PIECES, STOP, TableModel, V, pair, reduced_logprob  # noqa: F401 (fixture)
from tests.tolerances import FLOAT32_SUMS, assert_close

V_MERGES = [(b"b", b"c"), (b"a", b"b"), (b"c", b"a"), (b"a", b"bc"), (b"ca", b"b")]
W = [b"a", b"b", b"c", b"ab", b"bc", b"cab"]
W_MERGES = [(b"a", b"b"), (b"b", b"c"), (b"c", b"ab")]


class MergeNesting:
    """test_lvr's speller interface (common, nested, spells) with V's restricted BPE as dec."""

    def __init__(self, common: list[bytes]):
        self.maxmatch = CommonSpeller(common)
        self.common = self.maxmatch.common
        self.nested = BpeSpeller(self.maxmatch, V_MERGES).nested
        self.spells = self.maxmatch.spells


@pytest.fixture(scope="module")
def common():
    return common_vocabulary([PIECES, W], [frozenset({STOP}), frozenset()], [V_MERGES, W_MERGES])


def test_a_shared_token_no_restricted_merge_builds_is_left_out(common):
    assert common == [b"a", b"ab", b"b", b"bc", b"c"]
    assert b"cab" in common_vocabulary([PIECES, W], [frozenset({STOP}), frozenset()])  # the plain intersection


def test_each_token_is_re_tokenised_by_its_members_restricted_bpe(common):
    speller = CommonSpeller(common)
    spelled = BpeSpeller(speller, V_MERGES).nested(PIECES, frozenset({STOP}))
    words = [None if s is None else [common[i] for i in s] for s in spelled]
    assert words[V.index(b"abc")] == [b"a", b"bc"] and words[V.index(b"cab")] == [b"c", b"ab"]
    assert words[V.index(b"ca")] == [b"c", b"a"] and words[STOP] is None
    assert [common[i] for i in speller.spell(b"abc")] == [b"ab", b"c"]  # longest first differs


def test_a_token_whose_base_symbol_is_not_common_is_not_spelled():
    speller = BpeSpeller(CommonSpeller([b"a", b"b"]), [(b"a", b"b"), (b"b", b"a"), (b"ab", b"c")])
    assert speller.spell(b"abc") is None and speller.spell(b"ba") == (1, 0)


def test_reduced_model_under_merge_nesting_gives_every_text_the_models_probability(common):
    model, nesting = TableModel(seed=1), MergeNesting(common)
    for text, p in model.p_text.items():
        assert_close(math.exp(reduced_logprob(model, nesting, text)), p, FLOAT32_SUMS, what=text)
    wrong = [text for text, p in model.p_text.items()
             if abs(math.exp(reduced_logprob(model, nesting, text, newest_only=True)) / p - 1) > 1e-3]
    assert wrong


def test_tiny_members_reduce_to_a_merge_closed_vocabulary(pair):  # noqa: F811
    merged, plain = Lvr(pair, LvrParams(), batch_size=2), Lvr(pair, LvrParams(vocabulary="intersection"))
    assert all(m.vocab.merges for m in pair)
    assert set(merged.speller.common) < set(plain.speller.common)
    for member, spellings in zip(pair, merged.spellings):
        for piece, spelled in zip(member.vocab.pieces, spellings):
            assert spelled is None or b"".join(merged.speller.common[s] for s in spelled) == piece
    assert len(tiny.outputs(merged)) > 0 and merged.info()["lvr"]["common_vocabulary"] == len(merged.speller.common)


def test_member_merges_reads_ids_as_bytes():
    assert member_merges([b"a", b"b", b"ab", None], [(0, 1, 2), (0, 3, 2)]) == [(b"a", b"b")]


def test_a_continuation_is_forced_as_the_leads_nested_canonical_tokens(pair):  # noqa: F811
    from ensemble_bench.members import Prompt
    from ensemble_bench.methods import LoglikelihoodRequest

    method, lead = Lvr(pair, LvrParams(), batch_size=2), pair[0]
    text = " Answer: 42.answer"  # the lead writes "a" "nswer"; longest common token first: "an" "s" "wer"
    ids = lead.encode(text, add_special_tokens=False)
    nested = tuple(s for token in ids for s in method.spellings[0][token])
    assert method._forced(text.encode()) == nested != method.speller.spell(text.encode())
    scores = method.loglikelihood([LoglikelihoodRequest(Prompt(text="Question: a fox?\nAnswer:"), text)])
    assert -1e9 < scores[0].logprob < 0
