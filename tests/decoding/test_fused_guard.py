"""A method's fused distribution is finite or the row stops in one line (issue 47, decoding/fused.py):
the guard itself, its row as the loop names it (every token and speculative), every CoRE method
generating and scoring with a ``core_beta`` whose rbf filter is 0/0 (as recipes could set it before
the dry run refused it), and the line lm.py and the command line give."""

import math

import pytest
import torch
from lm_eval.api.instance import Instance

from ensemble_bench.cli import main as cli
from ensemble_bench.decoding.decode import decode_batch
from ensemble_bench.decoding.fused import NonFiniteFusion, checked_fusion
from ensemble_bench.decoding.method import Timing
from ensemble_bench.methods import LoglikelihoodRequest
from ensemble_bench.methods.eva import Eva, EvaParams
from ensemble_bench.methods.gac import Gac, GacParams
from ensemble_bench.methods.packllm import PackLLM, PackLLMParams
from ensemble_bench.methods.unite import Unite, UniteParams
from ensemble_bench.run.lm import LM_CLASSES
from tests.cli_helpers import one_line, raising, run_cli
from tests.decoding.test_decode_loop import Scripted, letter, request, states_for
from tests.tiny import REQUESTS

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize("row, refused", [
    ([0.2, 0.8, 0.0], False),
    ([0.0, -INF, -1.0], False),              # log-probs with a masked token
    ([0.2, NAN, 0.1], True),                 # amax propagates NaN
    ([0.2, INF, 0.1], True),
    ([-INF, -INF, -INF], True),              # no token has any probability
    ([NAN, NAN, NAN], True),
])
def test_a_fusion_with_a_nan_inf_or_no_finite_value_is_refused(row, refused):
    fused = torch.tensor([[0.5, 0.25, 0.25], row], dtype=torch.float64)
    if not refused:
        assert checked_fusion(fused) is fused
        return
    with pytest.raises(NonFiniteFusion) as caught:
        checked_fusion(fused, rows=[4, 7])  # the fusion of choose rows 4 and 7 only
    assert caught.value.row == 7 and caught.value.exit_code == 2
    assert str(caught.value).startswith("the method gave a non-finite fused distribution (")


class Fusing(Scripted):
    """Scripted steps whose fusion of request ``bad`` is NaN from its round ``at`` on."""

    def __init__(self, script, bad, at):
        super().__init__(script)
        self.bad, self.at = bad, at

    def choose(self, dists, states):
        fused = torch.tensor([[NAN if s.request_index == self.bad and s.seen >= self.at else 1.0, 0.0]
                              for s in states])
        checked_fusion(fused)
        return super().choose(dists, states)


def test_the_loop_names_the_batch_row_its_step_and_context():
    """Request 0 stops after one round, so request 2 is live row 1 of round 3; the fault names batch row 2."""
    steps = Fusing([[letter(0), letter(0)], [letter(1)] * 5, [letter(0)] * 5], bad=2, at=2)
    states = states_for([request(budget=1), request(), request()])
    with pytest.raises(NonFiniteFusion) as caught:
        decode_batch(steps, [[[0], [1], [0, 1, 0, 1]]], states, Timing())
    assert caught.value.row == 2
    assert str(caught.value).startswith("the method gave a non-finite fused distribution (nan) at decoding step 2, "
                                        "for request: context 'abab'; the members' distributions were finite")


def test_a_finite_fusion_changes_nothing():
    steps = Fusing([[letter(0), letter(1)], [letter(1), letter(0)]], bad=-1, at=0)
    states = states_for([request(budget=2), request(budget=2)])
    decode_batch(steps, [[[0], [1]]], states, Timing())
    assert [s.ids for s in states] == [[0, 1], [1, 0]]


# --- every CoRE method, with a core_beta whose rbf filter is 0/0 -------------------------------------
TINY_BETA = {"core": True, "core_beta": 1e-17}
CORE_METHODS = {
    "gac": (Gac, GacParams, {}),
    "unite": (Unite, UniteParams, {"k": 5}),
    "packllm-mined": (PackLLM, PackLLMParams, {}),
    "packllm-union": (PackLLM, PackLLMParams, {"alignment": "union"}),
    "eva": (Eva, EvaParams, {"overlap": "direct", "retokenize": "local"}),
}


def past_the_dry_run(params_class, fields):
    """The parameters as a recipe gave them before the dry run refused such a core_beta (unvalidated)."""
    return params_class(**fields, core=True).model_copy(update={"core_beta": 1e-17})


