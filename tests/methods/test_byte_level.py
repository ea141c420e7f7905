"""Byte-level exact ensembling: hand-checked covering trees, fast == a naive reference that
re-tokenises every prefix and re-runs every forward (generation and byte-by-byte scoring), scoring
edge cases, parameters (identity, batch invariance and Ray: tests/methods/test_method_contract.py)."""

import math
from contextlib import contextmanager

import pytest
import torch
from pydantic import ValidationError

from ensemble_bench.decoding.stopping import cut_at_until
from ensemble_bench.errors import UserError
from ensemble_bench.members import LocalMember, Prompt
from ensemble_bench.methods import GenerationRequest, LoglikelihoodRequest
from ensemble_bench.methods.byte_level import ByteLevel, ByteLevelParams
from ensemble_bench.vocab.covering import END, SortedVocab, branch_at, next_byte_distribution
from ensemble_bench.vocab.retokenize import CanonicalTail, continuation_encoder
from tests.naive import naive_byte_level, naive_byte_score, naive_next_byte
from tests.tiny import CORPUS, REQUESTS
from tests.tolerances import FLOAT32_SUMS, TINY_MODEL, assert_close

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
    assert_close(float(dist[ord("b")]), 0.44 / total, FLOAT32_SUMS)
    assert_close(float(dist[END]), 0.01 / total, FLOAT32_SUMS)
    assert float(dist.sum()) == pytest.approx(1.0)
    # x = "ab": the root keeps {ab, abc} at depth 2 (only "abc" goes on); branch [a] keeps {b, bc}
    assert grown.grow(vocab, b"ab").width == 2 and after.grow(vocab, b"b").width == 2


def test_a_branch_dies_when_no_token_extends_it():
    vocab = SortedVocab(PIECES, frozenset({6}))
    root = branch_at(vocab, 0.0, torch.full((8,), 1 / 8).log(), [6])
    assert root.grow(vocab, b"c").width == 1
    assert root.grow(vocab, b"c").grow(vocab, b"ca") is None


# ------------------------------------------------------------------ covering-tree statistics
def test_covering_tree_statistics_are_reported(bpe_tokenizer, bpe_model):
    alone = ByteLevel([LocalMember(bpe_model, bpe_tokenizer, "solo")], ByteLevelParams(), batch_size=3)
    alone.generate(REQUESTS)
    info = alone.info()[alone.name]
    assert info["covering_tree_branches_mean"] >= 1 and info["covering_tree_branches_max"] >= 2



# ------------------------------------------------------------------ fast == the naive reference (tests/naive.py)
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
SCORED = [LoglikelihoodRequest(Prompt(text="Question: 12 plus 30?\nAnswer:"), " 42"),
          LoglikelihoodRequest(Prompt(text=CORPUS[0][:23]), CORPUS[0][23:41]),
          LoglikelihoodRequest(Prompt(text="Caf\u00e9 "), "cr\u00e8me br\u00fbl\u00e9e"),  # moved space, 2-byte chars
          LoglikelihoodRequest(Prompt(text=CORPUS[1][:15].rstrip()), ""),
          LoglikelihoodRequest(Prompt(text=""), CORPUS[2][:9])]


@pytest.mark.parametrize("order,weights", [((0, 1), [1.0, 1.0]), ((1, 0), [1.0, 3.0]), ((1,), [1.0])])
def test_loglikelihood_byte_by_byte_equals_naive_reference(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, order,
                                                          weights):
    both = [(bpe_tokenizer, bpe_model), (sp_tokenizer, sp_model)]
    chosen = [both[i] for i in order]
    members = [LocalMember(model, tok, f"m{i}") for i, (tok, model) in enumerate(chosen)]
    fast = ByteLevel(members, ByteLevelParams(weights=weights), batch_size=3).loglikelihood(SCORED)
    for request, score in zip(SCORED, fast):
        logprob, greedy = naive_byte_score(members, [model for _, model in chosen], request.prompt.text,
                                           request.continuation, weights)
        assert_close(score.logprob, logprob, TINY_MODEL)
        assert score.is_greedy == greedy
    assert fast[3].logprob == 0.0 and fast[3].is_greedy
    assert fast[2].logprob < -600  # these tiny vocabularies split e-grave into byte tokens: q = 0 there


def test_scoring_edge_cases_are_batch_invariant(pair):
    """A moved space, two-byte characters, an empty continuation, an empty context (the contract's
    batch test scores plain continuations only)."""
    def run(batch_size):
        members = pair()
        return ByteLevel(members, ByteLevelParams(weights=[2.0, 1.0]), batch_size=batch_size).loglikelihood(SCORED)
    one, two, five = run(1), run(2), run(5)
    for a, b, c in zip(one, two, five):
        assert_close([a.logprob, c.logprob], [b.logprob, b.logprob], TINY_MODEL)
        assert a.is_greedy == b.is_greedy == c.is_greedy


def test_is_greedy_when_the_continuation_is_the_greedy_generation(pair):
    method = ByteLevel(pair(), ByteLevelParams(weights=[1.0, 2.0]))
    prompt = Prompt(text="Question: 12 plus 30?\nAnswer:")
    [generation] = method.generate([GenerationRequest(prompt, (), 4)])
    text = generation.text
    assert text
    greedy, other = method.loglikelihood([LoglikelihoodRequest(prompt, text),
                                          LoglikelihoodRequest(prompt, text[:-1] + ("b" if text[-1] != "b" else "c"))])
    assert greedy.is_greedy and not other.is_greedy
    assert greedy.logprob > other.logprob


