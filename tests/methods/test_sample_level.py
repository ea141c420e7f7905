"""VOTING and MBR (the DeePEn paper's baselines) and perplexity rerank: vote rules, answer keys,
chrF MBR, perplexity against a direct computation, and the multiple-choice path on tiny members
(identity, batch invariance and Ray: tests/methods/test_method_contract.py)."""

import math
from types import SimpleNamespace

import pytest
import torch

from ensemble_bench.members import LocalMember, Prompt
from ensemble_bench.methods import GenerationRequest, LoglikelihoodRequest
from ensemble_bench.methods.mbr import Mbr, mbr_scores
from ensemble_bench.methods.rerank import Rerank, RerankParams
from ensemble_bench.methods.sample_level import SampleLevelParams, choose_by_vote
from ensemble_bench.methods.single import Single
from ensemble_bench.methods.voting import Voting, VotingParams, answer_key
from ensemble_bench.run.lm import EnsembleLM
from tests.tiny import CORPUS
from tests.tolerances import PROBABILITY_OF_LOGPROB, assert_close


@pytest.mark.parametrize("keys,main,winner", [
    (["a", "b", "b"], 0, "b"),           # majority
    (["a", "b"], 1, "b"),                # tie: the main model's answer
    (["a", "b", "c"], 2, "c"),
    (["a", "b", "a", "b"], 3, "b"),
    (["a", "b", "b", "c", "c"], 0, "b"),  # tie without the main model: the first member's
])
def test_vote_rules(keys, main, winner):
    assert choose_by_vote(keys, main) == winner


@pytest.mark.parametrize("text,answer,key", [
    ("She has 3 boxes. 3 * 412 = 1,236\n#### 1,236", "auto", "1236"),
    ("So the answer is (B).", "auto", "b"),
    ("I pick (C) because it floats.", "auto", "c"),
    ("There are 42 apples and 7 pears", "auto", "7"),
    ("Paris\nIt is in France.", "auto", "paris"),
    ("ans=12 then ans=15", r"ans=(\d+)", "15"),
    ("  The  Beatles. ", "text", "the beatles"),
])
def test_answer_keys(text, answer, key):
    assert answer_key(text, answer) == key


def test_mbr_prefers_the_answer_closest_to_the_others():
    scores = mbr_scores(["the cat sat on the mat", "the cat sat on a mat", "a dog ran far away"])
    assert scores.index(min(scores)) == 2


REQUESTS = [GenerationRequest(Prompt(text=CORPUS[i][: 12 + 9 * i]), ("\n\n",), 8 + 3 * i) for i in range(4)]


