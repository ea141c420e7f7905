"""Loading a member: its tokenizer (a GGUF's converted once and cached), its weights (a packaged model's
de-quantised once, members/converted.py), quantization, and the load events a progress display hears.
A leaf of members/: the package, the Ray actor (remote.py) and the vocabulary files import it."""

from __future__ import annotations

import hashlib
import logging
import pickle
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ensemble_bench.cache import atomic_folder, cache_dir
from ensemble_bench.errors import UserError
from ensemble_bench.members.backends import DEFAULT, backend_spec
from ensemble_bench.members.base import Member
from ensemble_bench.members.sources import PACKAGED, ModelSource, resolve

DTYPES = ("float32", "bfloat16", "float16")
CONVERTING = "converting"  # the load event of a packaged model's first load (members/converted.py)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    """A long step of a first use, heard as a load event (EVA learning its map: methods/eva.py): what it
    does and the fraction done; the display adds the time it has taken and an ETA (cli/progress.py)."""

    what: str
    done: float

    def __str__(self) -> str:
        return f"{self.what}: {self.done:.0%}"


_listeners: list[Callable[[str, str | Stage], None]] = []


@contextmanager
def load_listener(listener: Callable[[str, str | Stage], None]) -> Iterator[None]:
    """While the block runs, ``listener(member name, event)`` hears every load_member: ``loading``,
    ``converting`` (a packaged model's GGUF, once), ``loaded`` (the progress display, cli/progress.py), and
    the ``Stage`` of a long first use after the members loaded."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


def tell_load(name: str, event: str | Stage) -> None:
    """Pass a loading event to the listeners (none outside a run's progress display)."""
    for listener in list(_listeners):
        listener(name, event)


def _gguf_tokenizer_cache(source: ModelSource) -> Path:
    gguf = Path(source.location) / source.gguf_file
    stamp = f"{gguf.resolve()}:{gguf.stat().st_size}:{gguf.stat().st_mtime_ns}"
    return cache_dir() / "tokenizers" / hashlib.sha256(stamp.encode()).hexdigest()[:16]


def cached_tokenizer(folder: Path, convert: Callable[[], object]):
    """The tokenizer saved in ``folder``; when it is absent or does not load, ``convert()`` and save
    the result there atomically (a temporary folder renamed into place, so a killed writer leaves no
    half-written tokenizer.json)."""
    from transformers import AutoTokenizer

    if (folder / "tokenizer.json").exists():
        try:
            return AutoTokenizer.from_pretrained(folder)
        except Exception as err:  # noqa: BLE001 - tokenizers raises a bare Exception for a damaged tokenizer.json
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            log.warning("%s: damaged tokenizer cache (%s); rebuilding it", folder, first)
    tokenizer = convert()
    with atomic_folder(folder) as staging:
        tokenizer.save_pretrained(staging)
    return tokenizer


def load_tokenizer(source: ModelSource, trust_remote_code: bool = False):
    """Load a fast tokenizer; a GGUF's converted tokenizer is cached (conversion takes 5-30 s)."""
    from transformers import AutoTokenizer

    if source.gguf_file is None:
        return AutoTokenizer.from_pretrained(source.location, trust_remote_code=trust_remote_code)
    return cached_tokenizer(_gguf_tokenizer_cache(source),
                            lambda: AutoTokenizer.from_pretrained(source.location, gguf_file=source.gguf_file))


QUANTIZATIONS = ("8bit", "4bit")


def quantization_config(quantization: str | None, dtype: str):
    """transformers' BitsAndBytesConfig for '8bit' / '4bit' (UserError when bitsandbytes is missing)."""
    import importlib.util

    import torch

    if quantization is None:
        return None
    if quantization not in QUANTIZATIONS:
        raise UserError(f"quantization '{quantization}' is not one of {', '.join(QUANTIZATIONS)}")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise UserError(f"quantization '{quantization}' needs the bitsandbytes package (pip install bitsandbytes)")
    from transformers import BitsAndBytesConfig

    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=getattr(torch, dtype))


def _refused_pickle(source: ModelSource, err: pickle.UnpicklingError) -> str:
    """What to tell about pickled weights (``pytorch_model*.bin``) that torch's safe loader refused, or
    that are damaged: the file and the safe way to load the model, never advice to turn the protection
    off (torch's own message ends with that advice, so it is not passed on)."""
    folder = Path(source.location)
    files = ", ".join(map(str, sorted(folder.glob("pytorch_model*.bin")))) if folder.is_dir() else ""
    files = files or "its pickled weights (pytorch_model.bin)"
    if "weights only load failed" not in str(err).lower():
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return f"{files}: not a readable weights file ({first}): fetch or save the model again"
    blocked = re.search(r"unsupported GLOBAL (\S+)", str(err))
    runs = f": it would run {blocked.group(1)}" if blocked else ""
    return (f"{files}: torch's safe loader refuses this pickle{runs}; load the model from safetensors "
            "instead (model.safetensors beside config.json, from a source you trust)")


