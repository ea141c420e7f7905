"""PackLLM: hand-checked weights (sim, opt's greedy grid, common segments), the MinED map on hand-made
vocabularies and its cache, fast == a naive uncached reference (union and mined), the prompt weights
across batch sizes, scoring, parameter errors (identity, batch invariance and Ray:
tests/methods/test_method_contract.py)."""

import math

import pytest
from pydantic import ValidationError

from ensemble_bench.decoding.stopping import cut_at_until
from ensemble_bench.errors import UserError
from ensemble_bench.members import LocalMember, Prompt
from ensemble_bench.methods import METHODS, LoglikelihoodRequest, packllm_weights
from ensemble_bench.methods.packllm import PackLLM, PackLLMParams
from ensemble_bench.methods.packllm_weights import (
    PromptScore,
    common_segments,
    opt_weights,
    sim_weights,
    token_chunks,
)
from ensemble_bench.recipe import parse_recipe
from ensemble_bench.vocab import mined
from ensemble_bench.vocab.bytes_view import VocabView
from ensemble_bench.vocab.mined import cached_mined_map, mined_map, nearest
from tests.naive import naive_gac, naive_mined, naive_weights
from tests.tiny import REQUESTS
from tests.tolerances import PROMPT_WEIGHTS, TINY_MODEL, assert_close, assert_rounded


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
    assert PackLLMParams().alignment == "mined"


@pytest.mark.parametrize("fields, expected", [
    ({"alignment": "bytes"}, "method.alignment: Input should be 'union' or 'mined' (got 'bytes')"),
    ({"variant": "opt", "tau": 2.0}, "method: 'tau' does not apply to variant 'opt'"),
    ({"grid": 0, "variant": "opt"}, "method.grid: Input should be greater than or equal to 1"),
    ({"alignment": "union", "ppl_reading": "expert_tokens"},
     "method: ppl_reading 'expert_tokens' needs alignment 'mined' and ppl_unit 'token'"),
])
def test_bad_parameters_are_one_line_errors(fields, expected):
    recipe = {"name": "r", "members": [{"model": "smollm2-135m"}, {"model": "qwen2.5-0.5b"}],
              "method": {"name": "packllm", **fields}, "tasks": ["nq"], "data": "offline"}
    with pytest.raises(UserError) as info:
        parse_recipe(recipe, "r.yaml")
    line = str(info.value)
    assert "\n" not in line and line.startswith("r.yaml: ") and expected in line, line


# ------------------------------------------------------------------ the MinED map
def test_nearest_takes_the_exact_match_else_the_least_edit_distance_first_on_ties():
    choices = [b"cut", b"cat", b"car", b"dot", b"cat"]
    # cat: exact (the first of two); cart: cat and car at 1, the first; dog: dot at 1; xyz: all at 3, the first
    assert nearest([b"cat", b"cart", b"dog", b"xyz"], choices) == [1, 1, 3, 0]
    # bytes, not characters: b"\xc3\xa9" (e-acute) is one edit from b"\xc3" and two from b"e"
    assert nearest([b"\xc3\xa9"], [b"e", b"\xc3"]) == [1]
    assert nearest([b"a"], []) == [-1]


def test_mined_map_matches_within_roles():
    reference = VocabView((b"<s>", b" the", b"the", None, b"</s>", b"<pad>"), frozenset({0, 4, 5}), "text")
    member = VocabView((b"<|end|>", b"th", b" the", b"<x>"), frozenset({0, 3}), "text")
    # <s>, <pad>: the member's one other special; " the" exact; "the": "th" and " the" at 1, the lower
    # id; no text: -1; the stop </s>: the member's stop, however it is spelled
    assert mined_map(reference, [4], member, [0]).tolist() == [3, 2, 1, -1, 0, 3]
    plain = VocabView((b"a", b"th"), frozenset(), "text")
    assert mined_map(reference, [4], plain, []).tolist() == [-1, 1, 1, -1, -1, -1]
    duplicated = VocabView((b"a", b"b", b"a"), frozenset(), "text")
    assert mined_map(duplicated, [], duplicated, []).tolist() == [0, 1, 2]  # a vocabulary with itself: identity


def test_mined_map_is_cached_and_a_damaged_file_rebuilt(tmp_path, monkeypatch, caplog):
    reference = VocabView((b"ab", b"b", b"</s>"), frozenset({2}), "text")
    member = VocabView((b"a", b"bb", b"<e>"), frozenset({2}), "text")
    built = cached_mined_map(reference, [2], member, [2], tmp_path)
    assert built.tolist() == [0, 0, 2]  # "b": "a" and "bb" at 1, the lower id
    [path] = tmp_path.glob("mined-*.pt")
    monkeypatch.setattr(mined, "mined_map", lambda *args: pytest.fail("rebuilt a cached map"))
    assert cached_mined_map(reference, [2], member, [2], tmp_path).tolist() == [0, 0, 2]
    monkeypatch.undo()
    path.write_bytes(b"not a tensor file")
    assert cached_mined_map(reference, [2], member, [2], tmp_path).tolist() == [0, 0, 2]
    assert "damaged MinED cache" in caplog.text


# ------------------------------------------------------------------ fast == the naive reference (tests/naive.py)
@pytest.mark.parametrize("params", [PackLLMParams(tau=0.5, alignment="union"),
                                    PackLLMParams(variant="opt", alignment="union"),
                                    PackLLMParams(tau=0.5, alignment="union", score_from="second_token")],
                         ids=["sim", "opt", "sim-second-token"])
