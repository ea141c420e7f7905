"""Cool-Fusion and SweetSpan: word boundaries, the lambda filter, perplexity against a direct
computation, the cost of agreeing rounds, and fast == a naive uncached reference (identity,
batch invariance and Ray: tests/methods/test_method_contract.py)."""

import math

import pytest
import torch

from ensemble_bench.decoding.feeding import member_continuation
from ensemble_bench.members import Prompt
from ensemble_bench.methods import GenerationRequest
from ensemble_bench.methods.coolfusion import CoolFusion, CoolFusionParams
from ensemble_bench.methods.single import Single
from ensemble_bench.methods.span_level import Proposal, SpanState, perplexity
from ensemble_bench.methods.sweetspan import SweetSpan, SweetSpanParams, choose_span, filter_scores
from ensemble_bench.vocab.words import common_ends, whitespace_word_starts, word_starts
from tests.naive import naive_span
from tests.tiny import CORPUS, outputs
from tests.tolerances import PROBABILITY_OF_LOGPROB, TINY_MODEL, assert_close


# ------------------------------------------------------------------ word boundaries
def fake_pre_tokenize(pieces):
    """A pre-tokenizer returning the given split of the text, with offsets."""
    def split(text):
        out, start = [], 0
        for piece in pieces:
            out.append((piece, (start, start + len(piece))))
            start += len(piece)
        assert start == len(text)
        return out
    return split


def test_common_word_boundaries_hand_checked():
    text = "Multi-tasking is fun"
    smol = word_starts(text, "byte-level", fake_pre_tokenize(["Multi", "-", "tasking", " is", " fun"]))
    llama3 = word_starts(text, "byte-level", fake_pre_tokenize(["Multi", "-tasking", " is", " fun"]))
    spm = word_starts(text, "sentencepiece")
    assert smol == [5, 6, 13, 16] and llama3 == [5, 13, 16] and spm == [13, 16]
    assert common_ends([smol, llama3, spm]) == [13, 16]  # 'Multi' alone is not a common word
    assert common_ends([smol, llama3]) == [5, 13, 16]
    assert whitespace_word_starts("a  b\nc d ") == [1, 6, 8]  # a run of spaces starts one word


# ------------------------------------------------------------------ the lambda filter
def test_lambda_filter_hand_checked():
    # the paper's Figure 2 story: model 0 gives the right span 23.5 and its own wrong span 0.88
    table = [[23.5, 1.6, 1.4, 1.5],   # "by Bobby Scott": max/min = 16.8 > 10 -> drop 23.5 and 1.4
             [0.88, 4.0, 3.6, 3.9],   # "by Robert Williams": 4.5 <= 10 -> all kept
             [2.0, 2.1, 50.0, 4.0]]   # 25 > 10 -> drop 50.0 and 2.0
    assert filter_scores(table[0], 10) == [False, True, False, True]
    assert filter_scores(table[1], 10) == [True, True, True, True]
    assert filter_scores(table[2], 10) == [False, True, False, True]
    winner, kept = choose_span(table, 10)
    means = [(1.6 + 1.5) / 2, (0.88 + 4.0 + 3.6 + 3.9) / 4, (2.1 + 4.0) / 2]
    assert winner == means.index(min(means)) == 0
    unfiltered = [sum(r) / 4 for r in table]  # 7.0, 3.095, 14.5: without the filter the wrong span wins
    assert choose_span(table, 100)[0] == unfiltered.index(min(unfiltered)) == 1
    assert filter_scores([1.0, 30.0], 10) == [True, True]  # two members: nothing would remain


# ------------------------------------------------------------------ perplexity vs a direct computation
def direct_perplexity(model, context, tokens):
    with torch.no_grad():
        logprobs = model(torch.tensor([context + tokens])).logits[0].float().log_softmax(-1)
    picked = [float(logprobs[len(context) - 1 + j, t]) for j, t in enumerate(tokens)]
    return math.exp(-sum(picked) / len(picked))