def _weights_source(model: str, name: str | None, source: ModelSource, seq2seq: bool,
                    quantization: str | None, tokenizer) -> ModelSource:
    """Where to load the weights from: a packaged model's de-quantised folder (members/converted.py,
    converted on first use), otherwise the source itself."""
    if model not in PACKAGED or seq2seq or quantization is not None or source.gguf_file is None:
        return source
    from ensemble_bench.members.converted import converted_source

    return converted_source(PACKAGED[model], source, tokenizer, lambda: tell_load(name or model, CONVERTING))


def load_member(model: str, dtype: str = "float32", device: str = "cpu",
                chat_template: bool = True, name: str | None = None, *,
                device_map: str | dict | None = None, max_memory: dict | None = None,
                quantization: str | None = None, kind: str = "auto", trust_remote_code: bool = False,
                backend: str = DEFAULT, **section: dict | None) -> Member:
    """Load one member from a packaged name, a .gguf file, a directory or a hub id.

    ``kind``: ``causal``, ``seq2seq`` (an encoder-decoder, members/seq2seq.py) or ``auto`` (the
    model config's ``is_encoder_decoder`` decides).

    ``device_map`` / ``max_memory`` / ``quantization`` go to ``from_pretrained`` (accelerate places
    the layers; then ``device`` is not used). A quantized model without a device_map goes on ``device``.
    ``trust_remote_code`` lets transformers run the Python code of the model's repository.
    ``backend``: what steps the model (members/backends.py: ``transformers`` here, ``vllm`` an in-process
    vLLM engine, members/vllm.py); ``section``: its recipe section under its name (``vllm={...}``: engine
    arguments).
    """
    if dtype not in DTYPES:
        raise UserError(f"dtype '{dtype}' is not one of {', '.join(DTYPES)}")
    steps = backend_spec(backend)
    section = {key: value for key, value in section.items() if value is not None}  # vllm=None: none given
    if set(section) - {backend} or (section and steps.section is None):
        raise TypeError(f"load_member: backend {backend} takes no {', '.join(sorted(section))} settings")
    given = {"section": section.get(backend)} if steps.section is not None else {}
    tell_load(name or model, "loading")
    started = time.perf_counter()
    member = steps.load(model=model, dtype=dtype, device=device, chat_template=chat_template, name=name,
                        device_map=device_map, max_memory=max_memory, quantization=quantization, kind=kind,
                        trust_remote_code=trust_remote_code, **given)
    log.info("%s loaded in %.1f s", name or model, time.perf_counter() - started)
    tell_load(name or model, "loaded")
    return member


def load_on_transformers(model: str, dtype: str, device: str, chat_template: bool, name: str | None, device_map,
                         max_memory, quantization: str | None, kind: str, trust_remote_code: bool) -> Member:
    """The transformers backend's loader (members/transformers_backend.py): load_member's work, once the
    dtype is known good."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    from ensemble_bench.members.local import LocalMember
    from ensemble_bench.members.seq2seq import Seq2SeqMember, is_seq2seq

    placement: dict = {}
    quantized = quantization_config(quantization, dtype)
    if quantized is not None:
        placement["quantization_config"] = quantized
        device_map = device_map if device_map is not None else {"": device}
    if device_map is not None:
        placement["device_map"] = device_map
    if max_memory:
        placement["max_memory"] = max_memory
    source = resolve(model)
    try:
        seq2seq = is_seq2seq(source.location, source.gguf_file, kind, trust_remote_code)
        tokenizer = load_tokenizer(source, trust_remote_code)
        stored = _weights_source(model, name, source, seq2seq, quantization, tokenizer)
        weights = (AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM).from_pretrained(
            stored.location, gguf_file=stored.gguf_file, dtype=getattr(torch, dtype),
            trust_remote_code=trust_remote_code, **placement)
    except pickle.UnpicklingError as err:
        raise UserError(f"cannot load model '{model}': {_refused_pickle(source, err)}") from None
    except (OSError, ValueError, ImportError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        if "custom code" in first and not trust_remote_code:
            first = "it ships its own Python code; set trust_remote_code: true on the member to run it"
        raise UserError(f"cannot load model '{model}': {first}") from None
    if device_map is None:
        try:
            weights.to(device)
        except (RuntimeError, AssertionError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise UserError(f"model '{model}' does not fit on device '{device}': {first}") from None
    if seq2seq:
        return Seq2SeqMember(weights, tokenizer, name or model)
    return LocalMember(weights, tokenizer, name or model, chat_template=chat_template)
