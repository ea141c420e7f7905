"""PackLLM: hand-checked weights (sim, opt's greedy grid, common segments), identity, fast == a naive
uncached reference, batch invariance, scoring, parameter errors, Ray placement."""

import logging
import math

import pytest
import torch
from pydantic import ValidationError

from ensemble_bench.members import LocalMember, Prompt, load_member
from ensemble_bench.methods import METHODS, LoglikelihoodRequest
from ensemble_bench.methods import packllm
from ensemble_bench.methods.packllm import (PackLLM, PackLLMParams, PromptScore, common_segments, opt_weights, sim_weights,
                                            token_chunks)
from ensemble_bench.methods.single import Single
from ensemble_bench.methods.stopping import cut_at_until
from tests.test_gac import naive_gac
from tests.tiny import REQUESTS, outputs


# ------------------------------------------------------------------ hand-checked weights
def test_sim_weights_are_a_softmax_of_negative_log_perplexity():
    weights = sim_weights([1.0, 2.0], tau=1.0)
    assert weights == pytest.approx([1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))])
    assert sim_weights([1.0, 2.0], tau=0.5)[0] == pytest.approx(1 / (1 + math.exp(-2)))
    assert sim_weights([3.0, 3.0, 3.0], tau=1.0) == pytest.approx([1 / 3] * 3)


def test_opt_mixes_members_that_know_different_segments_and_drops_a_useless_one():
    ln = math.log
    # A knows the first segment, B the second: the best mixture is half and half
    assert opt_weights([[ln(0.9), ln(0.1)], [ln(0.1), ln(0.9)]], [1.0, 1.0], grid=20) == pytest.approx([0.5, 0.5])
    # A is better everywhere: B gets nothing
    assert opt_weights([[ln(0.9), ln(0.9)], [ln(0.1), ln(0.1)]], [0.1, 2.3], grid=20) == pytest.approx([1.0, 0.0])
    # three members, taken in PPL order 2, 1, 0. Step 1: a*[.9,.1] + (1-a)*[.5,.5] has the product
    # .25 - .16a^2, best at a = 0 (member 1 replaces member 2); step 2: a*[.5,.5] + (1-a)*[.1,.9]
    # has .09 + .32a - .16a^2, best at a = 1 (member 0 left out). Greedy, not exhaustive.
    weights = opt_weights([[ln(0.1), ln(0.9)], [ln(0.5), ln(0.5)], [ln(0.9), ln(0.1)]], [1.2, 0.7, 0.5], grid=20)
    assert weights == pytest.approx([0.0, 1.0, 0.0])


def test_common_segments_cut_where_every_member_has_a_boundary():
    a = PromptScore(ends=(3, 5, 9), logprobs=(-1.0, -2.0, -3.0))
    b = PromptScore(ends=(2, 5, 9), logprobs=(-0.5, -0.5, -1.0))
    assert common_segments([a, b]) == [[-3.0, -3.0], [-1.0, -1.0]]
    other_text = PromptScore(ends=(4, 8), logprobs=(-1.0, -1.0))
    assert common_segments([a, other_text]) == [[-6.0], [-2.0]]


def test_parameters_are_validated():
    with pytest.raises(ValidationError, match="'tau' does not apply to variant 'opt'"):
        PackLLMParams(variant="opt", tau=2.0)
    with pytest.raises(ValidationError, match="'grid' does not apply to variant 'sim'"):
        PackLLMParams(grid=10)
    with pytest.raises(ValidationError):
        PackLLMParams(variant="max")
    with pytest.raises(ValidationError):
        PackLLMParams(tau=0.0)
    assert METHODS["packllm"] is PackLLM


# ------------------------------------------------------------------ generation invariants
@pytest.mark.parametrize("params", [PackLLMParams(), PackLLMParams(variant="opt"), PackLLMParams(ppl_unit="byte")])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_member_with_itself_is_the_member_alone(same_model, params, batch_size):
    alone = outputs(Single([same_model("solo")], Single.Params(), batch_size=batch_size))
    pair = PackLLM([same_model("a"), same_model("b")], params, batch_size=batch_size)
    assert outputs(pair) == alone


def naive_weights(members, models, request, params):
    """The prompt's lambda from full forwards, one member at a time (ends and segments by dicts)."""
    cumulative, totals = [], []
    for member, model in zip(members, models):
        ids = member.render(request.prompt)
        ids = ids[1:] if ids and ids[0] == member.prefix_token_id else ids
        with torch.no_grad():
            logprobs = model(torch.tensor([[member.prefix_token_id] + ids])).logits[0].float().log_softmax(-1)
        running, offset, total = {}, -1 if member.vocab.strips_leading_space else 0, 0.0
        for position, token in enumerate(ids):
            total += float(logprobs[position, token])
            offset += len(member.vocab.pieces[token] or b"")
            running[max(offset, 0)] = total
        cumulative.append(running)
        totals.append((total, len(ids)))
    log_ppl = [-total / count for total, count in totals]
    if params.variant == "sim":
        exp = [math.exp(-x / params.tau) for x in log_ppl]
        return [e / sum(exp) for e in exp]
    cuts = sorted(set(cumulative[0]).intersection(*cumulative[1:]))
    segs = [[run[c] - (run[p] if p is not None else 0.0) for p, c in zip([None] + cuts[:-1], cuts)] for run in cumulative]
    first, second = sorted(range(2), key=lambda k: log_ppl[k])
    best = min(range(params.grid, -1, -1), key=lambda s: -sum(
        math.log(s / params.grid * math.exp(x) + (1 - s / params.grid) * math.exp(y))
        for x, y in zip(segs[first], segs[second])))
    weights = [0.0, 0.0]
    weights[first], weights[second] = best / params.grid, 1 - best / params.grid
    return weights


