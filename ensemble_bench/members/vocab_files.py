"""Real tokenizers of big models, offline: the vocabulary-only GGUF files inside llama.cpp's sources.

The llama-cpp-python source distribution on PyPI carries ``vendor/llama.cpp/models/ggml-vocab-*.gguf``
(vocabularies without weights). On first use the sdist is downloaded into the cache, the wanted
file is extracted, converted to a transformers tokenizer and saved (reloads in 1-2 s). Used for
vocabulary-scale measurements (union and anchor sizes, alignment cost) and the GPU timing script.
Known conversion faults: Llama-3 gains a stray id 128256 and adds no BOS;
DeepSeek-LLM's BOS is wrong. Neither matters for vocabulary sizes by bytes.
"""

from __future__ import annotations

import logging
import tarfile
from pathlib import Path

from ensemble_bench.cache import atomic_file, cache_dir, file_sha256, record_stamp, still_as_recorded
from ensemble_bench.errors import UserError
from ensemble_bench.fetch import fetch_sdist
from ensemble_bench.members.loading import cached_tokenizer

SDIST = ("llama-cpp-python", "0.3.36")
VOCAB_FILES = {
    "llama3": "ggml-vocab-llama-bpe.gguf",     # Llama-3 / 3.1 (128256)
    "qwen2": "ggml-vocab-qwen2.gguf",          # Qwen2 / Qwen2.5 (151936 head)
    "llama2": "ggml-vocab-llama-spm.gguf",     # Llama-2, Mistral-7B-v0.1 family (32000)
    "phi3": "ggml-vocab-phi-3.gguf",           # Phi-3 (32064)
    "deepseek-llm": "ggml-vocab-deepseek-llm.gguf",  # DeepSeek-LLM (102400)
}
log = logging.getLogger(__name__)


def vocab_file(name: str) -> Path:
    """The path of one vocabulary-only GGUF, extracted on first use."""
    if name not in VOCAB_FILES:
        raise UserError(f"unknown vocabulary '{name}' (known: {', '.join(VOCAB_FILES)})")
    target = cache_dir() / "vocab" / VOCAB_FILES[name]
    if target.exists() and still_as_recorded(target):
        return target
    if target.exists():
        log.warning("%s: changed since it was extracted; extracting it again", target)
    with tarfile.open(fetch_sdist(*SDIST)) as archive:
        member = next((m for m in archive.getmembers() if m.name.endswith("/models/" + VOCAB_FILES[name])), None)
        if member is None:
            raise UserError(f"{VOCAB_FILES[name]} is not in the {SDIST[0]} {SDIST[1]} sources")
        with archive.extractfile(member) as src, atomic_file(target) as partial:
            partial.write_bytes(src.read())
    record_stamp(target, file_sha256(target))
    return target


def load_vocab_tokenizer(name: str):
    """A transformers tokenizer for one of VOCAB_FILES (converted once, then cached)."""
    from transformers import AutoTokenizer

    def convert():
        path = vocab_file(name)
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)

    return cached_tokenizer(cache_dir() / "tokenizers" / f"vocab-{name}", convert)
