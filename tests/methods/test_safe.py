"""SAFE: hand-checked sharpening and stability, consensus with itself, fast == a naive uncached
generate-verify-ensemble cycle, block verification == one-token extends and one verifier forward per
cycle, the recorded shares, parameters (identity, batch invariance and Ray: tests/methods/test_method_contract.py)."""

import copy

import pytest
import torch
from pydantic import ValidationError

from ensemble_bench.decoding.stopping import cut_at_until
from ensemble_bench.errors import UserError
from ensemble_bench.members import LocalMember, Prompt
from ensemble_bench.methods import LoglikelihoodRequest
from ensemble_bench.methods.safe import END, Safe, SafeParams
from ensemble_bench.methods.safe_reading import Draft, Reading, sharpened_choice
from ensemble_bench.vocab.union import STOP_KEY
from tests.naive import naive_safe
from tests.tiny import REQUESTS


# ------------------------------------------------------------------ hand-checked pieces
def test_sharpening_moves_mass_to_the_drafters_prefix_token_only_when_the_average_is_smooth():
    entries = (STOP_KEY + b"</s>", b" So", b" Sofia", b" Sofa", b" and", b" ", STOP_KEY + b"</s> x")
    mixed = torch.tensor([0.05, 0.20, 0.25, 0.15, 0.30, 0.05, 0.0])
    everything = range(len(entries))
    # smooth (top 0.30 < 0.5): " So" (0.20 > lambda 0.1) takes " Sofia" + " Sofa" -> 0.60 (Sec. 3.3)
    assert sharpened_choice(mixed, entries, frozenset({0, 6}), 0.5, everything, everything, 0.1) == 1
    # the longer entries gain nothing from their prefix (the reverse direction is not the paper's)
    assert sharpened_choice(mixed, entries, frozenset({0, 6}), 0.5, [2, 3, 4], everything, 0.1) == 4
    # lambda: a candidate must exceed the floor
    assert sharpened_choice(mixed, entries, frozenset({0, 6}), 0.5, everything, everything, 0.25) == 4
    # only pool entries give: without " Sofia" in the pool " So" reaches 0.35
    assert sharpened_choice(mixed, entries, frozenset({0, 6}), 0.5, everything, [1, 3, 4], 0.1) == 1
    assert sharpened_choice(mixed, entries, frozenset({0, 6}), 0.5, everything, [1, 2, 4], 0.1) == 1
    assert sharpened_choice(mixed, entries, frozenset({0, 6}), 0.5, everything, [1, 4], 0.1) == 4
    # not smooth enough to sharpen: plain argmax
    assert sharpened_choice(mixed, entries, frozenset({0, 6}), 0.3, everything, everything, 0.1) == 4
    assert sharpened_choice(mixed, entries, frozenset({0, 6}), 0.0, everything, everything, 0.1) == 4
    # the bare space and stop entries never gain; stops give nothing to a stop prefix
    spaced = torch.tensor([0.25, 0.0, 0.20, 0.0, 0.30, 0.15, 0.10])
    assert sharpened_choice(spaced, entries, frozenset({0, 6}), 0.5, everything, everything, 0.1) == 4
    # ties: the lowest index
    tie = torch.tensor([0.0, 0.25, 0.0, 0.0, 0.25, 0.0, 0.0])
    assert sharpened_choice(tie, entries, frozenset({0, 6}), 0.5, everything, everything, 0.1) == 1


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


# ------------------------------------------------------------------ a member with itself
@pytest.mark.parametrize("params", [SafeParams(), SafeParams(draft_tokens=1, sharpen=0.0, gate_threshold=0.5),
                                    SafeParams(drafter=1, draft_tokens=7, weights=[1.0, 3.0], candidate_floor=0.0)])
def test_with_itself_every_draft_is_accepted_by_consensus(same_model, params):
    """Its outputs are the member's alone (tests/methods/test_method_contract.py); here, why: no position is
    ensembled."""
    pair = Safe([same_model("a"), same_model("b")], params, batch_size=3)
    pair.generate(REQUESTS)
    assert pair.stats.ensembled == 0 and pair.stats.drafts_accepted == pair.stats.rounds > 0
    assert pair.stats.unanimous == pair.stats.stable > 0  # rule (ii)(1) decides every position


