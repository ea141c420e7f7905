"""``backend: vllm`` in recipes: the schema's one-line refusals and the dry run's (no vllm needed)."""

from types import SimpleNamespace

import pytest

from ensemble_bench.errors import UserError, lines_of
from ensemble_bench.members.vllm import VllmMember
from ensemble_bench.recipe import parse_recipe
from ensemble_bench.run import preflight
from ensemble_bench.run.row_store import _member
from ensemble_bench.run.setup import run_setup


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


def test_vllm_members_are_placed_in_ray_actors_and_replicas(tmp_path):
    """Placement ray puts each vLLM member's engine in its own actor (tests/members/test_vllm.py runs them)."""
    for placement in ({"kind": "ray"}, {"kind": "ray", "replicas": 2}):
        assert recipe(tmp_path, PAIR, placement=placement).placement.kind == "ray"


def test_a_tensor_parallel_vllm_member_stays_out_of_ray_actors_in_one_line(tmp_path):
    members = [{**PAIR[0], "vllm": {"tensor_parallel_size": 2}}, PAIR[1]]
    recipe(tmp_path, members)  # placement local takes it
    with pytest.raises(UserError) as info:
        recipe(tmp_path, members, placement={"kind": "ray"})
    [line] = lines_of(info.value)
    assert "backend vllm: tensor_parallel_size above 1 is not run in a Ray actor" in line, line


def test_the_dry_run_passes_block_reads_on_vllm_members(tmp_path, monkeypatch):
    """Speculative GaC and SAFE read blocks, which vLLM members give (one forced step per token)."""
    monkeypatch.setattr(preflight, "_installed", lambda package: True)
    for method in ("gac", {"name": "gac", "speculative": 4}, {"name": "safe"}):
        assert run_setup(recipe(tmp_path, PAIR, method=method), "r.yaml", dry_run=True).problems == ()


@pytest.mark.parametrize("held, tokens, fits", [
    ([31, 31], [[], []], True),            # 2 rows of 31 tokens + 1 to compute: one block each
    ([31, 32], [[], []], False),           # the second row's next token needs a third block
    ([20, 10], [[1] * 11, [2] * 21], True),
    ([20, 10], [[1] * 12, [2] * 21], False),
])
def test_a_step_outgrowing_the_kv_cache_is_refused_in_one_line(held, tokens, fits):
    """A vLLM member refuses a step whose rows would not fit its KV cache (vLLM would preempt a row
    and the steered step would wait for it forever): 2 blocks of 32 tokens here."""
    member = SimpleNamespace(name="m", kv_blocks=2, block_size=32)
    if fits:
        VllmMember._check_room(member, tokens, held)
        return
    with pytest.raises(UserError) as info:
        VllmMember._check_room(member, tokens, held)
    [line] = lines_of(info.value)
    assert "member 'm': its vLLM KV cache holds 64 tokens (2 blocks of 32)" in line
    assert "raise vllm.kv_cache_gib" in line


def test_the_dry_run_names_a_missing_vllm_package(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "_installed", lambda package: package != "vllm")
    with pytest.raises(UserError, match="backend: vllm needs the vllm package"):
        run_setup(recipe(tmp_path, PAIR), "r.yaml", dry_run=True)


def test_row_keys_of_transformers_members_are_unchanged_and_vllm_members_differ(tmp_path):
    plain, on_vllm = recipe(tmp_path, PAIR).members[1], recipe(tmp_path, PAIR).members[0]
    assert "backend" not in _member(plain) and "vllm" not in _member(plain)
    assert _member(on_vllm)["backend"] == "vllm" and _member(on_vllm)["vllm"]["max_model_len"] == 512


def test_engine_start_drops_only_the_tokenizer_warmup_record():
    """vLLM's chat-template warm-up fails under skip_tokenizer_init and logs a traceback: that record
    is dropped while an engine starts; any other record of the renderer's logger passes."""
    import logging
    import sys

    from ensemble_bench.members.vllm_loading import without_tokenizer_warmup_warning

    def record(message, error):
        try:
            raise error
        except ValueError:
            info = sys.exc_info()
        return logging.LogRecord("vllm.renderers.base", logging.WARNING, "base.py", 380, message, None, info)

    renderer = logging.getLogger("vllm.renderers.base")
    skipped = ValueError("Tokenizer not available when `skip_tokenizer_init=True`")
    warmup = record("Chat template warmup failed", skipped)
    other = record("Chat template warmup failed", ValueError("a template that does not parse"))
    with without_tokenizer_warmup_warning():
        assert not renderer.filter(warmup)
        assert renderer.filter(other)
    assert renderer.filter(warmup)


def test_a_single_process_engine_is_built_for_drafted_steps(tmp_path):
    """The engine arguments of a member whose model runs in this process: vLLM's n-gram speculative
    decoding (its proposer is replaced by the steering's), synchronous scheduling (drafts are taken
    after each step), no custom logits processor (vLLM refuses one beside speculative decoding)."""
    from ensemble_bench.members.vllm_loading import MAX_DRAFTS, engine_arguments

    arguments = engine_arguments(tmp_path, "float32", "cpu", {}, window=2048)
    assert arguments["speculative_config"] == {"method": "ngram", "num_speculative_tokens": MAX_DRAFTS,
                                               "prompt_lookup_min": 1, "prompt_lookup_max": 1}
    assert arguments["async_scheduling"] is False
    assert "logits_processors" not in arguments
    assert arguments["block_size"] == 32 and arguments["max_num_batched_tokens"] == 2048 * 8
