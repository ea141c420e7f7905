"""The contract every registered method keeps, run over the registry (``METHODS``) with a table of
parameter sets per method (``CONTRACT_PARAMS``):

- identity: a member ensembled with itself gives exactly the member's own greedy output, in
  generation (text and token count) and in log-likelihood (greedy flags, and the values where the
  method's equations make them equal, ``SCORING_IDENTITY``);
- batch invariance: batch size 1 and 3 give the same outputs;
- Ray placement gives the results of local members (skipped without ray);
- ``info()`` is a typed run-statistics record (``RunStats``), as the reports read it;
- a lead member named by a label no member has is a one-line error.

A new method gets all of this by one entry in ``CONTRACT_PARAMS`` (and ``SCORING_IDENTITY``); a
guard test fails while it has none. Per-method test files keep only what is specific to a paper.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import fields
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest

from ensemble_bench.decoding.stats import MethodStats, RunStats
from ensemble_bench.errors import UserError
from ensemble_bench.members import LocalMember, Prompt
from ensemble_bench.methods import ALONE, METHODS, LoglikelihoodRequest, Method, MethodParams, get_method
from ensemble_bench.recipe import parse_recipe
from tests.tiny import CORPUS, REQUESTS, outputs
from tests.tolerances import TINY_MODEL, assert_close

# Per method, the smallest parameter sets that exercise each of its modes ("lead": the lead member).
# UniTE and DeePEn identity is exact under local feeding only (canonical feeding gives the other copy
# its own tokenizer's encoding: test_retokenize_feeding).
CONTRACT_PARAMS: dict[str, list[dict]] = {
    "single": [{}],
    "gac": [{}, {"weights": [0.3, 2.0]}, {"threshold": 0.5, "lead": 1}, {"speculative": 3, "proposer": 1},
            {"threshold": 0.5, "speculative": 4, "proposer": "auto"}, {"core": True},
            {"core": True, "core_rules": "official", "weights": [0.3, 2.0], "core_filter": "power"}],
    "unite": [{"retokenize": "local"}, {"retokenize": "local", "k": 1, "weights": [0.2, 0.8]},
              {"retokenize": "local", "k": 50, "lead": 1}, {"retokenize": "local", "speculative": 3},
              {"retokenize": "local", "core": True},
              {"retokenize": "local", "core": True, "core_token": False, "lead": 1}],
    "deepen": [{"retokenize": "local"}, {"retokenize": "local", "support": None, "eta": 0.3, "steps": 8},
               {"retokenize": "local", "support": 4, "lead": 1},
               {"retokenize": "local", "speculative": 2, "proposer": 1}],
    "voting": [{}, {"answer": "text", "lead": 1}],
    "mbr": [{}],
    "rerank": [{}],
    "coolfusion": [{}, {"align": False}, {"rerank": True, "lead": 1}],
    "sweetspan": [{"span_words": 1}, {"span_words": 4}, {"span_words": 32}],
    "packllm": [{}, {"variant": "opt", "ppl_unit": "byte"}, {"alignment": "union", "variant": "opt"},
                {"speculative": 3, "proposer": 1}, {"core": True},
                {"core": True, "alignment": "union", "core_model": False, "core_rules": "official"}],
    "chared": [{}, {"weights": [1.0, 3.0]}],
    "safe": [{}, {"draft_tokens": 1, "sharpen": 0.0, "gate_threshold": 0.5},
             {"lead": 1, "draft_tokens": 7, "weights": [1.0, 3.0], "candidate_floor": 0.0}],
    "byte_level": [{}, {"weights": [1.0, 4.0], "lead": 1}],
    "lvr": [{}, {"weights": [1.0, 4.0], "lead": 1}],
    "eva": [{"retokenize": "local", "overlap": "direct"}, {"retokenize": "local", "overlap": "direct", "n": None},
            {"retokenize": "local", "overlap": "direct", "top_k": 3, "n": 1, "lead": 1},
            {"retokenize": "local", "overlap": "direct", "speculative": 3, "proposer": 1},
            {"retokenize": "local", "overlap": "direct", "core": True},
            {"retokenize": "local", "overlap": "direct", "core": True, "core_token": False}],
    # exploration (beam_size > 1 in an uncertain state) may pick a non-greedy word even for one model:
    # identity holds without it (tests/methods/test_adafuse.py covers exploration)
    "adafuse": [{"beam_size": 1}, {"theta_delta": 0.0, "max_words": 2, "lead": 1},
                {"beam_size": 1, "commit_rule": "code", "theta_delta": 0.05},
                {"beam_size": 1, "word_unit": "whitespace", "theta_delta": 0.5}],
}

# What a member scored with itself keeps, by the method's equations: "values" (log-likelihoods
# equal the member's, greedy flags too), "flags" (greedy flags only: UniTE renormalises over the
# aligned top-k, DeePEn scores after its relative-space steps), "choice" (sample-level methods vote:
# the winning continuation of each question is the member's most likely one).
SCORING_IDENTITY: dict[str, str] = {
    "single": "values", "gac": "values", "unite": "flags", "deepen": "flags", "voting": "choice", "mbr": "choice",
    "rerank": "choice", "coolfusion": "values", "sweetspan": "values", "packllm": "values", "chared": "values",
    "safe": "values", "byte_level": "values", "lvr": "values", "eva": "flags", "adafuse": "values",
}

def params_of(cls: type[Method], entry: dict) -> MethodParams:
    """Params from a table entry, as a recipe's ``method`` block gives them."""
    return cls.Params.model_validate(entry)