def test_segment_perplexity_equals_a_direct_computation(pair, bpe_model, sp_model):
    members = pair()
    method = CoolFusion(members, CoolFusionParams(), batch_size=2)
    prompts = [CORPUS[0][:20], CORPUS[2][:33]]
    contexts = [[m.encode(p) for p in prompts] for m in members]
    dists = [m.prefill(c) for m, c in zip(members, contexts)]
    segments = [[" the cat", " models"], [" 42 apples are", ""]]
    rounds = [{"keys": [(text, None) for text in row],
               "tokens": [[tuple(member_continuation(m)(t)) if t else () for t in row] for m in members]}
              for row in segments]
    rounds[1]["keys"][1] = ("", "stop_id")  # an empty final segment: only the stop is scored
    unread = [[Proposal("", (), "length")]] * 2  # nothing read while proposing: every candidate gets a forward
    for v, (member, model) in enumerate(zip(members, [bpe_model, sp_model])):
        scores, held = method._score(v, rounds, dists[v], unread, [len(c) for c in contexts[v]])
        for k in range(2):
            for j, text in enumerate(segments[k]):
                if text:
                    expected = direct_perplexity(model, contexts[v][k], list(rounds[k]["tokens"][v][j]))
                else:
                    with torch.no_grad():
                        last = model(torch.tensor([contexts[v][k]])).logits[0, -1].float().log_softmax(-1)
                    expected = math.exp(-max(float(last[s]) for s in member.stop_ids))
                assert_close(scores[k][j], expected, PROBABILITY_OF_LOGPROB)
        # each row's cache ends with the last candidate it scored, and says so
        assert [h.index for h in held] == [1, 1]
        assert member.row_ids() == [contexts[v][k] + list(rounds[k]["tokens"][v][1]) for k in range(2)]
    assert perplexity([]) == math.inf


def test_a_proposers_own_scores_equal_a_direct_computation(pair, bpe_model, sp_model):
    members = pair()
    method = CoolFusion(members, CoolFusionParams(align=False), batch_size=3)  # frequent boundaries
    requests = [GenerationRequest(Prompt(text=CORPUS[i][:14 + 7 * i]), ("\n\n",), 60) for i in range(3)]
    read = 0
    for v, (member, model) in enumerate(zip(members, [bpe_model, sp_model])):
        contexts = [member.render(r.prompt) for r in requests]
        proposals = method._propose(v, [SpanState.of(r) for r in requests], member.prefill(contexts),
                                    [len(c) for c in contexts])
        for context, proposal, ids in zip(contexts, proposals, member.row_ids()):
            if proposal.final == "length":  # its last token was never fed: scored later by a forward
                assert proposal.logprobs is None and ids == context
                continue
            read += 1
            expected = direct_perplexity(model, context, list(proposal.tokens))
            assert_close(perplexity(proposal.logprobs), expected, PROBABILITY_OF_LOGPROB)
            assert ids == context + list(proposal.tokens)  # the cache keeps the segment
            with torch.no_grad():
                after = model(torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)
            assert_close(proposal.after, after, TINY_MODEL)
    assert read >= 2


# ------------------------------------------------------------------ the cost of agreeing rounds
@pytest.mark.parametrize("same_model", ["bpe"], indirect=True)
@pytest.mark.parametrize("span_words", [1, 2])
def test_agreeing_rounds_cost_only_the_proposals(same_model, span_words):
    """When all members propose the same segment, each keeps the cache it proposed with: about one
    decode pass per generated token, as for the member alone (not one more per round to commit).
    Batch 1: in a batch, a round lasts as long as its longest proposal."""
    alone_member = same_model("solo")
    alone = outputs(Single([alone_member], Single.Params(), batch_size=1))
    pair = [same_model("a"), same_model("b")]
    method = SweetSpan(pair, SweetSpanParams(span_words=span_words), batch_size=1)
    assert outputs(method) == alone
    for member in pair:  # at most one extra pass per request: a final segment's last token, re-fed
        assert member.clock.decode_calls <= alone_member.clock.decode_calls + len(alone)
    assert method.stats.rounds > len(alone)  # so a commit pass per round would break the bound


# ------------------------------------------------------------------ fast == the naive reference (tests/naive.py)
@pytest.mark.parametrize("kind", ["cool", "cool-noalign", "sweet-1", "sweet-3"])
def test_cached_batched_path_equals_naive_reference(pair, bpe_model, sp_model, kind):
    if kind.startswith("cool"):
        method = CoolFusion(pair(), CoolFusionParams(align=kind == "cool"), batch_size=3)
    else:
        method = SweetSpan(pair(), SweetSpanParams(span_words=int(kind[-1])), batch_size=3)
    requests = [GenerationRequest(Prompt(text=CORPUS[i][: 14 + 7 * i]), ("\n\n",), 14) for i in range(4)]
    fast = method.generate(requests)
    slow_members = pair()
    for request, generation in zip(requests, fast):
        slow = naive_span(slow_members, [bpe_model, sp_model], request,
                          lambda u, text: method._segment_end(u, text, [], []), lambda table: method._choose(table)[0])
        assert generation.text == slow
    assert method.info()[method.name]["rounds"] >= 2
    assert any(trace["rounds"] for trace in method.traces)  # some rounds had a real choice, logged