@pytest.mark.parametrize("params", [PackLLMParams(tau=0.5), PackLLMParams(variant="opt")], ids=["sim", "opt"])
def test_cached_batched_path_equals_naive_reference(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, params):
    def pair():
        return [LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(sp_model, sp_tokenizer, "b")]
    fast = PackLLM(pair(), params, batch_size=3)
    generations = fast.generate(REQUESTS)
    recorded = {tuple(round(x, 5) for x in w) for w in fast.info()["packllm_prompt_weights"]}
    members, models = pair(), [bpe_model, sp_model]
    for request, generation in zip(REQUESTS, generations):
        weights = naive_weights(members, models, request, params)
        assert tuple(round(x, 5) for x in weights) in recorded
        assert generation.text == cut_at_until(naive_gac(members, models, request, weights), request.until)


def test_batch_invariant_and_weights_reported(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    def run(batch_size):
        method = PackLLM([LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(sp_model, sp_tokenizer, "b")],
                         PackLLMParams(variant="opt"), batch_size=batch_size)
        return outputs(method), method.info()
    (one, info_one), (three, info_three) = run(1), run(3)
    assert one == three
    def flat(info):
        return [x for w in sorted(info["packllm_prompt_weights"]) for x in w]
    assert flat(info_one) == pytest.approx(flat(info_three), abs=1e-5)
    assert len(info_one["packllm_prompt_weights"]) == len(REQUESTS)
    assert sum(info_one["packllm_top_member_counts"]) == len(REQUESTS)
    assert sum(info_one["packllm_weights_mean"]) == pytest.approx(1.0)
    assert info_one["packllm_prompt_scoring_ms_per_request"] > 0


def test_prompts_scored_in_token_budgeted_chunks_give_the_same_weights(bpe_tokenizer, bpe_model, sp_tokenizer,
                                                                       sp_model, monkeypatch):
    assert token_chunks([5, 5, 5, 20, 1, 1], 10) == [[0, 1], [2], [3], [4, 5]]
    members = [LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(sp_model, sp_tokenizer, "b")]
    prompts = [[m.render(r.prompt) for r in REQUESTS] for m in members]
    method = PackLLM(members, PackLLMParams(variant="opt"))
    whole = [x for w in method.weights_for(prompts) for x in w]
    monkeypatch.setattr(packllm, "PROMPT_TOKENS", 8)  # every prompt alone
    assert [x for w in method.weights_for(prompts) for x in w] == pytest.approx(whole, abs=1e-6)


def test_loglikelihood_mixes_sequence_probabilities_with_the_contexts_weights(bpe_tokenizer, bpe_model, sp_tokenizer,
                                                                              sp_model):
    a, b = LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(sp_model, sp_tokenizer, "b")
    method = PackLLM([a, b], PackLLMParams(tau=0.3))
    prompt = Prompt(text="Question: 12 plus 30?\nAnswer:")
    requests = [LoglikelihoodRequest(prompt, " 42"), LoglikelihoodRequest(prompt, " 7")]
    weights = method.weights_for([[a.render(prompt)], [b.render(prompt)]])[0]
    assert weights[0] != pytest.approx(0.5, abs=1e-3)
    scores = method.loglikelihood(requests)
    assert method.info()["packllm_prompt_weights"] == [[round(x, 6) for x in weights]]  # one distinct context
    for request, score in zip(requests, scores):
        la = a.score([a.encode_pair(prompt.text, request.continuation)])[0].logprob
        lb = b.score([b.encode_pair(prompt.text, request.continuation)])[0].logprob
        assert score.logprob == pytest.approx(math.log(weights[0] * math.exp(la) + weights[1] * math.exp(lb)), abs=1e-5)


# ------------------------------------------------------------------ Ray placement
@pytest.fixture(scope="module")
def remote_pair(tiny_dirs):
    ray = pytest.importorskip("ray")
    from ensemble_bench.members.remote import RemoteMember, launch

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    loads = [{"model": path, "name": name} for path, name in zip(tiny_dirs, ("bpe", "sp"))]
    remote = [RemoteMember(load, actor=launch(load, {"num_cpus": 1})) for load in loads]
    yield [load_member(**load) for load in loads], remote
    for member in remote:
        member.close()
    ray.shutdown()


def test_ray_placement_gives_identical_results(remote_pair):
    local, remote = remote_pair
    requests = REQUESTS[:3]
    params = PackLLMParams(variant="opt")
    fast, slow = PackLLM(remote, params, batch_size=2), PackLLM(local, params, batch_size=2)
    assert outputs(fast, requests) == outputs(slow, requests)
    assert fast.info()["packllm_prompt_weights"] == slow.info()["packllm_prompt_weights"]
    scoring = [LoglikelihoodRequest(Prompt(text="The quick brown"), " fox")]
    assert fast.loglikelihood(scoring) == slow.loglikelihood(scoring)
