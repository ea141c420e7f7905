"""CoRE (methods/core.py): the fusion's equations against a plain-Python reading of them, its
switches (token level, model level, the official code's rules), its parameter checks, and the
plug-in on GaC, UniTE and PackLLM (speculative == every-token, statistics, changed outputs)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from ensemble_bench.members import LocalMember
from ensemble_bench.methods.core import (
    RBF_BETA_FLOOR,
    CoreFusion,
    CoreParams,
    rbf_beta_problem,
    rbf_divisor,
    token_filter,
)
from ensemble_bench.methods.eva import Eva, EvaParams
from ensemble_bench.methods.gac import Gac, GacParams
from ensemble_bench.methods.packllm import PackLLM, PackLLMParams
from ensemble_bench.methods.unite import Unite, UniteParams
from tests.cli_helpers import dry_run, one_line
from tests.tiny import REQUESTS, outputs
from tests.tolerances import FLOAT64_SUMS, assert_close

LONG = [r.__class__(r.prompt, r.until, 20) for r in REQUESTS]


def fusion(**fields) -> CoreFusion:
    return CoreFusion(CoreParams(core=True, **fields), 3)


# three members over five tokens: a confident lead, a confident member that agrees, a flat one
PROBS = [[0.70, 0.20, 0.05, 0.05, 0.00],
         [0.60, 0.30, 0.05, 0.00, 0.05],
         [0.20, 0.20, 0.20, 0.20, 0.20]]


def by_hand(probs, base, lead, beta=2.0, token=True, model=True):
    """The module docstring's equations, one number at a time."""
    count, size = len(probs), len(probs[0])
    ref = [sum(p[v] for p in probs) / count for v in range(size)]
    f = [[(math.exp(-beta * abs(p[v] - ref[v])) - math.exp(-beta)) / (1 - math.exp(-beta)) for v in range(size)]
         for p in probs]
    if model:
        h = [-sum(x * math.log(x) for x in p if x > 0) for p in probs]
        raw = [base[i] * sum(f[i]) / h[i] for i in range(count)]
    else:
        raw = list(base)
    w = [r / sum(raw) for r in raw]
    return [sum(w[i] * (f[i][v] if token and i != lead else 1.0) * probs[i][v] for i in range(count))
            for v in range(size)], w


