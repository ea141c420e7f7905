"""Packaged GGUF models are de-quantised once into a verified transformers folder (members/converted.py)."""

from __future__ import annotations

import json
import os

import pytest
import torch
import transformers

from ensemble_bench import members
from ensemble_bench.members import converted, sources
from tests.run.test_cache_integrity import fake_packaged  # noqa: F401 - a fixture
from tests.tiny import byte_bpe_tokenizer, tiny_llama


@pytest.fixture()
def fake_gguf(fake_packaged, monkeypatch):  # noqa: F811
    """The fake packaged model "converts" to a tiny Llama carrying GGUF's quantizer markers; the list
    counts the conversions (from_pretrained with a gguf_file)."""
    model, _, _ = fake_packaged
    tokenizer = byte_bpe_tokenizer()
    conversions = []
    original = transformers.AutoModelForCausalLM.from_pretrained

    def from_pretrained(location, *args, gguf_file=None, dtype=None, **kwargs):
        if gguf_file is None:
            return original(location, *args, dtype=dtype, **kwargs)
        conversions.append(dtype)
        weights = tiny_llama(len(tokenizer), seed=3).to(dtype)
        weights.hf_quantizer = object()  # what a GGUF-loaded model carries; save_pretrained would use it
        weights.config.quantization_config = {"quant_method": "gguf"}
        return weights

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(members.loading, "load_tokenizer", lambda source, trust_remote_code=False: tokenizer)
    return model, conversions, tokenizer


def _logits(model, tokenizer) -> torch.Tensor:
    ids = torch.tensor([tokenizer.encode("The quick brown fox")])
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_packaged_model_is_converted_once_and_loads_the_same_weights(fake_gguf):
    model, conversions, tokenizer = fake_gguf
    first = members.load_member(model.name)
    second = members.load_member(model.name)
    assert conversions == [torch.float32]  # converted once, in float32, whatever dtype is asked for
    folder = converted.converted_folder(model)
    marker = json.loads((folder / converted.MARKER).read_text())
    assert marker["source_sha256"] == model.sha256 and {"model.safetensors", "config.json"} <= set(marker["files"])
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    modes = {path.name: path.stat().st_mode & 0o777 for path in folder.iterdir() if not path.name.startswith(".")}
    assert set(modes.values()) == {modes["config.json"]}, modes  # the weights are not left private
    direct = _logits(tiny_llama(len(tokenizer), seed=3), tokenizer)
    assert torch.equal(_logits(first.model, tokenizer), direct)
    assert torch.equal(_logits(second.model, tokenizer), direct)


def test_the_recipe_dtype_applies_to_the_converted_weights(fake_gguf, tmp_path):
    model, conversions, tokenizer = fake_gguf
    members.load_member(model.name)
    half = members.load_member(model.name, dtype="bfloat16")
    assert conversions == [torch.float32] and half.model.dtype == torch.bfloat16
    tiny_llama(len(tokenizer), seed=3).save_pretrained(tmp_path / "float32")  # what the GGUF de-quantises to,
    direct = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "float32", dtype=torch.bfloat16)  # in bf16
    assert torch.equal(_logits(half.model, tokenizer), _logits(direct, tokenizer))


def test_another_transformers_conversion_stays_and_this_one_goes_beside_it(fake_gguf):
    """Two environments (the main one, .venv-vllm with transformers <5.20) each keep their own
    conversion: neither overwrites the other's folder on every load."""
    model, conversions, tokenizer = fake_gguf
    members.load_member(model.name)
    folder = converted.converted_folder(model)
    marker = json.loads((folder / converted.MARKER).read_text())
    (folder / converted.MARKER).write_text(json.dumps({**marker, "transformers": "0.0.1"}))
    members.load_member(model.name)
    members.load_member(model.name)
    assert conversions == [torch.float32, torch.float32]
    assert json.loads((folder / converted.MARKER).read_text())["transformers"] == "0.0.1"
    beside = folder.with_name(f"{folder.name}-transformers-{converted._transformers_version()}")
    assert converted.usable(beside, model) and converted.usable(folder, model, any_transformers=True)


@pytest.mark.parametrize("damage", ["same-size bytes", "missing file"])
def test_a_damaged_converted_folder_is_converted_again(fake_gguf, caplog, damage):
    model, conversions, tokenizer = fake_gguf
    members.load_member(model.name)
    folder = converted.converted_folder(model)
    weights = folder / "model.safetensors"
    if damage == "same-size bytes":
        weights.write_bytes(os.urandom(weights.stat().st_size))
    else:
        (folder / "config.json").unlink()
    again = members.load_member(model.name)
    assert conversions == [torch.float32, torch.float32]
    assert f"{folder}: not the packaged model's converted weights" in caplog.text
    assert torch.equal(_logits(again.model, tokenizer), _logits(tiny_llama(len(tokenizer), seed=3), tokenizer))
    assert converted.usable(folder, model)


def test_an_unwritable_cache_loads_from_the_gguf(fake_gguf, monkeypatch, caplog):
    model, conversions, tokenizer = fake_gguf

    def refuse(target):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(converted, "atomic_folder", refuse)
    source = sources.resolve(model.name)
    assert converted.converted_source(model, source, tokenizer) == source
    assert "cannot keep the converted weights (Permission denied)" in caplog.text
    assert not converted.converted_folder(model).exists()


def test_a_second_check_of_the_folder_reads_no_file_again(fake_gguf, monkeypatch):
    model, _, _ = fake_gguf
    members.load_member(model.name)
    monkeypatch.setattr("ensemble_bench.cache.file_sha256", lambda path: pytest.fail(f"{path} hashed again"))
    assert converted.usable(converted.converted_folder(model), model)


def test_loading_is_announced_and_the_first_load_says_it_converts(fake_gguf):
    model, _, _ = fake_gguf
    heard = []
    with members.load_listener(lambda name, event: heard.append((name, event))):
        members.load_member(model.name, name="fake")
        members.load_member(model.name, name="fake")
    assert heard == [("fake", "loading"), ("fake", members.CONVERTING), ("fake", "loaded"),
                     ("fake", "loading"), ("fake", "loaded")]
    members.load_member(model.name)  # no listener outside the block
    assert len(heard) == 5


@pytest.mark.integration
def test_smollm2_from_its_converted_folder_gives_the_gguf_logits(tmp_path, monkeypatch):
    """The real packaged SmolLM2: logits from the converted folder equal those of the GGUF loaded
    directly, in float32 and in bfloat16."""
    gguf = sources.resolve("smollm2-135m")
    monkeypatch.setenv("ENSBENCH_CACHE", str(tmp_path))
    tokenizer = members.load_tokenizer(gguf)
    for dtype in ("float32", "bfloat16"):
        cached = members.load_member("smollm2-135m", dtype=dtype)
        direct = transformers.AutoModelForCausalLM.from_pretrained(gguf.location, gguf_file=gguf.gguf_file,
                                                                    dtype=getattr(torch, dtype))
        assert torch.equal(_logits(cached.model, tokenizer), _logits(direct, tokenizer))
    assert converted.usable(converted.converted_folder(sources.PACKAGED["smollm2-135m"]),
                            sources.PACKAGED["smollm2-135m"])
