"""GaC's union vocabulary cached on disk, keyed by the members' vocabulary fingerprints.

Stored as plain tensors, read back with ``torch.load(weights_only=True)`` (no pickled objects):
the entries as their concatenated bytes plus offsets, each member's map as its (src, union) id
pairs, and the stop mask. A file that cannot be read, or does not fit together, is rebuilt.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ensemble_bench.cache import atomic_file
from ensemble_bench.vocab.bytes_view import VocabView
from ensemble_bench.vocab.union import UnionVocab, build_union, member_map, vocab_fingerprint

FORMAT = "tensors-1"  # part of the file's key: a new layout never reads an old file
# What reading a damaged file, or one holding other objects, raises (torch.load, then the checks).
UNREADABLE = (OSError, EOFError, RuntimeError, ValueError, KeyError, TypeError, IndexError, AttributeError,
              pickle.UnpicklingError, zipfile.BadZipFile)
log = logging.getLogger(__name__)


def union_path(views: Sequence[VocabView], stop_ids: Sequence[Sequence[int]], folder: Path) -> Path:
    key = "-".join([FORMAT, *(vocab_fingerprint(v, s) for v, s in zip(views, stop_ids))])
    return folder / f"union-{hashlib.sha256(key.encode()).hexdigest()[:24]}.pt"


def union_tensors(union: UnionVocab) -> dict[str, object]:
    """The union as plain tensors (what the cache file holds)."""
    lengths = torch.tensor([0, *(len(e) for e in union.entries)], dtype=torch.long)
    return {"entry_bytes": torch.from_numpy(np.frombuffer(b"".join(union.entries), dtype=np.uint8).copy()),
            "entry_offsets": lengths.cumsum(0), "stop_mask": union.stop_mask,
            "src_ids": [m.src_ids for m in union.maps], "union_ids": [m.union_ids for m in union.maps]}


def _within(ids: torch.Tensor, bound: int) -> bool:
    return len(ids) == 0 or 0 <= int(ids.min()) <= int(ids.max()) < bound


def union_from_tensors(saved: dict, vocab_sizes: Sequence[int]) -> UnionVocab:
    """The inverse of ``union_tensors``; ValueError when the pieces do not fit together."""
    if not isinstance(saved, dict):
        raise ValueError(f"the cache holds a {type(saved).__name__}, not the union's tensors")
    blob, offsets = saved["entry_bytes"].numpy().tobytes(), saved["entry_offsets"].tolist()
    entries = tuple(blob[a:b] for a, b in zip(offsets[:-1], offsets[1:]))
    pairs = list(zip(saved["src_ids"], saved["union_ids"]))
    fits = (offsets[0] == 0 and offsets[-1] == len(blob) and offsets == sorted(offsets)
            and len(saved["stop_mask"]) == len(entries) and len(pairs) == len(vocab_sizes)
            and all(len(src) == len(dst) and _within(src, size) and _within(dst, len(entries))
                    for (src, dst), size in zip(pairs, vocab_sizes)))
    if not fits:
        raise ValueError("the cached union's tensors do not fit together")
    return UnionVocab(entries, tuple(member_map(src, dst, entries) for src, dst in pairs), saved["stop_mask"])


def cached_union(views: Sequence[VocabView], stop_ids: Sequence[Sequence[int]], folder: Path) -> UnionVocab:
    """``build_union``, read from ``folder`` when built before; an unreadable file is rebuilt."""
    path = union_path(views, stop_ids, folder)
    if path.exists():
        try:
            return union_from_tensors(torch.load(path, weights_only=True), [v.size for v in views])
        except UNREADABLE as err:
            log.warning("%s: damaged union cache (%s); rebuilding it", path, type(err).__name__)
    union = build_union(views, stop_ids)
    with atomic_file(path) as partial:
        torch.save(union_tensors(union), partial)
    return union