@pytest.mark.parametrize("batch_size", [1, 4])
def test_single_member_score_is_its_exact_byte_level_probability(bpe_tokenizer, bpe_model, batch_size):
    """One member: the product of its next-byte conditionals, i.e. the ratio of its byte-level
    probabilities of context + continuation prefixes (each a normalised covering-tree mass)."""
    member = LocalMember(bpe_model, bpe_tokenizer, "a")
    tail = CanonicalTail.from_view(member.vocab, continuation_encoder(
        lambda t: member.encode(t, add_special_tokens=False)))
    request = SCORED[1]
    forced = request.continuation.encode()
    prompt = member.encode(request.prompt.text)
    probs = [naive_next_byte(member, bpe_model, prompt, tail, forced[:i])[byte] for i, byte in enumerate(forced)]
    whole = ByteLevel([member], ByteLevelParams(), batch_size=batch_size).loglikelihood([request])[0].logprob
    halves = ByteLevel([member], ByteLevelParams(), batch_size=batch_size).loglikelihood(
        [request, LoglikelihoodRequest(request.prompt, request.continuation[:7])])
    assert_close(whole, sum(math.log(p) for p in probs), TINY_MODEL)
    # log P(cont[:7] | ctx) is the first part of the sum: the chain rule holds byte by byte
    assert_close(halves[1].logprob, sum(math.log(p) for p in probs[:7]), TINY_MODEL)


@pytest.mark.parametrize("fields", [{"weights": []}, {"main": 1.5}, {"extra": 1}, {"weights": "equal"}])
def test_bad_parameters_are_rejected(fields):
    with pytest.raises(ValidationError):
        ByteLevelParams(**fields)


@pytest.mark.parametrize("fields,message", [({"main": "nobody"}, "main"), ({"main": 3}, "out of range"),
                                            ({"weights": [1.0]}, "expected 2"), ({"weights": [-1.0, 2.0]}, ">= 0")])
def test_member_dependent_parameters_are_one_line_errors(fields, message):
    with pytest.raises(UserError, match=message):
        ByteLevel.check_members(ByteLevelParams(**fields), ["a", "b"])


# ------------------------------------------------------------------ members without a live branch
NIHON_TOKEN = "\u0120\u00e6\u0139\u00a5\u00e6\u013e\u00ac"  # " \u65e5\u672c" in byte-level BPE spelling


@pytest.fixture(scope="module")
def nihon_member():
    """A byte-level BPE member with one token for " \u65e5\u672c" (the tiny ones spell it in byte tokens)."""
    from tests import tiny

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tiny, "CORPUS", tiny.CORPUS + [" \u65e5\u672c" * 60])
        tokenizer = tiny.byte_bpe_tokenizer()
    assert tokenizer.encode(" \u65e5\u672c") == [tokenizer.convert_tokens_to_ids(NIHON_TOKEN)]
    return tokenizer, tiny.tiny_llama(len(tokenizer), seed=3)


@contextmanager
def favouring(model, tokenizer, token: str, bias: float = 30.0):
    """The model's logit of ``token`` raised by ``bias`` while inside."""
    boost = torch.zeros(model.lm_head.out_features)
    boost[tokenizer.convert_tokens_to_ids(token)] = bias
    hook = model.lm_head.register_forward_hook(lambda module, inputs, out: out + boost.to(out.dtype))
    try:
        yield
    finally:
        hook.remove()


START = [GenerationRequest(Prompt(text="The quick"), (), 6), GenerationRequest(Prompt(text="def add"), (), 4)]


@pytest.mark.parametrize("chosen", [(0,), (0, 1)])
def test_generation_stops_where_no_member_has_a_live_branch(pair, bpe_tokenizer, bpe_model, sp_tokenizer, sp_model,
                                                            chosen):
    """Both members led to the first byte of a 3-byte character (U+9xxx) they spell only in byte tokens:
    no branch is live at its second byte, so every row stops there (no IndexError, no NaN byte)."""
    both = pair()
    with favouring(bpe_model, bpe_tokenizer, "\u00e9"), favouring(sp_model, sp_tokenizer, "<0xE9>"):
        generations = ByteLevel([both[i] for i in chosen], ByteLevelParams(), batch_size=2).generate(START)
    assert [(g.text, g.finish) for g in generations] == [("\ufffd", "no_continuation")] * 2


def test_generation_goes_on_with_the_member_that_has_a_live_branch(nihon_member, bpe_tokenizer, bpe_model):
    """The BPE member has no live branch inside the character; the one that spells it writes it."""
    tokenizer, model = nihon_member
    members = [LocalMember(model, tokenizer, "nihon"), LocalMember(bpe_model, bpe_tokenizer, "bpe")]
    with favouring(model, tokenizer, NIHON_TOKEN), \
            favouring(bpe_model, bpe_tokenizer, "\u00e6"):
        generations = ByteLevel(members, ByteLevelParams(weights=[2.0, 1.0]), batch_size=2).generate(START)
    for generation in generations:
        assert generation.text.startswith(" \u65e5\u672c") and generation.finish != "no_continuation"
