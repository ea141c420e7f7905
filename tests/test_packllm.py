"""PackLLM: hand-checked weights (sim, opt's greedy grid, common segments), the MinED map on hand-made
vocabularies and its cache, fast == a naive uncached reference (union and mined), the prompt weights
across batch sizes, scoring, parameter errors (identity, batch invariance and Ray:
tests/test_method_contract.py)."""

import math

import pytest
import torch
from pydantic import ValidationError

from ensemble_bench.decoding.feeding import text_appender, text_lookup
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
from tests.test_gac import naive_gac
from tests.tiny import REQUESTS


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


# ------------------------------------------------------------------ generation against a naive reference
def naive_weights(members, models, request, params):
    """The prompt's lambda and top-1 expert from full forwards, one member at a time (ends and segments by
    dicts; opt with mined alignment: the logit fusion's cross-entropy on the expert's tokens)."""
    cumulative, totals, readings = [], [], []
    for member, model in zip(members, models):
        ids = member.render(request.prompt)
        ids = ids[1:] if ids and ids[0] == member.prefix_token_id else ids
        context, ids = (ids[:1], ids[1:]) if params.score_from == "second_token" else ([member.prefix_token_id], ids)
        with torch.no_grad():
            logprobs = model(torch.tensor([context + ids])).logits[0].float().log_softmax(-1)
        running, offset, total = {}, -1 if member.vocab.strips_leading_space else 0, 0.0
        for position, token in enumerate(ids):
            total += float(logprobs[position, token])
            offset += len(member.vocab.pieces[token] or b"")
            running[max(offset, 0)] = total
        cumulative.append(running)
        totals.append((total, len(ids)))
        readings.append((context, ids))
    log_ppl = [-total / count for total, count in totals]
    expert = min(range(2), key=lambda k: (log_ppl[k], k))
    if params.alignment == "mined":
        carried = naive_carried(members, models, readings[expert], expert, params)
        labels = readings[expert][1]
        if params.ppl_reading == "expert_tokens":
            log_ppl = [-float(c.log_softmax(-1)[torch.arange(len(labels)), torch.tensor(labels)].mean())
                       for c in carried]
    first, second = sorted(range(2), key=lambda k: (log_ppl[k], k))
    if params.variant == "sim":
        exp = [math.exp(-x / params.tau) for x in log_ppl]
        return [e / sum(exp) for e in exp], expert
    if params.alignment == "mined":
        losses = naive_fused_losses(carried, labels, first, params.grid)
    else:
        cuts = sorted(set(cumulative[0]).intersection(*cumulative[1:]))
        bounds = list(zip([None] + cuts[:-1], cuts))
        segs = [[run[c] - (run[p] if p is not None else 0.0) for p, c in bounds] for run in cumulative]
        losses = {s: -sum(math.log(s / params.grid * math.exp(x) + (1 - s / params.grid) * math.exp(y))
                          for x, y in zip(segs[first], segs[second])) for s in range(params.grid + 1)}
    best = min(range(params.grid, -1, -1), key=lambda s: losses[s])
    weights = [0.0, 0.0]
    weights[first], weights[second] = best / params.grid, 1 - best / params.grid
    return weights, expert


def naive_carried(members, models, expert_reading, expert, params):
    """Each member's log-probs along the expert's prompt tokens, on the expert's vocabulary ([member][pos, x]):
    the other member reads the MinED images of the expert's tokens (its prefix token first unless it scores
    from the second token), its log-probs taken at the MinED images (-inf where none)."""
    context, labels = expert_reading
    carried = []
    for k, (member, model) in enumerate(zip(members, models)):
        mapping = {x: x for x in range(members[expert].vocab.size)} if k == expert else \
            naive_map(members[expert], member)
        inputs = [mapping.get(t, 0) for t in context + labels[:-1]]
        if params.score_from == "prefix" and k != expert:
            inputs = [member.prefix_token_id] + inputs[1:]
        with torch.no_grad():
            logprobs = model(torch.tensor([inputs])).logits[0].float().log_softmax(-1)
        columns = [[float(row[mapping[x]]) if x in mapping else -math.inf for x in range(members[expert].vocab.size)]
                   for row in logprobs[len(inputs) - len(labels):]]
        carried.append(torch.tensor(columns))
    return carried


