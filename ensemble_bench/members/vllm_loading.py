"""Starting a vLLM member's engine (members/vllm.py): vLLM's arguments from a recipe's ``vllm:`` and the
CPU defaults, the one warning its start logs that does not apply, and a KV cache too small for the
window as one line."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from ensemble_bench.errors import UserError
from ensemble_bench.members.vllm import VllmMember
from ensemble_bench.members.vllm_engine import processor_class

CPU_KV_CACHE_GIB = 1  # the KV cache of a CPU engine when neither kv_cache_gib nor VLLM_CPU_KVCACHE_SPACE says
MAX_DRAFTS = 8  # a row's queued tokens one engine step takes after the one it forces (drafted steps)
CPU_BLOCK_SIZE = 32   # CPU default 128 caches no prefix shorter than 128 tokens
DEFAULT_WINDOW = 4096  # max_model_len when the recipe gives none: at most the model's own window


def engine_arguments(folder: Path, dtype: str, device: str, args: dict, window: int) -> dict:
    """vLLM's ``LLM`` arguments for a member (recipe ``vllm:`` pass-through, CPU defaults)."""
    max_model_len = args.get("max_model_len") or min(window, DEFAULT_WINDOW)
    max_num_seqs = args.get("max_num_seqs") or 8
    arguments = {"model": str(folder), "tokenizer": str(folder), "dtype": dtype, "seed": 0,
                 "max_model_len": max_model_len, "max_num_seqs": max_num_seqs,
                 "max_num_batched_tokens": max_model_len * max_num_seqs,  # a whole batch's prompts in one step
                 "enable_chunked_prefill": False, "enable_prefix_caching": True,
                 "enforce_eager": args.get("enforce_eager", True), "skip_tokenizer_init": True,
                 "tensor_parallel_size": args.get("tensor_parallel_size", 1), "async_scheduling": False}
    if arguments["tensor_parallel_size"] == 1:  # drafted steps (vllm_engine.DraftedSteps) meet its runner here
        arguments["speculative_config"] = {"method": "ngram", "num_speculative_tokens": MAX_DRAFTS,
                                           "prompt_lookup_min": 1, "prompt_lookup_max": 1}
    else:
        arguments["logits_processors"] = [processor_class()]
    if args.get("gpu_memory_utilization") is not None:
        arguments["gpu_memory_utilization"] = args["gpu_memory_utilization"]
    if device == "cpu":
        arguments["block_size"] = args.get("block_size") or CPU_BLOCK_SIZE
        if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            arguments["kv_cache_memory_bytes"] = int((args.get("kv_cache_gib") or CPU_KV_CACHE_GIB) * (1 << 30))
    elif args.get("block_size"):
        arguments["block_size"] = args["block_size"]
    return arguments


class TokenizerWarmupFilter(logging.Filter):
    """Drops the one record vLLM's renderer logs (a WARNING with a traceback) when its chat-template
    warm-up meets ``skip_tokenizer_init=True``: ensbench renders prompts itself and gives vLLM ids."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (record.getMessage() == "Chat template warmup failed" and isinstance(error, ValueError)
                    and "skip_tokenizer_init" in str(error))


def register_cpu_kernels_once() -> None:
    """vLLM's CPU platform registers its kernel overrides (process-wide) again for every engine, and
    each registration scans every module; once numba is imported (the n-gram proposer of drafted
    steps imports it) the scan fails on llvmlite's lazy library object ("'_lib_fn_wrapper' object has
    no attribute 'get'"). A second member's engine registers only what is not registered yet: nothing."""
    from vllm.triton_utils import dispatcher

    register = dispatcher.register_kernels
    if getattr(register, "ensbench_once", False):
        return

    def register_new(overrides):
        new = {name: impl for name, impl in overrides.items() if name not in dispatcher._registry}
        if new:
            register(new)

    register_new.ensbench_once = True
    dispatcher.register_kernels = register_new


