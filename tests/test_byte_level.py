"""Byte-level exact ensembling: hand-checked covering trees, identity, batch invariance, fast == a
naive reference that re-tokenises every prefix and re-runs every forward, parameters, Ray."""

import logging
import math

import pytest
import torch
from pydantic import ValidationError

from ensemble_bench.errors import UserError
from ensemble_bench.members import LocalMember, Prompt
from ensemble_bench.methods import GenerationRequest, LoglikelihoodRequest
from ensemble_bench.methods.byte_level import ByteLevel, ByteLevelParams
from ensemble_bench.methods.stopping import cut_at_until
from ensemble_bench.vocab.covering import END, SortedVocab, branch_at, next_byte_distribution
from ensemble_bench.vocab.retokenize import CanonicalTail, continuation_encoder
from tests.tiny import CORPUS, outputs


# ------------------------------------------------------------------ hand-checked covering tree
PIECES = (b"a", b"b", b"ab", b"abc", b"bc", None, b"<s>", b"c")  # id 6 special, id 5 padded head row


def test_sorted_vocab_ranges_narrow_byte_by_byte():
    vocab = SortedVocab(PIECES, frozenset({6}))
    assert vocab.pieces == [b"a", b"ab", b"abc", b"b", b"bc", b"c"]
    assert vocab.order.tolist() == [0, 2, 3, 1, 4, 7]
    assert vocab.narrow(0, 6, b"a") == (0, 3)
    assert vocab.narrow(0, 3, b"ab") == (1, 3)
    assert vocab.narrow(1, 3, b"abc") == (2, 3)
    assert vocab.narrow(2, 3, b"abcd") == (3, 3)
    assert vocab.narrow(0, 6, b"\xff") == (6, 6)


def test_next_byte_distribution_hand_checked():
    vocab = SortedVocab(PIECES, frozenset({6}))
    #            a     b     ab    abc   bc    pad   <s>   c
    p0 = torch.tensor([0.10, 0.20, 0.30, 0.05, 0.05, 0.0, 0.25, 0.05]).log()
    root = branch_at(vocab, 0.0, p0, [6])  # <s> is the stop here
    mass = root.next_byte_mass(vocab)
    assert mass[ord("a")] == pytest.approx(0.45) and mass[ord("b")] == pytest.approx(0.25)
    assert mass[ord("c")] == pytest.approx(0.05) and mass[END] == pytest.approx(0.25)
    # x = "a": the root narrows to {a, ab, abc}; a new branch opens after c_1 = [a] with P(c_1) = 0.1
    grown = root.grow(vocab, b"a")
    assert (grown.lo, grown.hi, grown.depth) == (0, 3, 1)
    p1 = torch.tensor([0.0, 0.5, 0.0, 0.0, 0.4, 0.0, 0.1, 0.0]).clamp(min=1e-30).log()
    after = branch_at(vocab, math.log(0.1), p1, [6])
    dist = next_byte_distribution(vocab, [grown, after])
    # M(b | a) = 1.0 * (p0[ab] + p0[abc]) + 0.1 * (p1[b] + p1[bc]) = 0.35 + 0.09; M(end | a) = 0.1 * 0.1
    total = 0.35 + 0.09 + 0.01
    assert float(dist[ord("b")]) == pytest.approx(0.44 / total, rel=1e-5)
    assert float(dist[END]) == pytest.approx(0.01 / total, rel=1e-5)
    assert float(dist.sum()) == pytest.approx(1.0)
    # x = "ab": the root keeps {ab, abc} at depth 2 (only "abc" goes on); branch [a] keeps {b, bc}
    assert grown.grow(vocab, b"ab").width == 2 and after.grow(vocab, b"b").width == 2


def test_a_branch_dies_when_no_token_extends_it():
    vocab = SortedVocab(PIECES, frozenset({6}))
    root = branch_at(vocab, 0.0, torch.full((8,), 1 / 8).log(), [6])
    assert root.grow(vocab, b"c").width == 1
    assert root.grow(vocab, b"c").grow(vocab, b"ca") is None


# ------------------------------------------------------------------ invariants
@pytest.mark.parametrize("batch_size", [1, 3])
def test_member_with_itself_is_the_member_alone(same_model, batch_size):
    alone = ByteLevel([same_model("solo")], ByteLevelParams(), batch_size=batch_size)
    expected = outputs(alone)
    assert outputs(ByteLevel([same_model("a"), same_model("b")], ByteLevelParams(), batch_size=batch_size)) == expected
    assert outputs(ByteLevel([same_model("a"), same_model("b")], ByteLevelParams(weights=[1.0, 4.0], main=1),
                             batch_size=batch_size)) == expected
    info = alone.info()
    assert info["covering_tree_branches_mean"] >= 1 and info["covering_tree_branches_max"] >= 2


