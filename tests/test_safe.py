"""SAFE: hand-checked sharpening and stability, identity, batch invariance, fast == a naive
uncached generate-verify-ensemble cycle, the recorded shares, parameters, Ray placement."""

import logging

import pytest
import torch
from pydantic import ValidationError

from ensemble_bench.errors import UserError
from ensemble_bench.members import LocalMember, Prompt
from ensemble_bench.methods import LoglikelihoodRequest
from ensemble_bench.methods.feeding import text_appender
from ensemble_bench.methods.safe import Draft, Reading, Safe, SafeParams, sharpened_choice
from ensemble_bench.methods.single import Single
from ensemble_bench.methods.stopping import cut_at_until
from ensemble_bench.vocab.retokenize import CanonicalTail, continuation_encoder
from ensemble_bench.vocab.union import STOP_KEY
from tests.tiny import REQUESTS, outputs


# ------------------------------------------------------------------ hand-checked pieces
def test_sharpening_consolidates_sub_words_only_when_the_average_is_smooth():
    entries = (STOP_KEY + b"</s>", b" So", b" Sofia", b" Sofa", b" and")
    mixed = torch.tensor([0.05, 0.30, 0.25, 0.10, 0.30])
    # smooth (top 0.30 < 0.5): " Sofia" takes " So" -> 0.55, " Sofa" 0.40, " So" 0.30, " and" 0.30
    assert sharpened_choice(mixed, entries, frozenset({0}), sharpen=0.5) == 2
    # not smooth enough to sharpen: plain argmax, lowest index on the tie
    assert sharpened_choice(mixed, entries, frozenset({0}), sharpen=0.3) == 1
    assert sharpened_choice(mixed, entries, frozenset({0}), sharpen=0.0) == 1
    # a stop entry takes no prefix mass and gives none
    stop_heavy = torch.tensor([0.45, 0.30, 0.0, 0.0, 0.25])
    assert sharpened_choice(stop_heavy, entries, frozenset({0}), sharpen=0.5) == 0


def test_stable_positions_are_token_starts_in_every_reading():
    # draft " So" "fia" " is": offsets 0, 3, 6, 9
    draft = Draft(tokens=[1, 2, 3], offsets=[0, 3, 6, 9])
    whole_word = Reading((), (7, 8), (6, 9), 0)         # " Sofia" " is": no boundary at 3
    split = Reading((), (4, 5, 6), (3, 6, 9), 0)       # the drafter's own split
    assert Safe._stable(draft, [whole_word]) == [0, 2]
    assert Safe._stable(draft, [whole_word, split]) == [0, 2]
    assert Safe._stable(draft, [split]) == [0, 1, 2]
    # a reading that re-tokenised back into the committed text (start < 0) still starts a token at 0
    behind = Reading((9,), (10, 11), (0, 9), -2)
    assert Safe._stable(draft, [behind]) == [0]
    stopped = Draft(tokens=[1], offsets=[0, 3], stop=True)
    assert Safe._stable(stopped, [Reading((), (4,), (3,), 0)]) == [0, 1]
    assert Safe._stable(stopped, [Reading((), (4,), (2,), 0, b"\xc3")]) == [0]


# ------------------------------------------------------------------ invariants
@pytest.mark.parametrize("params", [SafeParams(), SafeParams(draft_tokens=1, sharpen=0.0),
                                    SafeParams(drafter=1, draft_tokens=7, weights=[1.0, 3.0])])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_member_with_itself_is_the_member_alone(same_model, params, batch_size):
    alone = outputs(Single([same_model("solo")], Single.Params(), batch_size=batch_size))
    pair = Safe([same_model("a"), same_model("b")], params, batch_size=batch_size)
    assert outputs(pair) == alone
    assert pair.stats.ensembled == 0 and pair.stats.drafts_accepted == pair.stats.rounds > 0


