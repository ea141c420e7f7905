"""A recipe member's ``vllm:`` section (``backend: vllm``, docs/backends.md)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


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