def pair(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    return [LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(sp_model, sp_tokenizer, "b")]


def test_batch_invariance(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    def run(batch_size):
        members = pair(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model)
        return outputs(ByteLevel(members, ByteLevelParams(weights=[2.0, 1.0]), batch_size=batch_size))
    assert run(1) == run(2) == run(5)


# ------------------------------------------------------------------ naive reference implementation
def naive_next_byte(member, model, prompt, tail, x):
    """M(. | x) of one member: every j, c_j re-encoded from scratch, one full forward per branch, a
    Python loop over the vocabulary."""
    terms = []
    for j in range(len(x) + 1):
        suffix = x[j:]
        ids, pending = tail.canonical(x[:j])
        if pending or not any(p and p.startswith(suffix) for p in member.vocab.pieces):
            continue
        with torch.no_grad():
            logprobs = model(torch.tensor([prompt + ids])).logits[0].double().log_softmax(-1)
        trunk = sum(float(logprobs[len(prompt) - 1 + q, token]) for q, token in enumerate(ids))
        probs = logprobs[-1].exp().tolist()
        mass = [0.0] * 257
        for token, piece in enumerate(member.vocab.pieces):
            if piece and token not in member.vocab.special_ids and token not in member.stop_ids \
                    and len(piece) > len(suffix) and piece.startswith(suffix):
                mass[piece[len(suffix)]] += probs[token]
        if j == len(x):
            mass[256] = sum(probs[s] for s in member.stop_ids)
        terms.append((trunk, mass))
    top = max(t for t, _ in terms)
    total = [sum(math.exp(t - top) * m[b] for t, m in terms) for b in range(257)]
    return [v / sum(total) for v in total]


def naive_byte_level(members, models, request, weights, main=0):
    tails = [CanonicalTail.from_view(m.vocab, continuation_encoder(lambda t, m=m: m.encode(t, add_special_tokens=False)))
             for m in members]
    prompts = [m.render(request.prompt) for m in members]
    x, budget = b"", 0
    while True:
        dists = [naive_next_byte(m, model, p, tail, x) for m, model, p, tail in zip(members, models, prompts, tails)]
        mixed = [sum(w * d[b] for w, d in zip(weights, dists)) / sum(weights) for b in range(257)]
        byte = max(range(257), key=lambda b: (mixed[b], -b))
        if byte == 256:
            break
        x += bytes([byte])
        budget = max(budget, len(tails[main].canonical(x)[0]))
        text = x.decode("utf-8", "replace")
        if any(u in text for u in request.until) or budget >= request.max_new_tokens:
            break
    text = x.decode("utf-8", "replace")
    return text[1:] if members[main].vocab.strips_leading_space and text.startswith(" ") else text


SHORT = [GenerationRequest(Prompt(text=CORPUS[i][:10 + 7 * i]), ("@@",) if i % 2 else ("\n\n",), 3 + i)
         for i in range(3)]


@pytest.mark.parametrize("order,weights", [((0, 1), [1.0, 1.0]), ((1, 0), [1.0, 3.0]), ((1,), [1.0])])
def test_cached_batched_path_equals_naive_reference(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, order, weights):
    both = [(bpe_tokenizer, bpe_model), (sp_tokenizer, sp_model)]
    chosen = [both[i] for i in order]
    members = [LocalMember(model, tok, f"m{i}") for i, (tok, model) in enumerate(chosen)]
    fast = ByteLevel(members, ByteLevelParams(weights=weights), batch_size=3).generate(SHORT)
    for request, generation in zip(SHORT, fast):
        slow = naive_byte_level(members, [model for _, model in chosen], request, weights)
        assert generation.text == cut_at_until(slow, request.until)


# ------------------------------------------------------------------ scoring, parameters
def test_loglikelihood_is_the_weighted_average_of_sequence_probabilities(bpe_tokenizer, bpe_model, sp_tokenizer,
                                                                         sp_model):
    a, b = pair(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model)
    request = LoglikelihoodRequest(Prompt(text="Question: 12 plus 30?\nAnswer:"), " 42")
    la = a.score([a.encode_pair(request.prompt.text, request.continuation)])[0].logprob
    lb = b.score([b.encode_pair(request.prompt.text, request.continuation)])[0].logprob
    [score] = ByteLevel([a, b], ByteLevelParams(weights=[1.0, 3.0])).loglikelihood([request])
    assert score.logprob == pytest.approx(math.log((math.exp(la) + 3 * math.exp(lb)) / 4), abs=1e-5)


@pytest.mark.parametrize("fields", [{"weights": []}, {"main": 1.5}, {"extra": 1}, {"weights": "equal"}])
def test_bad_parameters_are_rejected(fields):
    with pytest.raises(ValidationError):
        ByteLevelParams(**fields)


@pytest.mark.parametrize("fields,message", [({"main": "nobody"}, "main"), ({"main": 3}, "out of range"),
                                            ({"weights": [1.0]}, "expected 2"), ({"weights": [-1.0, 2.0]}, ">= 0")])
def test_member_dependent_parameters_are_one_line_errors(fields, message):
    with pytest.raises(UserError, match=message):
        ByteLevel.check_members(ByteLevelParams(**fields), ["a", "b"])


# ------------------------------------------------------------------ Ray placement
def test_remote_members_give_the_same_generations(tiny_dirs):
    ray = pytest.importorskip("ray")
    from ensemble_bench.members import load_member
    from ensemble_bench.members.remote import RemoteMember, launch

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    try:
        loads = [{"model": path, "name": name} for path, name in zip(tiny_dirs, ("bpe", "sp"))]
        remote = [RemoteMember(load, actor=launch(load, {"num_cpus": 1})) for load in loads]
        local = [load_member(**load) for load in loads]
        fast, slow = ByteLevel(remote, ByteLevelParams(), 2), ByteLevel(local, ByteLevelParams(), 2)
        assert outputs(fast, SHORT) == outputs(slow, SHORT)
        assert fast.stats == slow.stats
        for member in remote:
            member.close()
    finally:
        ray.shutdown()
