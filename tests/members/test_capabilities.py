"""A member's optional capabilities (block reads, scoring, embeddings: members/base.py) are declared, and
the methods that need one check the declaration before any call: a member without it is refused in one
line that names the member and what needs it. What the decode loop calls stays abstract."""

import pytest

from ensemble_bench.errors import UserError, lines_of
from ensemble_bench.members.base import BLOCK_READS, EMBEDDINGS, SCORING, Member
from ensemble_bench.members.local import LocalMember
from ensemble_bench.methods import get_method, method_spec


class ScoringOnly(LocalMember):
    """A local member that declares scoring alone (as a backend without block reads or embeddings would)."""

    capabilities = frozenset({SCORING})


def build(name, members, **params):
    return get_method(name)(members, method_spec(name).Params.model_validate(params))


def test_the_decode_loop_calls_are_what_stays_abstract():
    assert sorted(Member.__abstractmethods__) == ["crop", "decode", "encode", "extend", "extend_scored", "keep",
                                                  "prefill", "render_text", "row_ids", "word_starts"]


def test_every_member_kind_declares_its_capabilities():
    from ensemble_bench.members.remote import RemoteMember
    from ensemble_bench.members.seq2seq import Seq2SeqMember
    from ensemble_bench.members.vllm import VllmMember

    for kind in (LocalMember, Seq2SeqMember, VllmMember, RemoteMember):
        assert kind.capabilities == {BLOCK_READS, SCORING, EMBEDDINGS}, kind


@pytest.mark.parametrize("method, params, needs", [
    ("deepen", {}, "deepen (its relative representations) needs members that give their embedding matrices"),
    ("gac", {"speculative": 4}, "gac: speculative: 4 needs members that read a block of tokens in one forward pass"),
    ("safe", {}, "safe (its verifier reads each draft in one pass) needs members that read a block of tokens"),
])
def test_a_method_refuses_a_member_without_what_it_needs(bpe_model, bpe_tokenizer, method, params, needs):
    members = [LocalMember(bpe_model, bpe_tokenizer, "a"), ScoringOnly(bpe_model, bpe_tokenizer, "b")]
    with pytest.raises(UserError) as info:
        build(method, members, **params)
    [line] = lines_of(info.value)
    assert line.startswith(needs) and line.endswith("member 'b' (ScoringOnly) does not"), line


def test_the_same_members_with_it_build(bpe_model, bpe_tokenizer):
    members = [LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(bpe_model, bpe_tokenizer, "b")]
    assert build("gac", members, speculative=4).speculation is not None
