"""``backend: vllm`` in recipes: the schema's one-line refusals and the dry run's (no vllm needed)."""

import pytest

from ensemble_bench import preflight
from ensemble_bench.errors import UserError, lines_of
from ensemble_bench.recipe import parse_recipe
from ensemble_bench.row_store import _member


def recipe(tmp_path, members, method="gac", **extra):
    data = {"name": "v", "members": members, "method": method, "tasks": ["nq"], "data": "offline",
            "output": str(tmp_path), **extra}
    return parse_recipe(data, "r.yaml")


PAIR = [{"model": "smollm2-135m", "backend": "vllm", "vllm": {"max_model_len": 512}}, {"model": "qwen2.5-0.5b"}]


@pytest.mark.parametrize("member, expected", [
    ({"model": "smollm2-135m", "vllm": {"max_model_len": 512}}, "vllm: engine arguments need backend: vllm"),
    ({"model": "smollm2-135m", "backend": "vllm", "device_map": "auto"}, "backend vllm: device_map is a transformers"),
    ({"model": "smollm2-135m", "backend": "vllm", "quantization": "8bit"}, "backend vllm: quantization is a"),
    ({"model": "smollm2-135m", "backend": "vllm", "vllm": {"tensor_parallel_size": 0}}, "greater than or equal to 1"),
    ({"model": "smollm2-135m", "backend": "vllm", "vllm": {"max_model_len": 512, "swap": 4}}, "swap"),
    ({"model": "smollm2-135m", "backend": "sglang"}, "backend"),
])
def test_bad_vllm_members_are_one_line(tmp_path, member, expected):
    with pytest.raises(UserError) as info:
        recipe(tmp_path, [member], method="single")
    [line] = lines_of(info.value)
    assert expected in line, line


def test_vllm_members_run_in_this_process_not_in_ray_actors(tmp_path):
    with pytest.raises(UserError, match="backend vllm members run in this process"):
        recipe(tmp_path, PAIR, placement={"kind": "ray"})


def test_the_dry_run_refuses_block_reads_on_vllm_members(tmp_path, monkeypatch):
    """Speculative GaC and SAFE need ``read_block``, which a vLLM member does not give: one line each,
    before anything loads; every-token GaC passes."""
    monkeypatch.setattr(preflight, "_installed", lambda package: True)
    assert preflight.preflight(recipe(tmp_path, PAIR), "r.yaml") == []
    for method in ({"name": "gac", "speculative": 4}, {"name": "safe"}):
        with pytest.raises(UserError) as info:
            preflight.preflight(recipe(tmp_path, PAIR, method=method), "r.yaml")
        [line] = lines_of(info.value)
        assert f"method '{method['name']}' needs block reads (read_block), which vLLM members do not give" in line


def test_the_dry_run_names_a_missing_vllm_package(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "_installed", lambda package: package != "vllm")
    with pytest.raises(UserError, match="backend: vllm needs the vllm package"):
        preflight.preflight(recipe(tmp_path, PAIR), "r.yaml")


def test_row_keys_of_transformers_members_are_unchanged_and_vllm_members_differ(tmp_path):
    plain, on_vllm = recipe(tmp_path, PAIR).members[1], recipe(tmp_path, PAIR).members[0]
    assert "backend" not in _member(plain) and "vllm" not in _member(plain)
    assert _member(on_vllm)["backend"] == "vllm" and _member(on_vllm)["vllm"]["max_model_len"] == 512
