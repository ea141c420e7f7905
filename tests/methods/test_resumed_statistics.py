"""A resumed row's statistics (sittings.py): a row computed in three sittings, each starting from the
counters the one before saved (``Method.carried``), reports what one uninterrupted sitting reports, for every
registered method, on tiny models.

Left out of the comparison: times (they differ between any two runs). The lists of request records
(speculation's ``speculative_rows``, PackLLM's ``packllm_prompt_weights``) are compared too: the first
sitting's records come first.
"""

from __future__ import annotations

import pytest

from ensemble_bench.decoding.speculation_stats import SteadyCosts, SteadyPace
from ensemble_bench.members import Prompt
from ensemble_bench.methods import METHODS, LoglikelihoodRequest, get_method
from ensemble_bench.run.sittings import resume_counts, save_counts, snapshot
from tests.tiny import CORPUS, REQUESTS, outputs
from tests.tolerances import FLOAT64_SUMS

# Per method, parameters under which it keeps the counters it can keep (the gate, CoRE, speculation).
PARAMS: dict[str, dict] = {
    "gac": {"threshold": 0.5, "speculative": 4, "proposer": 0},
    "gac-core": {"core": True},
    "unite": {"retokenize": "local", "k": 5, "speculative": 4, "proposer": 0, "core": True},
    "deepen": {"speculative": 4, "proposer": 1},
    "deepen-support": {"support": 4},  # the bounds decide some rows, not all or none
    "eva": {"top_k": 20, "speculative": 4, "proposer": 0},
    "eva-core": {"top_k": 20, "core": True},
    "packllm": {"alignment": "union", "speculative": 4, "proposer": 0, "core": True},
    "packllm-mined": {"variant": "opt"},
    "safe": {"draft_tokens": 3, "gate_threshold": 0.5},
    "adafuse": {"theta_delta": 0.5, "max_words": 2},
    "sweetspan": {"span_words": 2},
}
TIMES = {"decode_ms_per_token", "time_to_first_token_ms", "first_round_ms_per_token",
         "packllm_prompt_scoring_ms_per_request"}
# Four questions of three continuations each: a sitting ends between two questions.
SCORED = [LoglikelihoodRequest(Prompt(text=CORPUS[i][:30]), CORPUS[i][30:30 + n]) for i in range(4) for n in (1, 6, 15)]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """The union and MinED maps go to a folder of the test's own."""
    monkeypatch.setenv("ENSBENCH_CACHE", str(tmp_path / "cache"))


def counted(info: dict, name: str) -> dict:
    """A row's statistics without its times."""
    own = {key: value for key, value in info.get(name, {}).items() if key not in TIMES}
    return {**{key: value for key, value in info.items() if key not in TIMES | {name}}, name: own}


@pytest.mark.parametrize("case", sorted(set(METHODS) | set(PARAMS)))
def test_two_sittings_report_what_one_reports(pair, case, tmp_path):
    name = case.split("-")[0]
    cls = get_method(name)
    params = cls.Params.model_validate(PARAMS.get(case, {}))

    def sitting(requests, scored, earlier=None):
        members = pair()
        method = cls(members[:cls.max_members] if cls.max_members else members, params, batch_size=1)
        if getattr(method, "speculation", None) is not None:
            # draft lengths that do not depend on the machine's load
            method.speculation.costs, method.speculation.pace = SteadyCosts(), SteadyPace()
        if earlier is not None:
            resume_counts(method.carried(), earlier)
        for request in requests:  # a chunk at a time, as the runner feeds a row (lm.py): records in that order
            outputs(method, [request])
        if scored:
            method.loglikelihood(scored)
        return method

    whole = sitting(REQUESTS, SCORED)
    db = tmp_path / "row_rank0.db"
    db.write_bytes(b"")  # the response cache the statistics file belongs to
    # three sittings, each request kind in the order one sitting takes them: ended in the generations, then
    # between two questions of the scoring
    save_counts(sitting(REQUESTS[:2], []).carried(), db)
    save_counts(sitting(REQUESTS[2:], SCORED[:6], earlier=db).carried(), db)
    resumed = sitting([], SCORED[6:], earlier=db)
    assert whole.info()["tokens_generated"] > 0
    # the counters themselves (a ratio such as a bound's decided fraction can be equal by chance), and the report
    for got, expected in ((counters(resumed), counters(whole)),
                          (leaves(counted(resumed.info(), name)), leaves(counted(whole.info(), name)))):
        assert got.keys() == expected.keys()
        assert {key: value for key, value in got.items() if not same(value, expected[key])} == {}, expected


def counters(method) -> dict:
    """What the method carries to a next sitting, by path, less the seconds (they differ between runs)."""
    return {key: value for key, value in leaves(snapshot(method.carried())).items() if "seconds" not in key}


def leaves(value, key: str = "") -> dict:
    """Every number, string or None of a statistics dict by its path (``gac.core_weights_mean.1``)."""
    if isinstance(value, dict | list | tuple):  # a record's tuple comes back from JSON as a list
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return {path: leaf for k, v in items for path, leaf in leaves(v, f"{key}.{k}" if key else str(k)).items()}
    return {key: value}


def same(got, expected) -> bool:
    """Equal; floats to rounding: each sitting computes its requests longest first, so a sum of floats over
    the requests adds them in another order than one sitting does."""
    if isinstance(got, float) and isinstance(expected, float):
        return FLOAT64_SUMS.holds(got, expected)
    return got == expected and type(got) is type(expected)


def test_gacs_greedy_bound_is_carried(pair):
    """Its decided fraction is 1.0 on the tiny models in any sitting: the report alone would not show it lost."""
    method = get_method("gac")(pair(), get_method("gac").Params())
    assert any(holder is method.mixture.bound for holder in method.carried().values())


@pytest.mark.parametrize("name", ["gac", "voting"])
def test_a_resumed_row_counts_the_contexts_every_sitting_cut(pair, name, tmp_path):
    """``contexts_truncated`` (counted by the members, which serve several rows) adds up the sittings too."""
    cls = get_method(name)

    def sitting(scored, earlier=None):
        members = pair()
        for member in members:
            member.max_length = 8  # shorter than the scored contexts: requests are cut
        method = cls(members, cls.Params(), batch_size=1)
        if earlier is not None:
            resume_counts(method.carried(), earlier)
        method.loglikelihood(scored)
        return method

    whole = sitting(SCORED).info()["contexts_truncated"]
    db = tmp_path / "row_rank0.db"
    db.write_bytes(b"")
    save_counts(sitting(SCORED[:6]).carried(), db)
    resumed = sitting(SCORED[6:], earlier=db).info()["contexts_truncated"]
    assert set(whole) == {"a", "b"} and min(whole.values()) > 0
    assert resumed == whole