def test_cached_batched_union_path_equals_naive_reference(pair, bpe_model, sp_model, params):
    fast = PackLLM(pair(), params, batch_size=3)
    generations = fast.generate(REQUESTS)
    recorded = fast.info()[fast.name]["packllm_prompt_weights"]  # one per request, rounded to 6 decimals
    members, models = pair(), [bpe_model, sp_model]
    for request, generation, reported in zip(REQUESTS, generations, recorded, strict=True):
        weights, _ = naive_weights(members, models, request, params)
        assert_rounded(reported, weights, 6, PROMPT_WEIGHTS)
        assert generation.text == cut_at_until(naive_gac(members, models, request, weights), request.until)


@pytest.mark.parametrize("params", [PackLLMParams(tau=0.5), PackLLMParams(variant="opt"), PackLLMParams(tau=0.02),
                                    PackLLMParams(variant="opt", score_from="second_token"),
                                    PackLLMParams(ppl_reading="expert_tokens", score_from="second_token"),
                                    PackLLMParams(variant="opt", ppl_reading="expert_tokens")],
                         ids=["sim", "opt", "sharp", "opt-second-token", "sim-expert-tokens", "opt-expert-tokens"])
@pytest.mark.parametrize("order", ["bpe-sp", "sp-bpe"])
def test_cached_batched_mined_path_equals_naive_reference(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model,
                                                          params, order, tmp_path, monkeypatch):
    monkeypatch.setenv("ENSBENCH_CACHE", str(tmp_path))
    pairs = [(bpe_model, bpe_tokenizer), (sp_model, sp_tokenizer)][::1 if order == "bpe-sp" else -1]
    def pair():
        return [LocalMember(model, tokenizer, name) for (model, tokenizer), name in zip(pairs, "ab")]
    fast = PackLLM(pair(), params, batch_size=3)
    generations = fast.generate(REQUESTS)
    members, models = pair(), [model for model, _ in pairs]
    references = set()
    for request, generation in zip(REQUESTS, generations):
        weights, reference = naive_weights(members, models, request, params)
        references.add(reference)
        generated = naive_mined(members, models, request, weights, reference)
        assert generation.text == cut_at_until(generated, request.until)
    assert fast.info()[fast.name]["alignment"] == "mined"
    if params.tau == 0.02:
        assert references == {0, 1}  # rows with different references in one batch


@pytest.mark.parametrize("alignment", ["union", "mined"])
def test_prompt_weights_are_batch_invariant_and_reported(pair, alignment):
    def run(batch_size):
        method = PackLLM(pair(),
                         PackLLMParams(variant="opt", alignment=alignment), batch_size=batch_size)
        method.generate(REQUESTS)
        return method.info()[method.name]  # its own statistics
    info_one, info_three = run(1), run(3)

    def flat(info):
        return [x for w in sorted(info["packllm_prompt_weights"]) for x in w]
    assert_close(flat(info_one), flat(info_three), PROMPT_WEIGHTS.widened(1e-6, "rounding to 6 decimals"))
    assert len(info_one["packllm_prompt_weights"]) == len(REQUESTS)
    assert sum(info_one["packllm_top_member_counts"]) == len(REQUESTS)
    assert sum(info_one["packllm_weights_mean"]) == pytest.approx(1.0)
    assert info_one["packllm_prompt_scoring_ms_per_request"] > 0


def test_prompts_scored_in_token_budgeted_chunks_give_the_same_weights(pair, monkeypatch):
    assert token_chunks([5, 5, 5, 20, 1, 1], 10) == [[0, 1], [2], [3], [4, 5]]
    members = pair()
    prompts = [[m.render(r.prompt) for r in REQUESTS] for m in members]
    method = PackLLM(members, PackLLMParams(variant="opt"))
    whole = [x for w in method.weights_for(prompts) for x in w.weights]
    monkeypatch.setattr(packllm_weights, "PROMPT_TOKENS", 8)  # every prompt alone
    monkeypatch.setattr(packllm_weights, "FUSED_BLOCK", 3)  # the fused objective read in blocks of 3 positions
    assert_close([x for w in method.weights_for(prompts) for x in w.weights], whole, PROMPT_WEIGHTS)


def test_loglikelihood_mixes_sequence_probabilities_with_the_contexts_weights(pair):
    a, b = pair()
    method = PackLLM([a, b], PackLLMParams(tau=0.3))
    prompt = Prompt(text="Question: 12 plus 30?\nAnswer:")
    requests = [LoglikelihoodRequest(prompt, " 42"), LoglikelihoodRequest(prompt, " 7")]
    weights = method.weights_for([[a.render(prompt)], [b.render(prompt)]])[0].weights
    assert weights[0] != pytest.approx(0.5, abs=1e-3)
    scores = method.loglikelihood(requests)
    own = method.info()[method.name]
    assert_rounded(own["packllm_prompt_weights"], [weights], 6, PROMPT_WEIGHTS)  # one distinct context
    for request, score in zip(requests, scores):
        la = a.score([a.encode_pair(prompt.text, request.continuation)])[0].logprob
        lb = b.score([b.encode_pair(prompt.text, request.continuation)])[0].logprob
        assert_close(score.logprob, math.log(weights[0] * math.exp(la) + weights[1] * math.exp(lb)), TINY_MODEL)


def test_prompt_weights_are_reported_in_the_requests_order(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    members = [LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(sp_model, sp_tokenizer, "b")]
    method = PackLLM(members, PackLLMParams(tau=0.3), batch_size=3)  # batches run longest prompts first
    method.generate(REQUESTS)
    alone = [method.weights_for([[m.render(r.prompt)] for m in members])[0].weights for r in REQUESTS]
    reported = method.info()[method.name]["packllm_prompt_weights"]
    assert len({tuple(w) for w in reported}) > 1
    assert_rounded(reported, alone, 6, PROMPT_WEIGHTS)