@pytest.mark.parametrize("token,model", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("lead", [0, 2])
def test_fuse_follows_the_equations(token, model, lead):
    core = CoreFusion(CoreParams(core=True, core_token=token, core_model=model), 3)
    base = [1.0, 2.0, 1.0]
    got = core.fuse(torch.tensor([[row] for row in PROBS], dtype=torch.float64), torch.tensor(base), lead)
    expected, weights = by_hand(PROBS, base, lead, token=token, model=model)
    assert_close(got[0].tolist(), expected, FLOAT64_SUMS)
    assert_close(core.counters()["core_weights_mean"], weights, FLOAT64_SUMS)


def test_model_level_favours_the_confident_consistent_member():
    core = fusion(core_token=False)
    core.fuse(torch.tensor([[row] for row in PROBS]), torch.ones(3), 0)
    weights = core.counters()["core_weights_mean"]
    assert weights[1] > weights[2] and weights[0] > weights[2]


def test_token_level_filters_a_disagreeing_token():
    """A token only one non-lead member puts mass on is cut the most (relative to its mass)."""
    core = fusion(core_model=False)
    probs = torch.tensor([[[0.9, 0.1, 0.0]], [[0.1, 0.1, 0.8]]], dtype=torch.float64)
    fused = core.fuse(probs, torch.ones(2), 0)[0]
    rbf = (math.exp(-2.0 * 0.4) - math.exp(-2.0)) / (1 - math.exp(-2.0))
    assert fused[0] == pytest.approx(0.5 * 0.9 + 0.5 * rbf * 0.1)  # the lead's 0.9 is not filtered
    assert fused[1] == pytest.approx(0.1)  # no disparity: kept whole
    assert fused[2] == pytest.approx(0.5 * rbf * 0.8) and rbf < 0.5


@pytest.mark.parametrize("kind", ["rbf", "linear", "power", "reciprocal", "sigmoid"])
def test_filters_fall_with_the_disparity(kind):
    core = fusion(core_filter=kind)
    values = core.filter(torch.linspace(0, 1, 11, dtype=torch.float64))
    assert all(a > b for a, b in zip(values, values[1:]))
    if kind in ("rbf", "linear", "power"):
        assert values[0] == 1.0
        assert_close(float(values[-1]), 0.0, FLOAT64_SUMS)


def test_identical_members_give_the_member():
    p = torch.softmax(torch.randn(4, 50, dtype=torch.float64), dim=-1)
    for rules in ("paper", "official"):
        fused = fusion(core_rules=rules).fuse(torch.stack([p, p, p]), torch.ones(3), 1)
        assert_close(fused, p, FLOAT64_SUMS)  # the weights sum to 1 up to rounding


def test_official_rules_floor_the_lead_and_rescale():
    core = fusion(core_rules="official", core_token=False)
    core.fuse(torch.tensor([[row] for row in PROBS]), torch.ones(3), 2)  # the flat member leads
    weights = core.counters()["core_weights_mean"]
    assert weights[2] == pytest.approx(0.5)
    paper = fusion(core_token=False)
    paper.fuse(torch.tensor([[row] for row in PROBS]), torch.ones(3), 2)
    assert paper.counters()["core_weights_mean"][2] < 0.5
    scores, _ = fusion(core_rules="official")._token_scores(torch.tensor([[row] for row in PROBS]), 0)
    for member in scores[:, 0]:
        kept = member[member != 0]
        assert float(kept.mean()) == pytest.approx(1.0)


def test_rows_are_independent():
    probs = torch.softmax(torch.randn(3, 5, 40, dtype=torch.float64), dim=-1)
    base = torch.rand(5, 3, dtype=torch.float64) + 0.1
    whole = fusion().fuse(probs, base, 0)
    for row in range(5):
        assert torch.equal(fusion().fuse(probs[:, row:row + 1], base[row:row + 1], 0)[0], whole[row])


@pytest.mark.parametrize("fields,message", [
    ({"core_beta": 1.0}, "applies only with core: true"),
    ({"core": True, "core_token": False, "core_model": False}, "needs core_token or core_model"),
    ({"core": True, "core_alpha": 2.0}, "does not apply to core_filter 'rbf'"),
    ({"core": True, "core_beta": 0.0}, "greater than 0"),
    ({"core": True, "core_rules": "code"}, "paper"),
    ({"core": True, "core_beta": 1e-17}, r"core_beta 1e-17 makes the rbf filter 0/0 \(NaN\) at every token"),
])
def test_bad_core_parameters_are_refused(fields, message):
    for params in (GacParams, UniteParams, PackLLMParams, EvaParams):
        with pytest.raises(ValidationError, match=message):
            params(**fields)


def test_the_rbf_bound_is_where_its_divisor_rounds_to_zero():
    """Issue 47: core_beta 1e-17 made every fused distribution NaN. The bound is the computation's own:
    exp(-beta) rounds to 1.0 in float64 at 2**-54 (the divisor 1 - exp(-beta) is then 0), and not
    above it, where the filter and the whole fusion are finite. At the bound the filter is finite nowhere:
    0/0 (NaN), or -inf where torch's vectorised exp (AVX512 here) rounds exp(-beta d) just below 1."""
    probs = torch.softmax(torch.randn(3, 4, 60, dtype=torch.float64, generator=torch.Generator().manual_seed(0)), -1)
    d = torch.linspace(0, 1, 101, dtype=torch.float64)
    at_bound = CoreParams(core=True).model_copy(update={"core_beta": RBF_BETA_FLOOR})
    assert rbf_divisor(RBF_BETA_FLOOR) == 0.0 and not torch.isfinite(token_filter(at_bound)(d)).any()
    assert torch.isnan(CoreFusion(at_bound, 3).fuse(probs, torch.ones(3), 0)).all()
    above = math.nextafter(RBF_BETA_FLOOR, 1.0)
    assert rbf_divisor(above) > 0 and rbf_beta_problem(above) is None
    assert torch.isfinite(token_filter(CoreParams(core=True, core_beta=above))(d)).all()
    assert torch.isfinite(fusion(core_beta=above).fuse(probs, torch.ones(3), 0)).all()
    for tiny in (1e-17, RBF_BETA_FLOOR):
        with pytest.raises(ValidationError, match=r"core_beta must be above 5\.55e-17 \(2\*\*-54\)"):
            CoreParams(core=True, core_beta=tiny)
    CoreParams(core=True, core_filter="linear")  # the bound is the rbf filter's only


def test_the_dry_run_refuses_such_a_core_beta_in_one_line(tiny_dirs, tmp_path, monkeypatch, capsys):
    members = "".join(f"  - {{model: {folder}, name: {name}}}\n" for folder, name in zip(tiny_dirs, "ab"))
    text = (f"name: nan-core\nmembers:\n{members}method: {{name: gac, core: true, core_beta: 1.0e-17}}\n"
            f"tasks: [{{name: gsm8k, limit: 2}}]\ndata: offline\noutput: {tmp_path / 'results'}\n")
    code, out = dry_run(monkeypatch, capsys, tmp_path, text)
    line = one_line(out)
    assert code == 2 and "core_beta 1e-17 makes the rbf filter 0/0 (NaN) at every token" in line, line


# ------------------------------------------------------------------ the plug-in on the methods
@pytest.fixture
def pair(bpe_model, bpe_tokenizer, sp_model, sp_tokenizer):
    return lambda: [LocalMember(bpe_model, bpe_tokenizer, "bpe"), LocalMember(sp_model, sp_tokenizer, "sp")]


CASES = {
    "gac": (Gac, GacParams, {"core": True}),
    "gac-official-gated": (Gac, GacParams, {"core": True, "core_rules": "official", "threshold": 0.5}),
    "unite": (Unite, UniteParams, {"core": True, "k": 5}),
    "unite-model-only": (Unite, UniteParams, {"core": True, "core_token": False, "retokenize": "local"}),
    "packllm-mined": (PackLLM, PackLLMParams, {"core": True}),
    "packllm-union": (PackLLM, PackLLMParams, {"core": True, "alignment": "union", "core_model": False}),
    "eva": (Eva, EvaParams, {"core": True, "overlap": "direct", "retokenize": "local"}),
}


def own(method) -> dict:
    """The method's own statistics in its results (written under its name)."""
    return method.info()[method.name]


def run(method_class, params_class, members, fields, batch_size=2):
    method = method_class(members, params_class(**fields), batch_size=batch_size)
    return outputs(method, LONG), method


@pytest.mark.parametrize("case", sorted(CASES))
def test_speculative_core_equals_every_token(pair, case):
    method_class, params_class, fields = CASES[case]
    expected, every = run(method_class, params_class, pair(), fields)
    got, method = run(method_class, params_class, pair(), {**fields, "speculative": 4, "proposer": 1})
    assert got == expected
    assert own(every)["core_rows"] > 0 and own(method)["core_rows"] > 0
    assert len(own(every)["core_weights_mean"]) == 2


@pytest.mark.parametrize("method_class,params_class,base", [(Gac, GacParams, {}), (Unite, UniteParams, {}),
                                                            (PackLLM, PackLLMParams, {}),
                                                            (Eva, EvaParams, {"overlap": "direct"})])
def test_core_changes_the_fusion(pair, method_class, params_class, base):
    """On members that disagree often, CoRE's weights move some greedy choice (the filter can
    fail only if the plug-in were not called)."""
    plain, _ = run(method_class, params_class, pair(), base)
    with_core, method = run(method_class, params_class, pair(), {**base, "core": True, "core_filter": "power",
                                                                   "core_alpha": 50.0})
    assert plain != with_core
    assert "core_rows" not in run(method_class, params_class, pair(), {})[1].info()


@pytest.mark.parametrize("case", ["gac", "unite", "packllm-mined"])
def test_core_on_ray_members_equals_local(ray_members, case):
    """The contract suite places each method's first parameter set in Ray; CoRE's here."""
    method_class, params_class, fields = CASES[case]
    local, remote = ray_members
    near = method_class(local, params_class(**fields), batch_size=2)
    far = method_class(remote, params_class(**fields), batch_size=2)
    assert outputs(far, REQUESTS[:3]) == outputs(near, REQUESTS[:3])
    keys = ("core_rows", "core_weights_mean", "core_mass_kept_mean")
    assert [own(far)[k] for k in keys] == [own(near)[k] for k in keys]