def members_of(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    return [LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(sp_model, sp_tokenizer, "b")]


def test_recorded_shares(pair):
    safe = Safe(pair(), SafeParams(), batch_size=2)
    generations = safe.generate(REQUESTS)
    info = {**safe.info(), **safe.info()[safe.name]}  # shared and own statistics
    assert info["tokens_committed"] >= sum(g.new_tokens for g in generations)
    assert 0 < info["tokens_ensembled"] <= info["stable_positions"]
    assert info["tokens_replaced"] <= info["tokens_ensembled"]
    assert info["ensembled_fraction"] == info["tokens_ensembled"] / info["tokens_committed"]
    assert info["draft_acceptance_rate"] == info["drafts_accepted"] / info["safe_rounds"]
    assert info["safe_rounds"] - info["drafts_accepted"] == info["tokens_replaced"]  # a replacement ends its draft
    # every position checked ends in exactly one of: a skip by rule (ii)(1), (ii)(2), the gate, or an ensemble
    assert info["stable_positions"] == (info["skipped_unanimous"] + info["skipped_average"] + info["skipped_gate"]
                                        + info["tokens_ensembled"])
    assert info["skipped_gate"] == 0 and info["tokens_sharpened"] <= info["tokens_ensembled"]


# ------------------------------------------------------------------ fast == the naive reference (tests/naive.py)
@pytest.fixture(scope="module")
def peaked_bpe_model(bpe_model):
    """The byte-level model with 10x larger logits: its own token is so probable that the average
    own-token probability passes 1/2 at some positions (rule (ii)(2)) and the gate closes at others."""
    model = copy.deepcopy(bpe_model)
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    return model


@pytest.mark.parametrize("drafter,draft_tokens,sharpen,floor,gate,peaked", [
    (0, 5, 0.5, 0.1, None, False), (1, 3, 0.0, 0.1, None, False), (0, 4, 1.0, 0.02, 0.5, False),
    (0, 4, 0.5, 0.1, 0.99, True)])
def test_cached_batched_path_equals_naive_reference(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, peaked_bpe_model,
                                                    drafter, draft_tokens, sharpen, floor, gate, peaked):
    first = peaked_bpe_model if peaked else bpe_model
    params = SafeParams(drafter=drafter, draft_tokens=draft_tokens, sharpen=sharpen, candidate_floor=floor,
                        gate_threshold=gate)
    fast = Safe(members_of(bpe_tokenizer, first, sp_tokenizer, sp_model), params, batch_size=3)
    generations = fast.generate(REQUESTS)
    if peaked:  # the comparison covers both skips beyond consensus
        assert fast.stats.average > 0 and fast.stats.gated > 0 and fast.stats.ensembled > 0
    else:  # the comparison covers replaced tokens
        assert fast.stats.replaced > 0
    if sharpen in (0.0, 1.0):  # never / always below the sharpening threshold
        assert fast.stats.sharpened == (fast.stats.ensembled if sharpen else 0)
    slow_members = members_of(bpe_tokenizer, first, sp_tokenizer, sp_model)
    for request, generation in zip(REQUESTS, generations):
        slow = naive_safe(slow_members, [first, sp_model], request, draft_tokens, sharpen, drafter,
                          floor=floor, gate=gate)
        assert generation.text == cut_at_until(slow, request.until)


# ------------------------------------------------------------------ the verifier's block read
class OneTokenSafe(Safe):
    """The reference verifier: every row is re-read from its prompt's last token with one-token
    ``extend`` calls, keeping the distribution after each token (no block read)."""

    def _verify(self, v, states, readings, drafts, positions):
        member = self.members[v]
        rows = [state.prompt[v] + list(reading.prefix + reading.ids) for state, reading in zip(states, readings)]
        start = [len(state.prompt[v]) - 1 for state in states]
        member.crop(start)
        after: list[dict[int, torch.Tensor]] = [{} for _ in states]  # index of the last token read -> log-probs
        for step in range(max(len(row) - first for row, first in zip(rows, start))):
            fed = [[row[first + step]] if first + step < len(row) else [] for row, first in zip(rows, start)]
            dist = member.extend(fed)
            for k, tokens in enumerate(fed):
                if tokens:
                    after[k][start[k] + step] = dist[k]
        found = []
        for k, (state, reading, draft, stable) in enumerate(zip(states, readings, drafts, positions)):
            base = len(state.prompt[v]) + len(reading.prefix) - 1
            found.append({t: after[k][base + reading.count_to(draft.offsets[t])] for t in stable}
                         | {END: after[k][len(rows[k]) - 1]})
        return found


@pytest.mark.parametrize("fields,batch_size", [({}, 3), ({}, 1), ({"drafter": 1, "draft_tokens": 3, "sharpen": 0.0}, 2),
                                               ({"draft_tokens": 8, "gate_threshold": 0.9}, 5)])
def test_block_verification_equals_one_token_extends(pair, fields, batch_size):
    """Same generations and the same decisions as a verifier reading the draft token by token."""
    params = SafeParams(**fields)
    block = Safe(pair(), params, batch_size=batch_size)
    reference = OneTokenSafe(pair(), params,
                             batch_size=batch_size)
    assert [(g.text, g.new_tokens) for g in block.generate(REQUESTS)] == [
        (g.text, g.new_tokens) for g in reference.generate(REQUESTS)]
    assert block.stats == reference.stats and block.stats.replaced > 0 and block.stats.stable > block.stats.rounds


class CycleCounted(Safe):
    cycles = 0

    def choose(self, dists, states):
        self.cycles += 1
        return super().choose(dists, states)


@pytest.mark.parametrize("drafter,batch_size", [(0, 3), (1, 1)])
def test_a_verifier_makes_one_forward_pass_per_cycle(pair, drafter, batch_size):
    members = pair()
    safe = CycleCounted(members, SafeParams(drafter=drafter, draft_tokens=6), batch_size=batch_size)
    safe.generate(REQUESTS)
    verifier, drafter_member = members[1 - drafter], members[drafter]
    assert safe.stats.stable > safe.stats.rounds > 0  # several positions verified per cycle, in one forward
    assert verifier.clock.decode_calls == safe.cycles
    assert drafter_member.clock.decode_calls > safe.cycles  # the drafter drafts token by token


# ------------------------------------------------------------------ scoring, parameters
def test_loglikelihood_is_the_drafters(pair):
    members = pair()
    request = LoglikelihoodRequest(Prompt(text="Question: 12 plus 30?\nAnswer:"), " 42")
    drafter = members[1]
    expected = drafter.score([drafter.encode_pair(request.prompt.text, request.continuation)])[0]
    assert Safe(members, SafeParams(drafter="b")).loglikelihood([request]) == [expected]


@pytest.mark.parametrize("fields", [{"draft_tokens": 0}, {"draft_tokens": 65}, {"sharpen": 1.5},
                                    {"sharpen": -0.1}, {"window": -1}, {"gate_threshold": 0}, {"gate_threshold": 1.5},
                                    {"gate_threshold": "0.5"}, {"gate": 0.5}, {"candidate_floor": -0.1},
                                    {"candidate_floor": 1.1},
                                    {"lambda": 0.1}, {"draft_tokens": "5"}])
def test_bad_parameters_are_rejected(fields):
    with pytest.raises(ValidationError):
        SafeParams(**fields)


@pytest.mark.parametrize("fields,message", [({"drafter": "nobody"}, "drafter"), ({"drafter": 2}, "out of range"),
                                            ({"weights": [1.0]}, "expected 2"), ({"weights": [0.0, 0.0]}, "positive")])
def test_member_dependent_parameters_are_one_line_errors(fields, message):
    with pytest.raises(UserError, match=message):
        Safe.check_members(SafeParams(**fields), ["a", "b"])