@contextlib.contextmanager
def without_tokenizer_warmup_warning():
    """While an engine starts: ``TokenizerWarmupFilter`` on the logger of vLLM's renderer."""
    renderer_logger = logging.getLogger("vllm.renderers.base")
    quiet = TokenizerWarmupFilter()
    renderer_logger.addFilter(quiet)
    try:
        yield
    finally:
        renderer_logger.removeFilter(quiet)


def cache_size(args: dict, device: str) -> str:
    """The KV cache a member's engine was given, in words."""
    if device != "cpu":
        return f"gpu_memory_utilization {args.get('gpu_memory_utilization') or 'default'}"
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return f"VLLM_CPU_KVCACHE_SPACE={os.environ['VLLM_CPU_KVCACHE_SPACE']} GiB"
    return f"{args.get('kv_cache_gib') or CPU_KV_CACHE_GIB} GiB"


def load_vllm_member(folder: Path, tokenizer, dtype: str, device: str, chat_template: bool, name: str, args: dict,
                     trust_remote_code: bool) -> VllmMember:
    """A member on an in-process vLLM engine over the HF folder ``folder`` (its engine thread starts)."""
    from transformers import AutoConfig, GenerationConfig

    from ensemble_bench.members.local import max_length_of

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process: the processor meets it
    try:
        import vllm
    except ImportError as err:
        raise UserError(f"member '{name}': backend vllm needs the vllm package ({err}): pip install "
                        "'ensemble-bench[vllm]' on a GPU machine, or make install-vllm for the CPU build") from None
    config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    try:
        generation = GenerationConfig.from_pretrained(folder)
    except OSError:
        generation = GenerationConfig()
    arguments = engine_arguments(folder, dtype, device, args, max_length_of(config, tokenizer))
    register_cpu_kernels_once()
    try:
        with without_tokenizer_warmup_warning():
            llm = vllm.LLM(trust_remote_code=trust_remote_code, **arguments)
    except ValueError as err:
        if "KV cache" not in str(err) and "cache blocks" not in str(err):
            raise
        raise UserError(f"member '{name}': a KV cache of {cache_size(args, device)} cannot hold one request of its "
                        f"max_model_len ({arguments['max_model_len']} tokens): raise vllm.kv_cache_gib "
                        "(gpu_memory_utilization on a GPU) or lower vllm.max_model_len") from None
    return VllmMember(llm.llm_engine, tokenizer, generation, config, name, chat_template,
                      arguments["max_model_len"], arguments["max_num_seqs"], folder)


def load_on_vllm(model: str, dtype: str, device: str, chat_template: bool, name: str | None,
                 trust_remote_code: bool, section: dict | None, **transformers_settings) -> VllmMember:
    """The vLLM backend's loader (members/vllm_backend.py): a vLLM member over an HF folder, a packaged
    model's converted float32 folder (converted once, by any transformers version), or the folder / hub id
    itself. vLLM 0.32 has no GGUF loader: a GGUF file of one's own is refused. ``transformers_settings``
    (device_map, quantization, ...) are the recipe schema's to refuse: vLLM places the model itself."""
    from ensemble_bench.members.converted import converted_source
    from ensemble_bench.members.loading import CONVERTING, load_tokenizer, tell_load
    from ensemble_bench.members.sources import PACKAGED, resolve

    name = name or model
    source = resolve(model)
    tokenizer = load_tokenizer(source, trust_remote_code)
    if source.gguf_file is not None and model in PACKAGED:
        source = converted_source(PACKAGED[model], source, tokenizer, lambda: tell_load(name, CONVERTING),
                                  any_transformers=True)
    if source.gguf_file is not None:
        raise UserError(f"member '{name}': backend vllm loads HF folders, not GGUF files: convert '{model}' to a "
                        "safetensors folder first (or use backend transformers)")
    return load_vllm_member(Path(source.location), tokenizer, dtype, device, chat_template, name, section or {},
                            trust_remote_code)