def members_of(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    return [LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(sp_model, sp_tokenizer, "b")]


@pytest.mark.parametrize("drafter", [0, 1])
def test_batch_invariance(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, drafter):
    def run(batch_size):
        members = members_of(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model)
        return outputs(Safe(members, SafeParams(drafter=drafter, draft_tokens=3), batch_size=batch_size))
    assert run(1) == run(2) == run(5)


def test_recorded_shares(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    safe = Safe(members_of(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model), SafeParams(), batch_size=2)
    generations = safe.generate(REQUESTS)
    info = safe.info()
    assert info["tokens_committed"] >= sum(g.new_tokens for g in generations)
    assert 0 < info["tokens_ensembled"] <= info["stable_positions"]
    assert info["tokens_replaced"] <= info["tokens_ensembled"]
    assert info["ensembled_fraction"] == info["tokens_ensembled"] / info["tokens_committed"]
    assert info["draft_acceptance_rate"] == info["drafts_accepted"] / info["safe_rounds"]
    assert info["safe_rounds"] - info["drafts_accepted"] == info["tokens_replaced"]  # a replacement ends its draft


# ------------------------------------------------------------------ naive reference implementation
def naive_safe(members, models, request, draft_tokens=5, sharpen=0.5, drafter=0, window=4):
    """One request, every forward recomputed from scratch, every verifier re-tokenised from
    scratch, the union average and the sharpening by dicts."""
    verifiers = [v for v in range(len(members)) if v != drafter]
    union: dict[bytes, float] = {}

    def key(u, token):
        m = members[u]
        if token in m.stop_ids:
            return STOP_KEY + m.vocab.pieces[token]
        return m.vocab.pieces[token] if m.vocab.pieces[token] and token not in m.vocab.special_ids else None

    def logprobs(u, ids):
        with torch.no_grad():
            return models[u](torch.tensor([prompts[u] + ids])).logits[0, -1].float().log_softmax(-1)

    def mixed_choice(dists):
        union.clear()
        for u, lp in enumerate(dists):
            for token, p in enumerate(lp.exp().tolist()):
                k = key(u, token)
                if k is not None:
                    union[k] = union.get(k, 0.0) + p / len(dists)
        order = list(union)
        if max(union.values()) >= sharpen:
            return max(order, key=lambda e: (union[e], -order.index(e)))
        top = sorted(order, key=lambda e: (-union[e], order.index(e)))[:16]
        score = {e: union[e] + (0 if e.startswith(STOP_KEY) else sum(
            union[p] for p in top if p != e and p and not p.startswith(STOP_KEY) and e.startswith(p))) for e in top}
        return max(top, key=lambda e: (score[e], -order.index(e)))

    tails = {v: CanonicalTail.from_view(members[v].vocab, continuation_encoder(
        lambda text, m=members[v]: m.encode(text, add_special_tokens=False))) for v in verifiers}
    appender = text_appender(members[drafter], window)
    prompts = [m.render(request.prompt) for m in members]
    pieces = members[drafter].vocab.pieces
    text, own, writer_ids, count = b"", [], [], 0
    while True:
        tokens, seen, stop = [], [], False
        while True:
            seen.append(logprobs(drafter, own + tokens))
            pick = int(seen[-1].argmax())
            if pick in members[drafter].stop_ids:
                stop = True
                break
            tokens.append(pick)
            done = (text + b"".join(pieces[t] for t in tokens)).decode("utf-8", "replace")
            if len(tokens) >= draft_tokens or count + len(tokens) >= request.max_new_tokens or any(
                    u in done for u in request.until):
                break
        starts = [len(text) + sum(len(pieces[t]) for t in tokens[:i]) for i in range(len(tokens) + 1)]
        readings = {}
        for v in verifiers:
            ids, pending = tails[v].canonical(text + b"".join(pieces[t] for t in tokens))
            ends = [sum(len(members[v].vocab.pieces[i]) for i in ids[:j]) for j in range(len(ids) + 1)]
            readings[v] = (ids, ends)
        kept, chosen = len(tokens), None
        for t in range(len(tokens) + stop):
            last = t == len(tokens)
            at = {}
            for v, (ids, ends) in readings.items():
                if starts[t] in ends and (last or ends.index(starts[t]) < len(ids)):
                    at[v] = ends.index(starts[t])
            if len(at) < len(verifiers):
                continue  # not stable
            dists = {v: logprobs(v, readings[v][0][:j]) for v, j in at.items()}
            agree = all((int(dists[v].argmax()) in members[v].stop_ids) if last
                        else int(dists[v].argmax()) == readings[v][0][at[v]] for v in verifiers)
            if agree:
                continue
            entry = mixed_choice([seen[t] if u == drafter else dists[u] for u in range(len(members))])
            mine = STOP_KEY if last else pieces[tokens[t]]
            if (entry.startswith(STOP_KEY) and last) or entry == mine:
                continue
            kept, chosen = t, entry
            break
        text += b"".join(pieces[t] for t in tokens[:kept])
        own += tokens[:kept]
        count += kept
        if writer_ids is not None:
            writer_ids += tokens[:kept]
        if (chosen is None and stop) or (chosen is not None and chosen.startswith(STOP_KEY)):
            break
        if chosen is not None:
            plan = appender.plan(own, chosen)
            own = own[:len(own) - plan.drop] + list(plan.ids)
            text += chosen
            count += 1
            exact = appender.by_bytes.get(chosen)
            writer_ids = writer_ids + [exact] if writer_ids is not None and exact is not None else None
        rendered = members[drafter].decode(writer_ids) if writer_ids is not None else text.decode("utf-8", "replace")
        if any(u in rendered for u in request.until) or count >= request.max_new_tokens:
            break
    if writer_ids is not None:
        return members[drafter].decode(writer_ids)
    rendered = text.decode("utf-8", "replace")
    return rendered[1:] if members[drafter].vocab.strips_leading_space and rendered.startswith(" ") else rendered


@pytest.mark.parametrize("drafter,draft_tokens,sharpen", [(0, 5, 0.5), (1, 3, 0.0)])
def test_cached_batched_path_equals_naive_reference(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model,
                                                    drafter, draft_tokens, sharpen):
    params = SafeParams(drafter=drafter, draft_tokens=draft_tokens, sharpen=sharpen)
    fast = Safe(members_of(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model), params, batch_size=3)
    generations = fast.generate(REQUESTS)
    assert fast.stats.replaced > 0  # the comparison covers replaced tokens
    slow_members = members_of(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model)
    for request, generation in zip(REQUESTS, generations):
        slow = naive_safe(slow_members, [bpe_model, sp_model], request, draft_tokens, sharpen, drafter)
        assert generation.text == cut_at_until(slow, request.until)


# ------------------------------------------------------------------ scoring, parameters
def test_loglikelihood_is_the_drafters(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    members = members_of(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model)
    request = LoglikelihoodRequest(Prompt(text="Question: 12 plus 30?\nAnswer:"), " 42")
    drafter = members[1]
    expected = drafter.score([drafter.encode_pair(request.prompt.text, request.continuation)])[0]
    assert Safe(members, SafeParams(drafter="b")).loglikelihood([request]) == [expected]


@pytest.mark.parametrize("fields", [{"draft_tokens": 0}, {"draft_tokens": 65}, {"sharpen": 1.5},
                                    {"sharpen": -0.1}, {"window": -1}, {"gate": 0}, {"draft_tokens": "5"}])
def test_bad_parameters_are_rejected(fields):
    with pytest.raises(ValidationError):
        SafeParams(**fields)


@pytest.mark.parametrize("fields,message", [({"drafter": "nobody"}, "drafter"), ({"drafter": 2}, "out of range"),
                                            ({"weights": [1.0]}, "expected 2"), ({"weights": [0.0, 0.0]}, "positive")])
def test_member_dependent_parameters_are_one_line_errors(fields, message):
    with pytest.raises(UserError, match=message):
        Safe.check_members(SafeParams(**fields), ["a", "b"])


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
        fast, slow = Safe(remote, SafeParams(draft_tokens=3), 2), Safe(local, SafeParams(draft_tokens=3), 2)
        assert outputs(fast, REQUESTS[:3]) == outputs(slow, REQUESTS[:3])
        assert fast.stats == slow.stats
        for member in remote:
            member.close()
    finally:
        ray.shutdown()
