"""The registry and what a method declares on its class: the lead member's one name (the papers'
names as recipe aliases), one spelling of equal weights, one shared ``window``, typed run
statistics, and stored parameters of older runs read under today's names."""

import json

import pytest

from ensemble_bench.decoding.method import MethodParams, WindowParams
from ensemble_bench.methods import METHODS, RunStats, current_params, get_method, read_stats
from ensemble_bench.methods.gac import Gac, GacParams
from ensemble_bench.methods.sweetspan import SweetSpanParams
from ensemble_bench.methods.unite import UniteParams
from tests.tiny import REQUESTS

LEADING = [name for name, cls in METHODS.items() if cls.lead_param is not None]
WEIGHTED = [name for name, cls in METHODS.items() if cls.takes_weights()]


def test_the_lead_is_one_parameter_named_lead():
    assert set(LEADING) == {"gac", "unite", "deepen", "voting", "mbr", "rerank", "coolfusion", "sweetspan", "safe",
                            "byte_level", "lvr", "eva", "adafuse"}
    for name in LEADING:
        assert METHODS[name].lead_param == "lead" and "lead" in METHODS[name].Params.model_fields, name


@pytest.mark.parametrize("name, alias", [("unite", "primary"), ("deepen", "main"), ("voting", "main"),
                                         ("sweetspan", "main"), ("safe", "drafter"), ("byte_level", "main"),
                                         ("eva", "main")])
def test_the_papers_names_are_aliases_of_lead(name, alias):
    params = get_method(name).Params.model_validate({alias: "big"})
    assert params.lead == "big" and params.lead_spelling == alias
    assert params.model_dump()["lead"] == "big" and alias not in params.model_dump()
    assert get_method(name).Params.model_validate({"lead": 1}).lead_spelling == "lead"


def test_gacs_gate_is_its_lead_and_still_needs_a_threshold():
    assert GacParams.model_validate({"gate": "b", "threshold": 0.5}).lead == "b"
    with pytest.raises(ValueError, match="a gate needs a threshold"):
        GacParams.model_validate({"gate": "b"})
    assert GacParams.model_validate({"lead": "b"}).threshold is None  # the lead alone renders, no gate


@pytest.mark.parametrize("name", WEIGHTED)
def test_equal_weights_are_null_and_average_is_its_alias(name):
    params = get_method(name).Params
    assert params().weights is None
    assert params.model_validate({"weights": "average"}) == params()


def test_window_is_declared_once():
    declaring = {cls for method in METHODS.values() for cls in method.Params.__mro__
                 if "window" in cls.__dict__.get("__annotations__", {})}
    assert declaring == {WindowParams}
    assert {name for name, cls in METHODS.items() if "window" in cls.Params.model_fields} == {
        "gac", "unite", "deepen", "packllm", "chared", "safe", "eva"}


def test_samples_is_declared_by_the_methods_that_can_draw():
    greedy_only = {name for name, cls in METHODS.items() if not cls.samples}
    assert greedy_only == {"safe", "coolfusion", "sweetspan", "adafuse"}  # docs/sampling.md says why
    assert not any("temperature" in cls.Params.model_fields for cls in METHODS.values())  # one way to sample


def test_sweetspan_stores_lambda_under_its_name_and_reads_the_old_key():
    assert SweetSpanParams.model_validate({"lambda": 3.0}).model_dump()["lambda"] == 3.0
    assert current_params("sweetspan", {"filter_ratio": 3.0, "span_words": 2, "main": 1}) == {
        "lead": 1, "retokenize": "canonical", "span_words": 2, "lambda": 3.0}


def test_stored_params_of_older_runs_read_under_todays_names():
    old_gac = {"weights": "average", "scores": None, "ece": None, "gate": None, "threshold": None, "window": 4,
               "retokenize": "local", "temperature": 0.0, "seed": 0}
    assert current_params("gac", old_gac) == GacParams().model_dump(mode="json")
    assert current_params("unite", {"primary": 1, "k": 10, "weights": "average"}) == UniteParams(lead=1).model_dump()
    assert current_params("unite", {"k": "not a number"}) == {"k": "not a number"}  # kept as stored
    assert current_params("no-such-method", {"x": 1}) == {"x": 1}


def test_every_field_has_a_description():
    for name, cls in METHODS.items():
        for field_name, field in cls.Params.model_fields.items():
            assert field.description, f"{name}.{field_name}"
    assert MethodParams.model_fields == {}


def test_run_stats_round_trip_and_keep_the_report_keys(pair):
    members = pair()
    gac = Gac(members, GacParams(gate="a", threshold=0.5), batch_size=2)
    gac.generate(REQUESTS[:2])
    info = gac.info()
    stats = RunStats.from_json(info)
    assert stats.to_json() == info
    assert stats.method == "gac" and stats.tokens_generated > 0 and stats.decode_ms_per_token > 0
    assert 0 <= stats.ensembled_fraction <= 1 and stats.method_stats["union_size"] > 400
    assert {"decode_ms_per_token", "time_to_first_token_ms", "tokens_generated", "ensembled_fraction", "params",
            "contexts_truncated", "gac"} <= set(info)
    assert {"gate_index", "union_size", "tokens_ensembled"} <= set(info["gac"]) and "union_size" not in info  # its own
    assert "method_stats" not in info and "tokens_manipulated_per_step" not in info  # optional keys only when set


def test_a_methods_counter_never_shadows_a_shared_field():
    own = {"tokens_generated": -1, "ensembled_fraction": 0.25, "rounds": 3}
    stats = RunStats.of_method({"method": "x", "params": {}, "tokens_generated": 9}, own)
    assert stats.tokens_generated == 9 and stats.ensembled_fraction == 0.25
    assert stats.to_json()["x"] == {"tokens_generated": -1, "rounds": 3}
    assert RunStats.from_json(stats.to_json()) == stats


def test_read_stats_names_an_old_rows_params_as_today():
    old = {"label": "ss", "method": "sweetspan", "params": {"main": 0, "filter_ratio": 4.0}, "decode_ms_per_token": 2.5,
           "rounds": 7}
    stats = read_stats(old)
    assert stats.params["lambda"] == 4.0 and stats.params["lead"] == 0 and stats.method_stats == {"rounds": 7}
    assert stats.label == "ss" and stats.decode_ms_per_token == 2.5


def test_a_run_stored_with_the_papers_names_is_still_the_same_run(tiny_dirs, tmp_path):
    from ensemble_bench.recipe import parse_recipe
    from ensemble_bench.run.folder import PARAMS
    from ensemble_bench.run.runs import resolved_params, same_params

    recipe = parse_recipe({"name": "r", "members": [{"model": tiny_dirs[0], "name": "a"}, {"model": tiny_dirs[1],
                                                                                        "name": "b"}],
                           "method": {"name": "unite", "primary": "b"}, "singles": False, "tasks": ["piqa"]}, "r.yaml")
    stored = resolved_params(recipe)
    assert stored["unite"]["lead"] == "b"
    old = {"unite": {**{k: v for k, v in stored["unite"].items() if k != "lead"}, "primary": "b", "weights": "average"}}
    (tmp_path / PARAMS).write_text(json.dumps(old))
    assert same_params(tmp_path, recipe)
    (tmp_path / PARAMS).write_text(json.dumps({"unite": {**old["unite"], "primary": "a"}}))
    assert not same_params(tmp_path, recipe)
