"""``members[].trust_remote_code``: a model folder that ships its own Python code loads only when
the recipe allows it; otherwise the run stops with one line naming the setting."""

import json
import shutil
from pathlib import Path

import pytest

from ensemble_bench.errors import UserError
from ensemble_bench.members import load_member
from ensemble_bench.recipe import MemberSpec

CONFIG_CODE = '''from transformers import LlamaConfig


class CustomTinyConfig(LlamaConfig):
    model_type = "custom_tiny"
'''
MODEL_CODE = '''from transformers import LlamaForCausalLM

from .configuration_custom import CustomTinyConfig


class CustomTinyForCausalLM(LlamaForCausalLM):
    config_class = CustomTinyConfig
'''


@pytest.fixture()
def custom_code_dir(tiny_dirs, tmp_path) -> Path:
    """The tiny byte-level BPE model, re-declared as a custom architecture its folder defines."""
    folder = tmp_path / "custom-tiny"
    shutil.copytree(tiny_dirs[0], folder)
    (folder / "configuration_custom.py").write_text(CONFIG_CODE)
    (folder / "modeling_custom.py").write_text(MODEL_CODE)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="custom_tiny", architectures=["CustomTinyForCausalLM"],
                  auto_map={"AutoConfig": "configuration_custom.CustomTinyConfig",
                            "AutoModelForCausalLM": "modeling_custom.CustomTinyForCausalLM"})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_custom_code_is_refused_without_the_setting(custom_code_dir):
    with pytest.raises(UserError, match=r"cannot load model .*trust_remote_code") as err:
        load_member(str(custom_code_dir))
    assert "\n" not in str(err.value)


def test_custom_code_loads_with_the_setting_and_decodes_like_the_plain_model(custom_code_dir, tiny_dirs):
    custom = load_member(str(custom_code_dir), trust_remote_code=True)
    plain = load_member(tiny_dirs[0])
    assert type(custom.model).__name__ == "CustomTinyForCausalLM"
    prompt = [custom.encode("hello world")]
    assert custom.prefill(prompt).argmax(-1).tolist() == plain.prefill(prompt).argmax(-1).tolist()


def test_the_setting_is_off_by_default_and_reaches_the_loader():
    assert MemberSpec(model="x").load_kwargs()["trust_remote_code"] is False
    assert MemberSpec(model="x", trust_remote_code=True).load_kwargs()["trust_remote_code"] is True
