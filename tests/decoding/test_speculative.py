"""Draft and verify (decoding/speculative.py): speculative decoding gives exactly the every-token
outputs of the same method and settings, on tiny models whose members disagree often (many
rejected drafts) and on a member ensembled with itself (every draft taken)."""

from types import SimpleNamespace

import pytest

from ensemble_bench.decoding.speculation_stats import Pace, Rate, Spent, SteadyCosts, SteadyPace, nearest
from ensemble_bench.decoding.speculative import PROBE_AFTER, PROBE_MOST, Costs, Speculation
from ensemble_bench.errors import UserError
from ensemble_bench.methods.deepen import Deepen, DeepenParams
from ensemble_bench.methods.eva import Eva, EvaParams
from ensemble_bench.methods.gac import Gac, GacParams
from ensemble_bench.methods.packllm import PackLLM, PackLLMParams
from ensemble_bench.methods.single import Single
from ensemble_bench.methods.unite import Unite, UniteParams
from tests.tiny import REQUESTS, outputs, sampled

LONG = [r.__class__(r.prompt, r.until, 24) for r in REQUESTS]



CASES = {
    "gac": (Gac, GacParams, {}),
    "gac-canonical": (Gac, GacParams, {"retokenize": "canonical"}),
    "gac-gated": (Gac, GacParams, {"threshold": 0.5}),
    "gac-weighted": (Gac, GacParams, {"weights": [1.0, 3.0]}),
    "unite": (Unite, UniteParams, {"k": 5}),
    "unite-local": (Unite, UniteParams, {"retokenize": "local"}),
    "deepen": (Deepen, DeepenParams, {}),
    "packllm-union": (PackLLM, PackLLMParams, {"alignment": "union"}),
    "packllm-mined": (PackLLM, PackLLMParams, {}),
    "eva": (Eva, EvaParams, {"top_k": 20}),
    "eva-local-direct": (Eva, EvaParams, {"retokenize": "local", "overlap": "direct", "n": 2}),
}


def run(method_class, params_class, members, fields, batch_size=2, requests=LONG):
    method = method_class(members, params_class(**fields), batch_size=batch_size)
    return outputs(method, requests), method


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("proposer", [0, 1])
def test_speculative_equals_every_token(pair, case, proposer):
    method_class, params_class, fields = CASES[case]
    expected, _ = run(method_class, params_class, pair("bpe", "sp"), fields)
    got, method = run(method_class, params_class, pair("bpe", "sp"), {**fields, "speculative": 4, "proposer": proposer})
    assert got == expected
    info = method.info()[method.name]  # the method's own statistics
    assert info["speculative_proposer"] == ["bpe", "sp"][proposer]
    assert len(info["speculative_rows"]) == len(LONG)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_speculative_gac_every_batch_size_and_auto(pair, batch_size):
    expected, _ = run(Gac, GacParams, pair("bpe", "sp"), {}, batch_size)
    got, method = run(Gac, GacParams, pair("bpe", "sp"), {"speculative": 6, "proposer": "auto"}, batch_size)
    assert got == expected
    assert method.info()[method.name]["speculative_proposer"] == "auto"


def test_member_with_itself_takes_every_draft(same_model):
    alone = outputs(Single([same_model("a")], Single.Params()), LONG)
    method = Gac([same_model("a"), same_model("b")], GacParams(speculative=4), batch_size=2)
    method.speculation.costs, method.speculation.pace = SteadyCosts(), SteadyPace()
    assert outputs(method, LONG) == alone
    info = method.info()[method.name]  # the method's own statistics
    assert info["speculative_acceptance_rate"] == 1.0
    assert info["speculative_tokens_per_round"] > 2
    # the second member reads each round's draft in one forward: fewer forwards than tokens
    assert info["speculative_forwards_per_token"]["b"] < 0.6


def test_unite_with_itself_equals_the_member(same_model):  # exact under local feeding (test_method_contract)
    alone = outputs(Single([same_model("a")], Single.Params()), LONG)
    got, _ = run(Unite, UniteParams, [same_model("a"), same_model("b")],
                 {"speculative": 3, "retokenize": "local", "proposer": 1})
    assert got == alone


def test_draft_length_adapts_down_when_drafts_fail(pair):
    _, method = run(Gac, GacParams, pair("bpe", "sp"), {"speculative": 8, "proposer": 0})
    info = method.info()[method.name]  # the method's own statistics
    assert info["speculative_draft_length_mean"] < 8
    rows = info["speculative_rows"]
    assert all(r["tokens"] >= r["rounds"] for r in rows)


@pytest.mark.parametrize("params, why", [({"threshold": 0.5}, "with speculative and a threshold or CoRE"),
                                         ({"core": True}, "with speculative and a threshold or CoRE"),
                                         ({"proposer": "auto"}, "with speculative and proposer: auto")])