def conforms(value: Any, hint: Any) -> bool:
    """Whether a JSON value is of a declared field type (float takes an int; bool is no number)."""
    if hint is Any:
        return True
    if get_origin(hint) in (Union, UnionType):
        return any(conforms(value, option) for option in get_args(hint))
    if hint is type(None):
        return value is None
    if hint in (int, float):
        return isinstance(value, int if hint is int else (int, float)) and not isinstance(value, bool)
    return isinstance(value, get_origin(hint) or hint)


def check_run_stats(info: dict) -> None:
    """``info()`` is the JSON form of a ``RunStats`` record (what the reports read): read back whole,
    every field of its declared type, JSON values only (the runner writes it to timing.json)."""
    stats = RunStats.from_json(info)
    assert stats.to_json() == info
    json.dumps(info)
    hints = get_type_hints(RunStats)
    for field in fields(RunStats):
        assert conforms(getattr(stats, field.name), hints[field.name]), (field.name, getattr(stats, field.name))
    assert stats.ensembled_fraction is None or 0 <= stats.ensembled_fraction <= 1
    assert all(x is None or (math.isfinite(x) and x >= 0) for x in (
        stats.decode_ms_per_token, stats.time_to_first_token_ms, stats.tokens_manipulated_per_step))


def cases(keep=lambda cls: True) -> list:
    """(method name, parameter set index) of every table entry whose method ``keep`` accepts."""
    return [pytest.param(name, i, id=f"{name}-{i}") for name, sets in CONTRACT_PARAMS.items()
            if name in METHODS and keep(METHODS[name]) for i in range(len(sets))]


def ensembles(cls: type[Method]) -> bool:
    return not cls.alone


def build(name: str, index: int, members: Sequence, batch_size: int) -> Method:
    cls = get_method(name)
    return cls(members[:cls.max_members] if cls.max_members else members, params_of(cls, CONTRACT_PARAMS[name][index]),
               batch_size=batch_size)


def alone_name(cls: type[Method]) -> str:
    """What the member by itself is for a method: the method over it when it takes one member
    (CharED and byte-level decode character- and byte-wise), else the member alone."""
    return cls.name if cls.min_members == 1 and not cls.alone else ALONE


# Four questions, three continuations each (lengths 1, 6 and 15 characters).
SCORED = [LoglikelihoodRequest(Prompt(text=CORPUS[i][:30]), CORPUS[i][30:30 + n]) for i in range(4) for n in (1, 6, 15)]


# ------------------------------------------------------------------ shared members
@pytest.fixture(scope="module", params=["bpe", "sp"])
def twins(request):
    """One tiny model (byte-level BPE, then SentencePiece): the member alone and two copies of it."""
    tokenizer = request.getfixturevalue(f"{request.param}_tokenizer")
    model = request.getfixturevalue(f"{request.param}_model")
    return LocalMember(model, tokenizer, "solo"), [LocalMember(model, tokenizer, name) for name in ("a", "b")]


@pytest.fixture(scope="module")
def mixed(pair):
    """Two members with different tokenizers."""
    return pair()


