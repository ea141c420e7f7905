"""Vocabulary maps cached on disk, one convention for all of them: GaC's union (union_cache.py), EVA's
projections (eva_cache.py) and MinED's maps (mined.py).

- **The key** is the file's name: the map's kind, then a hash of its format version and the
  fingerprints of every input it is built from (vocabularies with their stop ids, embeddings,
  parameters). A new layout or rule bumps the version, so an old file is never read as a new one.
- **Plain tensors**: the file holds tensors (alone, or in dicts and lists), written with
  ``torch.save`` and read with ``torch.load(weights_only=True)``: no pickled objects.
- **Atomic writes** (cache.atomic_file): a killed writer leaves the old file or none.
- **Rebuilt when unreadable**: a file that cannot be read, or whose tensors do not fit the inputs
  (the kind's reader raises ValueError), is rebuilt with a warning, never a failed run.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import torch

from ensemble_bench.cache import atomic_file

# What reading a damaged file, or one holding other objects, raises (torch.load, then the readers' checks).
UNREADABLE = (OSError, EOFError, RuntimeError, ValueError, KeyError, TypeError, IndexError, AttributeError,
              pickle.UnpicklingError, zipfile.BadZipFile)
log = logging.getLogger(__name__)
Built = TypeVar("Built")


def map_path(folder: Path, kind: str, version: str, fingerprints: Sequence[str]) -> Path:
    """``folder/<kind>-<24 hex>.pt``: the hash of the format version and the inputs' fingerprints."""
    key = "-".join([version, *fingerprints])
    return folder / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:24]}.pt"


@dataclass(frozen=True)
class MapFormat(Generic[Built]):
    """How one kind of map goes to plain tensors and back. ``read`` raises ValueError when the
    tensors do not fit the inputs; ``what`` names the map in the warning."""

    what: str
    write: Callable[[Built], object]
    read: Callable[[object], Built]


def load_or_build(path: Path, kind: MapFormat[Built], build: Callable[[], Built]) -> Built:
    """The map stored at ``path``, or ``build()`` written there atomically when it is absent or unreadable."""
    if path.exists():
        try:
            return kind.read(torch.load(path, weights_only=True))
        except UNREADABLE as err:
            log.warning("%s: damaged %s cache (%s); rebuilding it", path, kind.what, type(err).__name__)
    built = build()
    with atomic_file(path) as partial:
        torch.save(kind.write(built), partial)
    return built