def naive_fused_losses(carried, labels, expert, grid):
    """Cross-entropy of softmax(a s_expert + (1-a) s_other) on the expert's prompt tokens, a = s / grid."""
    other = 1 - expert
    losses = {}
    for s in range(grid + 1):
        a = s / grid
        fused = (a * carried[expert] if a > 0 else 0) + ((1 - a) * carried[other] if a < 1 else 0)
        losses[s] = -float(torch.log_softmax(fused, -1)[torch.arange(len(labels)), torch.tensor(labels)].sum())
    return losses


@pytest.mark.parametrize("params", [PackLLMParams(tau=0.5, alignment="union"),
                                    PackLLMParams(variant="opt", alignment="union"),
                                    PackLLMParams(tau=0.5, alignment="union", score_from="second_token")],
                         ids=["sim", "opt", "sim-second-token"])
def test_cached_batched_union_path_equals_naive_reference(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, params):
    def pair():
        return [LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(sp_model, sp_tokenizer, "b")]
    fast = PackLLM(pair(), params, batch_size=3)
    generations = fast.generate(REQUESTS)
    recorded = {tuple(round(x, 5) for x in w) for w in fast.info()["packllm_prompt_weights"]}
    members, models = pair(), [bpe_model, sp_model]
    for request, generation in zip(REQUESTS, generations):
        weights, _ = naive_weights(members, models, request, params)
        assert tuple(round(x, 5) for x in weights) in recorded
        assert generation.text == cut_at_until(naive_gac(members, models, request, weights), request.until)


def levenshtein(a: bytes, b: bytes) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def naive_map(reference, member) -> dict[int, int]:
    """Reference id -> member id: same role (stop, other special, text), exact bytes, else least edit distance."""
    def role(m, i):
        return "stop" if i in m.stop_ids else "special" if i in m.vocab.special_ids else "text"
    found = {}
    for i, piece in enumerate(reference.vocab.pieces):
        if piece is None:
            continue
        same = [j for j, p in enumerate(member.vocab.pieces) if p is not None and role(member, j) == role(reference, i)]
        if same:
            found[i] = min(same, key=lambda j: (member.vocab.pieces[j] != piece,
                                                levenshtein(piece, member.vocab.pieces[j]), j))
    return found


def naive_mined(members, models, request, weights, reference, window=4):
    """Eq. 3 on the top-1 expert's vocabulary, one request at a time, full forwards, maps as dicts."""
    ref = members[reference]
    maps = [None if k == reference else naive_map(ref, m) for k, m in enumerate(members)]
    appenders = [text_appender(m, window) for m in members]
    writer_ids = text_lookup(members[0])
    seqs = [m.render(request.prompt) for m in members]
    text, writer = b"", []
    for _ in range(request.max_new_tokens):
        logprobs = []
        for model, seq in zip(models, seqs):
            with torch.no_grad():
                logprobs.append(model(torch.tensor([seq])).logits[0, -1].float().log_softmax(-1).tolist())
        def fused(x, logprobs=logprobs):
            total = 0.0
            for k, lp in enumerate(logprobs):
                if weights[k] > 0:
                    y = x if k == reference else maps[k].get(x)
                    total += weights[k] * lp[y] if y is not None else -math.inf
            return total
        allowed = [x for x, p in enumerate(ref.vocab.pieces)
                   if x in ref.stop_ids or (p is not None and x not in ref.vocab.special_ids)]
        token = max(allowed, key=lambda x: (fused(x), -x))
        if token in ref.stop_ids:
            break
        data = ref.vocab.pieces[token]
        for k, appender in enumerate(appenders):
            if k == reference:
                seqs[k].append(token)
            else:
                plan = appender.plan(seqs[k], data)
                seqs[k] = seqs[k][:len(seqs[k]) - plan.drop] + list(plan.ids)
        text += data
        if writer is not None:
            own = token if reference == 0 else writer_ids.get(data)
            writer = writer + [own] if own is not None else None
        rendered = members[0].decode(writer) if writer is not None else text.decode("utf-8", errors="replace")
        if any(u in rendered for u in request.until):
            break
    return members[0].decode(writer) if writer is not None else text.decode("utf-8", errors="replace")