@pytest.fixture(scope="module")
def by_itself(twins):
    """The member's own outputs, per ``alone_name``: (generations, scores), each computed once."""
    solo, _ = twins
    found: dict[str, tuple] = {}

    def outputs_of(cls: type[Method]) -> tuple:
        name = alone_name(cls)
        if name not in found:
            method = get_method(name)([solo], get_method(name).Params(), batch_size=3)
            found[name] = outputs(method), method.loglikelihood(SCORED)
        return found[name]
    return outputs_of


@pytest.fixture(scope="module", autouse=True)
def own_cache(tmp_path_factory):
    """PackLLM's MinED maps go to a folder of this module's own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ENSBENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


# ------------------------------------------------------------------ the table covers the registry
def test_every_registered_method_has_a_contract_entry():
    assert set(CONTRACT_PARAMS) == set(METHODS), "add the method's parameter sets to CONTRACT_PARAMS"
    assert set(SCORING_IDENTITY) == set(METHODS), "say what scoring with itself keeps in SCORING_IDENTITY"
    for name, sets in CONTRACT_PARAMS.items():
        assert sets, name
        for entry in sets:
            params_of(METHODS[name], entry)  # every entry is a valid parameter set


# ------------------------------------------------------------------ identity
@pytest.mark.parametrize("name,index", cases(ensembles))
def test_member_with_itself_is_the_member_alone(twins, by_itself, name, index):
    assert outputs(build(name, index, twins[1], batch_size=3)) == by_itself(METHODS[name])[0]


@pytest.mark.parametrize("name,index", cases(ensembles))
def test_scoring_with_itself_keeps_the_members_scores(twins, by_itself, name, index):
    expected = by_itself(METHODS[name])[1]
    got = build(name, index, twins[1], batch_size=3).loglikelihood(SCORED)
    kind = SCORING_IDENTITY[name]
    if kind == "choice":
        best = [max(range(q, q + 3), key=lambda i: expected[i].logprob) for q in range(0, len(SCORED), 3)]
        assert [s.is_greedy for s in got] == [i in best for i in range(len(SCORED))]
        return
    assert [s.is_greedy for s in got] == [s.is_greedy for s in expected]
    assert all(s.logprob <= TINY_MODEL.abs for s in got)  # log P <= 0
    if kind == "values":
        assert_close([s.logprob for s in got], [s.logprob for s in expected], TINY_MODEL)


# ------------------------------------------------------------------ parameters inert on choices
def without_inert(name: str, entry: dict) -> dict:
    return {key: value for key, value in entry.items() if key not in METHODS[name].inert_on_choices}


INERT_CASES = [pytest.param(name, i, id=f"{name}-{i}") for name, sets in CONTRACT_PARAMS.items()
               for i, entry in enumerate(sets) if without_inert(name, entry) != entry]


def test_what_each_method_declares_inert_on_choices_is_its_own_parameters():
    for cls in METHODS.values():
        assert cls.inert_on_choices <= set(cls.Params.model_fields), cls.name
        assert not cls.inert_on_choices or cls.choice_scoring, cls.name  # the plan's note says how it scores instead
    assert {"gac", "packllm", "sweetspan", "safe"} <= {name for name, _ in (p.values for p in INERT_CASES)}


@pytest.mark.parametrize("name,index", INERT_CASES)
def test_parameters_declared_inert_on_choices_leave_the_choice_scores_as_they_are(mixed, name, index):
    """What the plan's note says (issue 47: core: true on multiple choice for GaC): setting them changes
    no option's score."""
    cls, entry = METHODS[name], CONTRACT_PARAMS[name][index]
    plain = cls(mixed, params_of(cls, without_inert(name, entry)), batch_size=3).loglikelihood(SCORED)
    assert cls(mixed, params_of(cls, entry), batch_size=3).loglikelihood(SCORED) == plain


# ------------------------------------------------------------------ batch invariance
@pytest.mark.parametrize("name,index", cases())
def test_batch_size_does_not_change_outputs(mixed, name, index):
    one, three = build(name, index, mixed, batch_size=1), build(name, index, mixed, batch_size=3)
    assert outputs(one) == outputs(three)
    scored_one, scored_three = one.loglikelihood(SCORED), three.loglikelihood(SCORED)
    assert [s.is_greedy for s in scored_one] == [s.is_greedy for s in scored_three]
    assert_close([s.logprob for s in scored_one], [s.logprob for s in scored_three], TINY_MODEL)