def test_sampling_speculatively_is_refused_where_drafts_are_not_union_entries(pair, params, why):
    """Sampled speculation is GaC's, without a gate, CoRE or an automatic proposer (tests/decoding/
    test_speculative_sampling.py); the other speculative methods refuse it as before."""
    method = Gac(pair("bpe", "sp"), GacParams(speculative=2, **params))
    with pytest.raises(UserError, match=f"{why}.*, but a request samples"):
        method.generate(sampled(REQUESTS[:1]))
    unite = Unite(pair("bpe", "sp"), UniteParams(speculative=2))
    with pytest.raises(UserError, match="with speculative decodes greedily only, but a request samples"):
        unite.generate(sampled(REQUESTS[:1]))


def test_unknown_proposer_is_one_line():
    with pytest.raises(UserError, match="method.proposer: 'nobody' is not a member"):
        Gac.check_members(GacParams(speculative=2, proposer="nobody"), ["a", "b"])


def test_speculative_on_ray_members_equals_local_every_token(ray_members):
    """Remote members read drafts with read_block too: the outputs stay the local every-token ones."""
    local, remote = ray_members
    expected = outputs(Gac(local, GacParams(), batch_size=2), REQUESTS[:3])
    assert outputs(Gac(remote, GacParams(speculative=3, proposer=1), batch_size=2), REQUESTS[:3]) == expected


def test_block_cost_grows_with_width_from_what_was_measured():
    costs = Costs()
    costs.blocks = {1: 0.1}
    assert costs.block(1) == 0.1 and costs.block(11) == pytest.approx(0.2)  # the prior slope, 0.1 per token
    costs.blocks = {1: 0.1, 5: 0.2}
    assert costs.block(9) == pytest.approx(0.3)  # the line through the measured widths


def test_draft_length_follows_acceptance_and_costs():
    speculation = Speculation(SimpleNamespace(members=[None, None]), longest=8, proposer=0)
    speculation.lengths = [3, 3]
    assert speculation._draft_lengths([0, 1]) == [0, 0]  # a plain round first, for the pace
    speculation.pace.plain[2] = Spent(1.0, 1.0)
    assert speculation._draft_lengths([0, 1]) == [3, 3]  # no cost measured yet: each row's own
    speculation.costs.step, speculation.costs.blocks = 0.1, {1: 0.2, 9: 0.3}
    speculation.rates = [Rate(0, 8), Rate(18, 18)]  # acceptance 0.1 and 0.95
    assert speculation._draft_lengths([0]) == [0]  # drafts fail: plain every-token rounds
    assert speculation._draft_lengths([1])[0] >= 4
    speculation.rates = [Rate(18, 18)] + [Rate(0, 8)] * 7
    assert speculation._draft_lengths(list(range(8))) == [0] * 8  # the batch's steps and block do not pay
    speculation.costs.step = 1.0  # a proposer as costly as the verifier's block: drafting barely pays
    speculation.rates = [Rate()]
    assert speculation._draft_lengths([0]) == [0]


def test_plain_rounds_chosen_by_the_costs_draft_again_after_a_while():
    """One dear block measured (plain rounds measure none) must not keep rows that agree from drafting
    for good: after PROBE_AFTER plain rounds one round takes each row's own length, at least 1, then
    the costs rule again."""
    speculation = Speculation(SimpleNamespace(members=[None, None]), longest=8, proposer=0)
    speculation.costs.step, speculation.costs.blocks = 0.11, {1: 0.24, 3: 0.76}  # measured at batch 1, GSM8K
    speculation.rates, speculation.lengths = [Rate(17, 20)] * 2, [2, 0]  # agreement 0.82; own lengths 2 and 0
    speculation.pace.plain[2] = Spent(1.0, 1.0)
    chosen = [speculation._draft_lengths([0, 1]) for _ in range(2 * PROBE_AFTER + 2)]
    assert chosen == ([[0, 0]] * PROBE_AFTER + [[2, 1]]) * 2


def test_a_method_whose_hook_the_engine_cannot_call_cannot_speculate(pair):
    class Unrehearsed(Gac):
        def rehearse(self, states): ...

    refused = r"^Unrehearsed cannot decode speculatively: it lacks rehearse\(states, advances\) "
    with pytest.raises(TypeError, match=refused):
        Unrehearsed(pair(), GacParams(speculative=2))
    assert Unrehearsed(pair(), GacParams()).speculation is None  # every-token decoding asks nothing of it


def test_pace_is_wall_seconds_per_token_of_each_row_by_live_rows():
    pace = Pace()
    pace.observe(rows=8, drafted=False, seconds=0.8, tokens=8)  # every row one token in 0.8 s
    pace.observe(rows=8, drafted=True, seconds=1.6, tokens=12)  # 1.5 tokens a row in 1.6 s
    assert nearest(pace.plain, 8) == pytest.approx(0.8) and nearest(pace.drafting, 8) == pytest.approx(1.6 / 1.5)
    assert pace.drafting_loses(8) and pace.drafting_loses(4)  # at 4 rows, as measured at the nearest: 8
    assert not Pace(drafting={8: Spent(2.0, 1.0)}).drafting_loses(8)  # no plain round to weigh it against
    pace.observe(rows=8, drafted=True, seconds=0.1, tokens=16)  # a fast round turns it at once
    assert nearest(pace.drafting, 8) == pytest.approx((0.8 * 1.6 + 0.1) / (0.8 * 1.5 + 2))
    assert not pace.drafting_loses(8)
    pace.observe(rows=3, drafted=False, seconds=0.3, tokens=3)  # fewer rows: cheaper plain rounds
    assert pace.drafting_loses(4) and pace.drafting_loses(3)  # plain as at 3 (0.3 s), drafting as at 8 (0.43 s)
    assert not pace.drafting_loses(6)  # both as at 8: the larger of two as near