def method_of(case, pair, speculative=False):
    method_class, params_class, fields = CORE_METHODS[case]
    fields = {**fields, "speculative": 4, "proposer": 1} if speculative else fields
    return method_class(pair(), past_the_dry_run(params_class, fields), batch_size=2)


@pytest.mark.parametrize("speculative", [False, True])
@pytest.mark.parametrize("case", sorted(CORE_METHODS))
def test_every_core_method_stops_at_a_nan_fusion_naming_the_request(pair, case, speculative):
    """Before the guard: empty answers (gac, packllm) or tokens chosen from NaN (unite, eva), and exit 0.
    The fault names the request whose fusion failed first (the loop's row, then the request's prompt)."""
    with pytest.raises(NonFiniteFusion) as caught:
        method_of(case, pair, speculative).generate(REQUESTS[:2])
    start = "the method gave a non-finite fused distribution (nan) at decoding step 0, for request: context "
    assert any(str(caught.value).startswith(f"{start}{r.prompt.text!r}; ") for r in REQUESTS[:2]), str(caught.value)


@pytest.mark.parametrize("case", ["unite", "eva"])
def test_scoring_through_a_nan_fusion_stops_too(pair, case):
    """Teacher-forced scores (UniTE, EVA) read the fusion's share of the target: no -1e30 floor for NaN."""
    with pytest.raises(NonFiniteFusion, match=r"^the method gave a non-finite fused distribution \(nan\) at "
                                              r"decoding step 0, for request: context "):
        method_of(case, pair).loglikelihood([LoglikelihoodRequest(REQUESTS[0].prompt, " fox")])


def test_deepens_inverse_transform_is_checked(pair, monkeypatch):
    """Any method's fusion, not CoRE's only: DeePEn's Eq. 6-7 result made NaN (its exact path scores)."""
    import ensemble_bench.methods.deepen as deepen

    monkeypatch.setattr(deepen, "inverse_transform", lambda probs, *args, **kw: torch.full_like(probs, NAN))
    method = deepen.Deepen(pair(), deepen.DeepenParams(retokenize="local"), batch_size=2)
    with pytest.raises(NonFiniteFusion, match=r"^the method gave a non-finite fused distribution \(nan\) at "
                                              r"decoding step 0, for request: context "):
        method.loglikelihood([LoglikelihoodRequest(REQUESTS[0].prompt, " fox")])


def nq_requests(count=2):
    return [Instance(request_type="generate_until", doc={}, arguments=(r.prompt.text, {"max_gen_toks": 5}),
                     idx=0, metadata=("nq", 10 + i, 1)) for i, r in enumerate(REQUESTS[:count])]


def test_the_line_names_the_row_the_method_its_parameters_and_the_request(pair):
    lm = LM_CLASSES["gac"](method_of("gac", pair), "gac-core")
    with pytest.raises(NonFiniteFusion) as caught:
        lm.generate_until(nq_requests())
    assert str(caught.value) == (
        "row 'gac-core': method gac (core: true, core_beta: 1e-17) gave a non-finite fused distribution (nan) at "
        f"decoding step 0, for request 2 of 2 (nq, document 11): context {REQUESTS[1].prompt.text!r}; the members' "
        "distributions were finite, so the method's own arithmetic made it: change the parameters named here (a "
        "value at the edge of its range, such as CoRE's core_beta near 0)")
    assert lm.requests_computed == 0  # nothing reached the response cache
    assert lm.method.core.counters()["core_rows"] > 0  # the fusion ran: the guard saw its output


def test_it_is_one_line_and_exit_2_through_the_cli(pair, monkeypatch, capsys):
    with pytest.raises(NonFiniteFusion) as caught:
        LM_CLASSES["unite"](method_of("unite", pair), "unite").generate_until(nq_requests(1))
    monkeypatch.setattr(cli, "app", raising(caught.value))
    code, out = run_cli(monkeypatch, capsys, "list")
    assert code == 2 and one_line(out).startswith(
        "error: row 'unite': method unite (core: true, core_beta: 1e-17, k: 5) gave a non-finite fused distribution")


def test_a_member_fault_still_names_its_member(pair):
    """of_row leaves a member's NaN as the member guard words it."""
    err = NonFiniteFusion(row=0)
    assert err.of_row(method_of("gac", pair), "r").parts["who"] == "row 'r': method gac (core: true, core_beta: 1e-17)"
    from ensemble_bench.decoding.method import NonFiniteScore

    member = NonFiniteScore("member 'm'", NAN, "at decoding step 0", "context 'x'")
    assert member.of_row(method_of("gac", pair), "r") is member
