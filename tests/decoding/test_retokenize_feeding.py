"""``retokenize: local | canonical`` in the methods (decoding/feeding.py, issue 22).

Under canonical, after every step each member that took someone else's text holds, after its
prompt, exactly its tokenizer's encoding of the generated text from scratch (a trailing half
character pending); local keeps today's behaviour (the method tests). Also: defaults per method,
batch invariance, fast == a naive uncached UniTE / DeePEn that re-encodes the whole text every
step (what the reference code does), identity where the greedy path is canonical, span methods.
"""

import pytest
from pydantic import ValidationError

import tests.naive as naive
from ensemble_bench.decoding.feeding import cached_tail
from ensemble_bench.members import Prompt
from ensemble_bench.methods import GenerationRequest
from ensemble_bench.methods.coolfusion import CoolFusion, CoolFusionParams
from ensemble_bench.methods.deepen import Deepen, DeepenParams
from ensemble_bench.methods.gac import Gac, GacParams
from ensemble_bench.methods.single import Single
from ensemble_bench.methods.sweetspan import SweetSpan
from ensemble_bench.methods.sweetspan_params import SweetSpanParams
from ensemble_bench.methods.unite import Unite, UniteParams
from tests.tiny import REQUESTS, outputs

METHODS = {
    "unite": (Unite, UniteParams, {"k": 5}),
    "deepen": (Deepen, DeepenParams, {"support": 16}),
    "gac": (Gac, GacParams, {}),
    "gac-gate": (Gac, GacParams, {"gate": 1, "threshold": 0.3}),
}



def mismatches(method, states) -> tuple[int, int]:
    """(rows checked, rows whose held ids differ from the canonical encoding of the text so far),
    over the members that took someone else's text (not UniTE's / DeePEn's emitter) and are up to date."""
    checked = differ = 0
    emitter = getattr(method, "emitter", None)
    for v, member in enumerate(method.members):
        if v == emitter:
            continue
        tail = cached_tail(member)
        for state, row in zip(states, member.row_ids()):
            if v not in state.held or getattr(state, "pending", {}).get(v):
                continue  # not fed yet, or (GaC behind a gate) pieces still queued
            held = state.held[v]
            ids, pending = tail.canonical(bytes(state.data))
            checked += 1
            differ += (row[held.prompt_len:], held.pending) != (ids, pending)
    return checked, differ


def watch(method) -> list[tuple[int, int]]:
    """Check ``mismatches`` after every feed; returns the per-step counts."""
    seen: list[tuple[int, int]] = []
    feed = method.feed

    def checked_feed(dists, states, advances):
        out = feed(dists, states, advances)
        seen.append(mismatches(method, states))
        return out

    method.feed = checked_feed
    return seen


@pytest.mark.parametrize("name", list(METHODS))
def test_canonical_members_hold_their_encoding_of_the_text_after_every_step(pair, name):
    cls, params, extra = METHODS[name]
    results = {}
    for policy in ("local", "canonical"):
        method = cls(pair(), params(retokenize=policy, **extra),
                     batch_size=3)
        seen = watch(method)
        method.generate(REQUESTS)
        results[policy] = (sum(c for c, _ in seen), sum(d for _, d in seen), method.info()[method.name])
    checked, differ, info = results["canonical"]
    assert checked > 50 and differ == 0
    assert info["retokenize"] == "canonical" and info["retokenize_row_steps"] >= checked
    assert results["local"][1] > 0  # the check has teeth: local's ids are not canonical somewhere
    assert results["local"][2]["retokenize"] == "local"


@pytest.mark.parametrize("name", list(METHODS))
def test_canonical_is_batch_invariant(pair, name):
    cls, params, extra = METHODS[name]
    runs = [outputs(cls(pair(),
                        params(retokenize="canonical", **extra), batch_size=size)) for size in (1, 3)]
    assert runs[0] == runs[1]


class NaiveCanonicalFeed:
    """The naive references' feed (tests/naive.feed_chosen) made canonical: the emitter appends its
    token; every other member's sequence is its prompt + its encoding of the whole generated text,
    recomputed from scratch each step (as UniTE's unite2.py and DeePEn's AssistModelThread do)."""

    def __init__(self):
        self.prompts: list[int] | None = None
        self.data = b""

    def __call__(self, members, appenders, seqs, emitter, token) -> None:
        if self.prompts is None:
            self.prompts = [len(s) for s in seqs]
        self.data += members[emitter].vocab.pieces[token]
        for i, member in enumerate(members):
            if i == emitter:
                seqs[i].append(token)
            else:
                seqs[i] = seqs[i][:self.prompts[i]] + cached_tail(member).canonical(self.data)[0]


@pytest.mark.parametrize("emitter", [0, 1])
def test_unite_canonical_equals_naive_reference(pair, bpe_model, sp_model, emitter, monkeypatch):
    members = pair()
    fast = Unite(members, UniteParams(k=5, primary=emitter), batch_size=3).generate(REQUESTS)
    for request, generation in zip(REQUESTS, fast):
        monkeypatch.setattr(naive, "feed_chosen", NaiveCanonicalFeed())
        assert generation.text == naive.naive_unite(members, [bpe_model, sp_model], request, 5, emitter)