# ------------------------------------------------------------------ run statistics
@pytest.mark.parametrize("name", [name for name in CONTRACT_PARAMS if name in METHODS])
def test_info_holds_the_run_statistics_the_reports_read(mixed, name):
    method = build(name, 0, mixed, batch_size=2)
    method.loglikelihood(SCORED[:3])
    check_run_stats(method.info())  # a multiple-choice run: nothing generated
    generations = method.generate(REQUESTS[:2])
    info = method.info()
    check_run_stats(info)
    assert info["params"] == json.loads(method.params.model_dump_json())
    assert info["tokens_generated"] > 0 and sum(g.new_tokens for g in generations) > 0
    # ms/token as the reports read it: decode steps, or the first round's time per token where every
    # request finished in its first round (a span method whose first segment reached the budget)
    assert info["time_to_first_token_ms"] is not None
    assert info["decode_ms_per_token"] is not None or (info["decode_steps"] == 0
                                                       and info["first_round_ms_per_token"] is not None)
    own = method.statistics()  # a dataclass the method declares, under its name; none for a member alone
    assert isinstance(own, MethodStats) or own == {}, type(own)
    assert info.get(name, {}) == RunStats.of_method({"method": name, "params": {}}, own).method_stats



# ------------------------------------------------------------------ a bad lead member
@pytest.mark.parametrize("name", [name for name in CONTRACT_PARAMS if name in METHODS and METHODS[name].lead_param])
def test_a_lead_member_no_member_has_is_one_line(tiny_dirs, name):
    field = METHODS[name].lead_param
    members = [{"model": path, "name": label} for path, label in zip(tiny_dirs, ("a", "b"))]
    recipe = {"name": "r", "members": members, "method": {"name": name, field: "nobody"}, "tasks": ["piqa"],
              "data": "offline"}
    with pytest.raises(UserError) as info:
        parse_recipe(recipe, "r.yaml")
    line = str(info.value)
    assert "\n" not in line and line.startswith("r.yaml: ") and f"{field}: 'nobody' is not a member" in line, line


# ------------------------------------------------------------------ Ray placement
def without_clocks(info: dict) -> dict:
    """``info()`` without its clock readings (the method's own statistics too)."""
    return {key: without_clocks(value) if key == info.get("method") else value for key, value in info.items()
            if "_ms" not in key and "seconds" not in key}


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name in CONTRACT_PARAMS if name in METHODS])
def test_ray_placement_equals_local(ray_members, name):
    """Each method with its first parameter set: a remote member answers every call as a local one."""
    local, remote = ray_members
    near, far = build(name, 0, local, batch_size=2), build(name, 0, remote, batch_size=2)
    assert outputs(far, REQUESTS[:3]) == outputs(near, REQUESTS[:3])
    assert far.loglikelihood(SCORED[:3]) == near.loglikelihood(SCORED[:3])
    assert without_clocks(far.info()) == without_clocks(near.info())
    assert getattr(far, "traces", None) == getattr(near, "traces", None)  # span_trace.jsonl (runner)


def takes_speculation(cls: type[Method]) -> bool:
    from ensemble_bench.decoding.speculative import SpeculativeParams

    return issubclass(cls.Params, SpeculativeParams)


@pytest.mark.parametrize("name", [name for name in CONTRACT_PARAMS if name in METHODS
                                  and takes_speculation(METHODS[name])])
def test_a_speculative_method_declares_the_interface_and_is_never_patched(mixed, name):
    """A method that takes ``speculative`` is a ``Speculable`` (decoding/speculative.py), and decoding
    speculatively leaves its own members, feeders and their members as they were (stand-ins are
    passed to a view of it, ``speaking_to``, never swapped into it). Every hook takes the arguments
    the engine passes."""
    from ensemble_bench.decoding.speculative import Speculable, unmet

    index = next(i for i, p in enumerate(CONTRACT_PARAMS[name]) if p.get("speculative"))
    method = build(name, index, mixed, batch_size=2)
    assert isinstance(method, Speculable) and unmet(method) == []
    assert method.speculation is not None
    members, feeders = list(method.members), list(method.feeders)
    fed_members = [feeder and feeder.member for feeder in feeders]
    outputs(method, REQUESTS[:2])
    assert method.members == members and method.feeders == feeders
    assert [feeder and feeder.member for feeder in method.feeders] == fed_members
    assert all(member is original for member, original in zip(method.members, mixed))
