"""Byte-level exact ensembling: hand-checked covering trees, fast == a naive reference that
re-tokenises every prefix and re-runs every forward (generation and byte-by-byte scoring), scoring
edge cases, parameters (identity, batch invariance and Ray: tests/test_method_contract.py)."""

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
from tests.tiny import CORPUS, REQUESTS

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


# ------------------------------------------------------------------ covering-tree statistics
def test_covering_tree_statistics_are_reported(bpe_tokenizer, bpe_model):
    alone = ByteLevel([LocalMember(bpe_model, bpe_tokenizer, "solo")], ByteLevelParams(), batch_size=3)
    alone.generate(REQUESTS)
    info = alone.info()
    assert info["covering_tree_branches_mean"] >= 1 and info["covering_tree_branches_max"] >= 2


def pair(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    return [LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(sp_model, sp_tokenizer, "b")]


# ------------------------------------------------------------------ naive reference implementation
WHITE = b" \t\n\r\x0b\x0c"


def naive_probe(first: int) -> bytes:
    """The probe character of a first byte's class (vocab/lookahead.py): letters, digits, the rest."""
    if first >= 0x80 or bytes([first]).isalpha():
        return b"a"
    return b"0" if bytes([first]).isdigit() else b"!"


def naive_trunk(member, tail, text: bytes, first: int | None):
    """The trunk of the branch at the end of ``text`` for tokens starting with byte ``first`` (None:
    the end of the text), from scratch: c(text) unless text ends with whitespace and ``first`` is no
    whitespace; then the ids of encode(text + probe) that spell exactly ``text`` (None: none do)."""
    ids, _ = tail.canonical(text)
    if not text or text[-1] not in WHITE or first is None or first in WHITE:
        return tuple(ids)
    probed, _ = tail.canonical(text + naive_probe(first))
    spelled = 0
    for count, token in enumerate(probed + [None]):
        if spelled == len(text):
            return tuple(probed[:count])
        if token is None or spelled > len(text):
            return None
        spelled += len(member.vocab.pieces[token])
    return None


def naive_next_byte(member, model, prompt, tail, x):
    """M(. | x) of one member: every j and every trunk the tokens after x[:j] can have (one per
    first byte, naive_trunk), re-encoded from scratch, one full forward per trunk, a Python loop
    over the vocabulary."""
    terms = []
    for j in range(len(x) + 1):
        suffix = x[j:]
        if tail.canonical(x[:j])[1] or not any(p and p.startswith(suffix) for p in member.vocab.pieces):
            continue
        trunks: dict = {}
        for first in ([x[j]] if j < len(x) else list(range(256)) + [None]):
            trunks.setdefault(naive_trunk(member, tail, x[:j], first), []).append(first)
        for ids, firsts in trunks.items():
            if ids is None:
                continue
            with torch.no_grad():
                logprobs = model(torch.tensor([prompt + list(ids)])).logits[0].double().log_softmax(-1)
            trunk = sum(float(logprobs[len(prompt) - 1 + q, token]) for q, token in enumerate(ids))
            probs = logprobs[-1].exp().tolist()
            mass = [0.0] * 257
            for token, piece in enumerate(member.vocab.pieces):
                if piece and token not in member.vocab.special_ids and token not in member.stop_ids \
                        and len(piece) > len(suffix) and piece.startswith(suffix) \
                        and (j < len(x) or piece[0] in firsts):
                    mass[piece[len(suffix)]] += probs[token]
            if j == len(x) and None in firsts:
                mass[256] = sum(probs[s] for s in member.stop_ids)
            terms.append((trunk, mass))
    top = max(t for t, _ in terms)
    total = [sum(math.exp(t - top) * m[b] for t, m in terms) for b in range(257)]
    return [v / sum(total) for v in total]


def naive_byte_level(members, models, request, weights, main=0):
    tails = [CanonicalTail.from_view(m.vocab,
                                     continuation_encoder(lambda t, m=m: m.encode(t, add_special_tokens=False)))
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
def naive_byte_score(members, models, context, continuation, weights):
    """log q(continuation | context) and is_greedy: for every byte, every member's M(. | x) from
    scratch (naive_next_byte), the weighted average, the forced byte's log-probability."""
    tails = [CanonicalTail.from_view(m.vocab, continuation_encoder(
        lambda t, m=m: m.encode(t, add_special_tokens=False))) for m in members]
    spaces = len(context) - len(context.rstrip())
    context, forced = context[:len(context) - spaces], (context[len(context) - spaces:] + continuation).encode()
    prompts = [m.encode(context) if context else [m.prefix_token_id] for m in members]
    total, greedy = 0.0, True
    for i, byte in enumerate(forced):
        dists = [naive_next_byte(m, model, p, tail, forced[:i])
                 for m, model, p, tail in zip(members, models, prompts, tails)]
        mixed = [sum(w * d[b] for w, d in zip(weights, dists)) / sum(weights) for b in range(257)]
        total += math.log(mixed[byte] or 1e-300)  # zero: a byte token inside a character (no branch opens)
        greedy = greedy and max(range(257), key=lambda b: (mixed[b], -b)) == byte
    return total, greedy


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
        assert score.logprob == pytest.approx(logprob, abs=2e-4)
        assert score.is_greedy == greedy
    assert fast[3].logprob == 0.0 and fast[3].is_greedy
    assert fast[2].logprob < -600  # these tiny vocabularies split e-grave into byte tokens: q = 0 there


def test_scoring_edge_cases_are_batch_invariant(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    """A moved space, two-byte characters, an empty continuation, an empty context (the contract's
    batch test scores plain continuations only)."""
    def run(batch_size):
        members = pair(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model)
        return ByteLevel(members, ByteLevelParams(weights=[2.0, 1.0]), batch_size=batch_size).loglikelihood(SCORED)
    one, two, five = run(1), run(2), run(5)
    for a, b, c in zip(one, two, five):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-5) == pytest.approx(c.logprob, abs=1e-5)
        assert a.is_greedy == b.is_greedy == c.is_greedy


def test_is_greedy_when_the_continuation_is_the_greedy_generation(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    method = ByteLevel(pair(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model), ByteLevelParams(weights=[1.0, 2.0]))
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
    assert whole == pytest.approx(sum(math.log(p) for p in probs), abs=2e-4)
    # log P(cont[:7] | ctx) is the first part of the sum: the chain rule holds byte by byte
    assert halves[1].logprob == pytest.approx(sum(math.log(p) for p in probs[:7]), abs=2e-4)


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
def test_generation_stops_where_no_member_has_a_live_branch(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model,
                                                             chosen):
    """Both members led to the first byte of a 3-byte character (U+9xxx) they spell only in byte tokens:
    no branch is live at its second byte, so every row stops there (no IndexError, no NaN byte)."""
    both = pair(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model)
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