@pytest.mark.parametrize("emitter", [0, 1])
def test_deepen_canonical_equals_naive_reference(pair, bpe_model, sp_model, emitter, monkeypatch):
    members = pair()
    fast = Deepen(members, DeepenParams(support=None, main=emitter, eta=0.3), batch_size=3).generate(REQUESTS)
    for request, generation in zip(REQUESTS, fast):
        monkeypatch.setattr(naive, "feed_chosen", NaiveCanonicalFeed())
        assert generation.text == naive.naive_deepen(members, [bpe_model, sp_model], request, None, emitter, 0.3)


def greedy_ids(member, requests) -> list[list[int]]:
    """The member's own greedy ids for each request (Single, through the loop)."""
    method = Single([member], Single.Params(), batch_size=3)
    captured = []
    result = method.result

    def capture(state, request):
        captured.append((request, list(state.ids)))
        return result(state, request)

    method.result = capture
    method.generate(requests)
    return [dict((id(r), ids) for r, ids in captured)[id(r)] for r in requests]


def prefix_canonical(member, ids: list[int]) -> bool:
    """Whether every prefix of the greedy path is the tokenizer's own encoding of its text."""
    tail = cached_tail(member)
    return all(tail.canonical(member.vocab.join(ids[:t])) == (ids[:t], b"") for t in range(1, len(ids) + 1))


@pytest.mark.parametrize("cls,params", [(Unite, UniteParams()), (Deepen, DeepenParams(support=16))])
def test_identity_under_canonical_where_the_greedy_path_is_canonical(cls, params, same_model):
    """A member with itself: the other copy holds canonical ids, so the pair equals the member alone
    at least for every request whose greedy path is canonical at every step."""
    requests = [GenerationRequest(r.prompt, r.until, 4) for r in REQUESTS] + REQUESTS
    alone = outputs(Single([same_model("solo")], Single.Params(), batch_size=3), requests)
    canonical = [prefix_canonical(same_model("probe"), ids) for ids in greedy_ids(same_model("solo"), requests)]
    pair_out = outputs(cls([same_model("a"), same_model("b")], params, batch_size=3), requests)
    assert any(canonical)
    for is_canonical, a, b in zip(canonical, alone, pair_out):
        if is_canonical:
            assert a == b


@pytest.mark.parametrize("method", ["coolfusion", "sweetspan"])
def test_span_methods_hold_a_fixed_point_of_re_encoding(pair, method):
    """Span methods under canonical: after every round, a member that took another member's winner
    holds ids that re-encoding back to its last hard boundary leaves unchanged (the proposer keeps
    its own ids, as the chooser does in UniTE); local and canonical both give valid text."""
    cls, params = (CoolFusion, CoolFusionParams) if method == "coolfusion" else (SweetSpan, SweetSpanParams)
    extra = {"align": False} if cls is CoolFusion else {"span_words": 1}
    for policy in ("local", "canonical"):
        instance = cls(pair(), params(retokenize=policy, **extra),
                       batch_size=3)
        took, checks = [], []
        choose, take = instance.choose, instance._take

        def recording_take(v, state, info, winner, committed, take=take, took=took):
            if not info["own"][v][winner]:
                took.append((v, state))
            return take(v, state, info, winner, committed)

        def checked_choose(dists, states, choose=choose, instance=instance, took=took, checks=checks):
            out = choose(dists, states)
            rows = [member.row_ids() for member in instance.members]
            for v, state in took:
                row = rows[v][next(k for k, s in enumerate(states) if s is state)]
                plan = cached_tail(instance.members[v]).plan(row[state.held[v].prompt_len:], b"", b"")
                checks.append((plan.keep, plan.ids) == (len(row) - state.held[v].prompt_len, ()))
            took.clear()
            return out

        instance._take, instance.choose = recording_take, checked_choose
        generations = instance.generate(REQUESTS)
        assert len(generations) == len(REQUESTS) and len(checks) > 5
        info = instance.info()[instance.name]
        assert info["retokenize"] == policy and info["retokenize_row_steps"] == len(checks)
        if policy == "canonical":
            assert all(checks)


def test_defaults_follow_the_reference_code_and_bad_values_are_refused():
    assert GacParams().retokenize == "local"
    assert UniteParams().retokenize == DeepenParams().retokenize == "canonical"
    assert CoolFusionParams().retokenize == SweetSpanParams().retokenize == "canonical"
    for params in (GacParams, UniteParams, DeepenParams, CoolFusionParams, SweetSpanParams):
        with pytest.raises(ValidationError):
            params(retokenize="scratch")


@pytest.mark.integration
def test_canonical_on_real_members_equals_encoding_from_scratch():
    """SmolLM2 and Qwen2.5 (the packaged models): UniTE with each as primary and GaC under canonical;
    after every step the other members hold their tokenizer's encoding of the text so far."""
    from ensemble_bench.members import load_member

    members = [load_member("smollm2-135m", dtype="float32", name="smollm2"),
               load_member("qwen2.5-0.5b", dtype="float32", name="qwen2.5")]
    requests = [GenerationRequest(Prompt(text=t), ("\n\n",), 24) for t in
                ("Prejudice is", "Write the number 1234567 + 89 =", "東京は", "def fibonacci(n):\n")]
    for method in (Unite(members, UniteParams(primary=0), batch_size=4),
                   Unite(members, UniteParams(primary=1), batch_size=4),
                   Gac(members, GacParams(retokenize="canonical"), batch_size=4)):
        seen = watch(method)
        method.generate(requests)
        assert sum(c for c, _ in seen) > 40 and sum(d for _, d in seen) == 0