def trio(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    """Two copies of one model (they always agree) and a different one (the main, index 2)."""
    return [LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(bpe_model, bpe_tokenizer, "a2"),
            LocalMember(sp_model, sp_tokenizer, "b")]


@pytest.mark.parametrize("make", [lambda m: Voting(m, VotingParams(answer="text", main=2), batch_size=2),
                                  lambda m: Mbr(m, SampleLevelParams(main=2), batch_size=2)])
def test_agreeing_pair_outvotes_the_main_model(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, make):
    alone = [g.text for g in Single([LocalMember(bpe_model, bpe_tokenizer, "s")], Single.Params()).generate(REQUESTS)]
    main_member = Single([LocalMember(sp_model, sp_tokenizer, "s")], Single.Params())
    main_alone = [g.text for g in main_member.generate(REQUESTS)]
    assert alone != main_alone
    method = make(trio(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model))
    assert [g.text for g in method.generate(REQUESTS)] == alone
    assert method.info()["tokens_generated"] > 0


def test_multiple_choice_votes_per_question(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    questions = [CORPUS[0][:25], CORPUS[1][:31]]
    choices = [" the cat", " a dog", " models", " 42"]
    requests = [LoglikelihoodRequest(Prompt(text=q), c) for q in questions for c in choices]
    voting = Voting(trio(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model), VotingParams(main=2))
    scores = voting.loglikelihood(requests)
    alone = Single([LocalMember(bpe_model, bpe_tokenizer, "s")], Single.Params()).loglikelihood(requests)
    for q in range(len(questions)):
        block = range(q * len(choices), (q + 1) * len(choices))
        pick = max(block, key=lambda i: alone[i].logprob)  # the agreeing pair's choice
        assert max(block, key=lambda i: scores[i].logprob) == pick
        assert [scores[i].is_greedy for i in block] == [i == pick for i in block]


def test_choices_of_one_question_stay_in_one_chunk(bpe_tokenizer, bpe_model):
    lm = EnsembleLM(Single([LocalMember(bpe_model, bpe_tokenizer, "s")], Single.Params()), "s", chunk_size=2)
    contexts = ["q one", "q two!", "q one", "q three", "q one", "q two!"]
    requests = [SimpleNamespace(args=(c, f" choice {i}")) for i, c in enumerate(contexts)]
    chunks = lm._chunks(requests)
    assert sorted(i for chunk in chunks for i in chunk) == list(range(len(contexts)))
    for context in set(contexts):
        holding = [k for k, chunk in enumerate(chunks) if any(contexts[i] == context for i in chunk)]
        assert len(holding) == 1, (context, chunks)


def test_answers_are_cached_as_each_batch_finishes(bpe_tokenizer, bpe_model):
    """An interrupted run loses at most the batch in progress."""
    events = []
    method = Single([LocalMember(bpe_model, bpe_tokenizer, "s")], Single.Params(), batch_size=2)
    generate = method.generate
    method.generate = lambda batch: events.append(f"generate {len(batch)}") or generate(batch)
    lm = EnsembleLM(method, "s")
    lm.set_cache_hook(SimpleNamespace(add_partial=lambda *args: events.append("cached")))
    requests = [SimpleNamespace(args=(CORPUS[i][:20], {"until": ["\n"], "max_gen_toks": 4})) for i in range(5)]
    assert len(lm.generate_until(requests)) == 5
    assert events == ["generate 2", "cached", "cached"] * 2 + ["generate 1", "cached"]


# ------------------------------------------------------------------ rerank (perplexity)
def direct_perplexity(member, model, prompt, text):
    """exp(-mean log p) of the answer's tokens, from one plain forward over prompt + answer."""
    context, continuation = member.encode_pair(member.render_text(prompt), text)
    with torch.no_grad():
        logprobs = model(torch.tensor([context + continuation])).logits[0].float().log_softmax(-1)
    picked = [float(logprobs[len(context) - 1 + i, t]) for i, t in enumerate(continuation)]
    return math.exp(-sum(picked) / len(picked))


def test_rerank_picks_the_lowest_average_perplexity(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    members = trio(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model)
    models = [bpe_model, bpe_model, sp_model]
    rerank = Rerank(members, RerankParams(main=2), batch_size=2)
    request = REQUESTS[1]
    texts = [" the cat sat", " models are small", "", " 42 apples"]
    averages = rerank.scorer.average_perplexities(request.prompt, texts)
    for k, text in enumerate(texts):
        if not text:
            assert averages[k] == math.inf
            continue
        expected = sum(direct_perplexity(m, model, request.prompt, text) for m, model in zip(members, models)) / 3
        assert_close(averages[k], expected, PROBABILITY_OF_LOGPROB)
    finite = [a for a in averages if a != math.inf]
    assert rerank._choose(texts, request) == averages.index(min(finite))
    generated = rerank.generate(REQUESTS)
    alone = [[g.text for g in Single([m], Single.Params()).generate(REQUESTS)] for m in members]
    for i, (request, generation) in enumerate(zip(REQUESTS, generated)):
        candidates = [a[i] for a in alone]
        assert generation.text == candidates[rerank._choose(candidates, request)]