@pytest.mark.parametrize("params", [PackLLMParams(tau=0.5), PackLLMParams(variant="opt"), PackLLMParams(tau=0.02),
                                    PackLLMParams(variant="opt", score_from="second_token"),
                                    PackLLMParams(ppl_reading="expert_tokens", score_from="second_token"),
                                    PackLLMParams(variant="opt", ppl_reading="expert_tokens")],
                         ids=["sim", "opt", "sharp", "opt-second-token", "sim-expert-tokens", "opt-expert-tokens"])
@pytest.mark.parametrize("order", ["bpe-sp", "sp-bpe"])
def test_cached_batched_mined_path_equals_naive_reference(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, params,
                                                          order, tmp_path, monkeypatch):
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
    assert fast.info()["alignment"] == "mined"
    if params.tau == 0.02:
        assert references == {0, 1}  # rows with different references in one batch


@pytest.mark.parametrize("alignment", ["union", "mined"])
def test_prompt_weights_are_batch_invariant_and_reported(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, alignment):
    def run(batch_size):
        method = PackLLM([LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(sp_model, sp_tokenizer, "b")],
                         PackLLMParams(variant="opt", alignment=alignment), batch_size=batch_size)
        method.generate(REQUESTS)
        return method.info()
    info_one, info_three = run(1), run(3)

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
    whole = [x for w in method.weights_for(prompts) for x in w.weights]
    monkeypatch.setattr(packllm_weights, "PROMPT_TOKENS", 8)  # every prompt alone
    monkeypatch.setattr(packllm_weights, "FUSED_BLOCK", 3)  # the fused objective read in blocks of 3 positions
    assert [x for w in method.weights_for(prompts) for x in w.weights] == pytest.approx(whole, abs=1e-6)


def test_loglikelihood_mixes_sequence_probabilities_with_the_contexts_weights(bpe_tokenizer, bpe_model, sp_tokenizer,
                                                                              sp_model):
    a, b = LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(sp_model, sp_tokenizer, "b")
    method = PackLLM([a, b], PackLLMParams(tau=0.3))
    prompt = Prompt(text="Question: 12 plus 30?\nAnswer:")
    requests = [LoglikelihoodRequest(prompt, " 42"), LoglikelihoodRequest(prompt, " 7")]
    weights = method.weights_for([[a.render(prompt)], [b.render(prompt)]])[0].weights
    assert weights[0] != pytest.approx(0.5, abs=1e-3)
    scores = method.loglikelihood(requests)
    assert method.info()["packllm_prompt_weights"] == [[round(x, 6) for x in weights]]  # one distinct context
    for request, score in zip(requests, scores):
        la = a.score([a.encode_pair(prompt.text, request.continuation)])[0].logprob
        lb = b.score([b.encode_pair(prompt.text, request.continuation)])[0].logprob
        assert score.logprob == pytest.approx(math.log(weights[0] * math.exp(la) + weights[1] * math.exp(lb)), abs=1e-5)


def test_prompt_weights_are_reported_in_the_requests_order(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    members = [LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(sp_model, sp_tokenizer, "b")]
    method = PackLLM(members, PackLLMParams(tau=0.3), batch_size=3)  # batches run longest prompts first
    method.generate(REQUESTS)
    alone = [method.weights_for([[m.render(r.prompt)] for m in members])[0].weights for r in REQUESTS]
    reported = method.info()["packllm_prompt_weights"]
    assert len({tuple(w) for w in reported}) > 1
    assert reported == [[round(x, 6) for x in w] for w in alone]
