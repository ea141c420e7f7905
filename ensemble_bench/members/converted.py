"""Packaged GGUF models kept de-quantised as a transformers folder, so that a later process loads
them in about a second instead of converting and de-quantising the GGUF again (20 s to 3 min).

``$ENSBENCH_CACHE/converted/<name>-<sha256[:16]>/`` holds ``model.safetensors`` (float32, what the
GGUF de-quantises to), ``config.json``, ``generation_config.json`` and the converted tokenizer, plus
``converted.json``: the format, the GGUF's SHA-256, the transformers version that converted it and the
SHA-256 of every file. The folder is written atomically (a temporary folder renamed into place) and
checked on every use as the other caches are (``cache.verified``: a ``stat`` while a file is
unchanged, a full hash otherwise). A folder that does not match is converted again; a cache that
cannot be written leaves the model loaded from its GGUF, as before.

The cache is derived: rows stay keyed by the GGUF's SHA-256 (row_store), and the dtype a recipe asks
for is applied when the folder is loaded (float32 cast to bfloat16 gives the same weights as the
GGUF loaded straight into bfloat16).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from ensemble_bench.cache import atomic_folder, cache_dir, file_sha256, record_stamp, verified
from ensemble_bench.members.sources import ModelSource, PackagedModel

FORMAT = "converted-1"
MARKER = "converted.json"
log = logging.getLogger(__name__)


def converted_folder(model: PackagedModel) -> Path:
    """Where the de-quantised copy of a packaged model lives."""
    return cache_dir() / "converted" / f"{model.name}-{model.sha256[:16]}"


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _marker(folder: Path) -> dict | None:
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and isinstance(marker.get("files"), dict) else None


def usable(folder: Path, model: PackagedModel, any_transformers: bool = False) -> bool:
    """Whether ``folder`` holds this packaged model converted by this transformers version (by any, for
    a reader of the files alone: a vLLM member), every file with the SHA-256 its marker recorded."""
    marker = _marker(folder)
    if marker is None:
        return False
    wanted = {"format": FORMAT, "source_sha256": model.sha256}
    if not any_transformers:
        wanted["transformers"] = _transformers_version()
    if any(marker.get(key) != value for key, value in wanted.items()) or "config.json" not in marker["files"]:
        return False
    for name, sha256 in marker["files"].items():
        path = folder / name
        if Path(name).name != name or not isinstance(sha256, str) or not path.is_file() or not verified(path, sha256):
            return False
    return True


def _write(folder: Path, model: PackagedModel, source: ModelSource, tokenizer) -> None:
    """Convert the GGUF into ``folder`` (atomically): float32 weights, config, tokenizer, marker."""
    import torch
    from transformers import AutoModelForCausalLM

    weights = AutoModelForCausalLM.from_pretrained(source.location, gguf_file=source.gguf_file, dtype=torch.float32)
    weights.hf_quantizer = None  # the weights are de-quantised: save them as plain tensors
    if hasattr(weights.config, "quantization_config"):
        del weights.config.quantization_config
    with atomic_folder(folder) as staging:
        weights.save_pretrained(staging)
        del weights
        tokenizer.save_pretrained(staging)
        for path in staging.iterdir():  # safetensors writes its file private: the usual permissions, as config.json
            shutil.copymode(staging / "config.json", path)
        files = {path.name: file_sha256(path) for path in sorted(staging.iterdir()) if path.is_file()}
        marker = {"format": FORMAT, "source_sha256": model.sha256, "transformers": _transformers_version(),
                  "files": files}
        (staging / MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True))
        for name, sha256 in files.items():
            record_stamp(staging / name, sha256)  # renaming the folder keeps the files' stat


def converted_source(model: PackagedModel, source: ModelSource, tokenizer, converting=lambda: None,
                     any_transformers: bool = False) -> ModelSource:
    """The de-quantised folder of a packaged model (``tokenizer``: its converted tokenizer, saved beside
    the weights), converted on first use (``converting()`` is called first); the GGUF source itself
    when the folder cannot be written (a read-only or full cache: said in the log). ``any_transformers``:
    a folder another transformers version converted will do (a vLLM member reads only the files)."""
    folder = converted_folder(model)
    if usable(folder, model, any_transformers):
        return ModelSource(str(folder))
    other = (_marker(folder) or {}).get("transformers")
    if other not in (None, _transformers_version()):  # another environment's conversion (.venv-vllm): it keeps it
        folder = folder.with_name(f"{folder.name}-transformers-{_transformers_version()}")
        if usable(folder, model):
            return ModelSource(str(folder))
    if folder.exists():
        log.warning("%s: not the packaged model's converted weights (damaged, or another transformers); "
                    "converting it again", folder)
    converting()
    try:
        _write(folder, model, source, tokenizer)
    except OSError as err:
        log.warning("%s: cannot keep the converted weights (%s); loading the GGUF file each time", folder,
                    err.strerror or err)
        return source
    return ModelSource(str(folder))