def test_pace_weighs_a_rejected_round_by_its_tokens_not_as_a_whole_round():
    """Rounds that drafted 4 tokens in 0.45 s, then one whose draft was refused (1 token in 0.6 s):
    0.18 s a token in all, so drafting still wins against plain rounds at 0.24 s; an average of each
    round's seconds per token (0.5 weight on the past) gives 0.36 and would call it lost."""
    pace = Pace()
    pace.observe(rows=1, drafted=False, seconds=0.24, tokens=1)
    for seconds, tokens in ((0.45, 4), (0.45, 4), (0.6, 1)):
        pace.observe(rows=1, drafted=True, seconds=seconds, tokens=tokens)
    assert nearest(pace.drafting, 1) == pytest.approx((0.64 * 0.45 + 0.8 * 0.45 + 0.6) / (0.64 * 4 + 0.8 * 4 + 1))
    assert not pace.drafting_loses(1)
    for _ in range(3):  # refused again and again: now it loses
        pace.observe(rows=1, drafted=True, seconds=0.6, tokens=1)
    assert pace.drafting_loses(1)


def test_drafting_that_loses_on_the_wall_clock_turns_plain_and_probes_ever_more_rarely():
    """The members' costs promise drafting (a cheap block), but rounds that drafted took longer per token
    than plain ones (a crop that re-submits rows, bookkeeping): rounds turn plain; a probe that loses
    again doubles the wait, up to PROBE_MOST; one that wins lets the costs rule again."""
    speculation = Speculation(SimpleNamespace(members=[None, None]), longest=8, proposer=0)
    speculation.costs.step, speculation.costs.blocks = 0.1, {1: 0.2, 9: 0.3}
    speculation.rates, speculation.lengths = [Rate(18, 18)] * 2, [3, 0]
    speculation.paced_rounds, speculation.aftermath = 1, False  # past a batch's first round
    speculation._paced(2, drafted=False, seconds=1.0, tokens=2)
    best = speculation._draft_lengths([0, 1])[0]
    assert best >= 4  # the members' clocks say drafting pays
    waits = []
    for _ in range(5):
        speculation._paced(2, drafted=True, seconds=9.0, tokens=4)  # 4.5 s a token each row, plain 1 s
        chosen = [speculation._draft_lengths([0, 1]) for _ in range(speculation.probe_after + 1)]
        assert chosen[:-1] == [[0, 0]] * (len(chosen) - 1) and chosen[-1] == [3, 1]  # the probe: own lengths
        waits.append(len(chosen) - 1)
    assert waits == [16, 32, 64, 64, 64] and PROBE_MOST == 64
    for _ in range(4):  # probes that win pull the pace under the plain rounds' (three do not outweigh five losses)
        speculation._paced(2, drafted=True, seconds=0.1, tokens=8)
    assert speculation.probe_after == PROBE_AFTER and speculation._draft_lengths([0, 1]) == [best, best]


def test_the_round_after_a_draft_is_paced_as_drafting_and_the_prefills_round_not_at_all():
    """A rejected draft's crop and re-read (a vLLM row submitted again) happen in the next round: that
    round's time is the drafting's. A batch's first round is answered by its prefill: no pace."""
    speculation = Speculation(SimpleNamespace(members=[None, None]), longest=8, proposer=0)
    speculation.begin([], [], [])
    speculation._paced(8, drafted=False, seconds=0.007, tokens=8)  # the prefill's round
    assert speculation.pace.plain == {} and speculation.pace.drafting == {}
    speculation._paced(8, drafted=False, seconds=0.45, tokens=8)
    speculation._paced(8, drafted=True, seconds=2.7, tokens=13)
    speculation._paced(8, drafted=False, seconds=1.3, tokens=8)  # the re-submitted rows
    speculation._paced(8, drafted=False, seconds=0.45, tokens=8)
    assert nearest(speculation.pace.drafting, 8) == pytest.approx((0.8 * 2.7 + 1.3) / (0.8 * 13 / 8 + 1))
    assert nearest(speculation.pace.plain, 8) == pytest.approx(0.45)
    speculation.begin([], [], [])  # a new batch: its first round is the prefill's again
    speculation._paced(8, drafted=False, seconds=0.001, tokens=8)
    assert nearest(speculation.pace.plain, 8) == pytest.approx(0.45)
