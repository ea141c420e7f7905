"""GaC's union vocabulary cached on disk (the convention of vocab/cache.py), keyed by the members'
vocabulary fingerprints: the entries as their concatenated bytes plus offsets, each member's map as
its (src, union) id pairs, and the stop mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np
import torch

from ensemble_bench.vocab.bytes_view import VocabView
from ensemble_bench.vocab.cache import MapFormat, load_or_build, map_path
from ensemble_bench.vocab.union import UnionVocab, build_union, member_map, vocab_fingerprint

VERSION = "tensors-1"  # part of the file's key: a new layout never reads an old file


def union_path(views: Sequence[VocabView], stop_ids: Sequence[Sequence[int]], folder: Path) -> Path:
    return map_path(folder, "union", VERSION, [vocab_fingerprint(v, s) for v, s in zip(views, stop_ids)])


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
    kind = MapFormat("union", union_tensors, partial(union_from_tensors, vocab_sizes=[v.size for v in views]))
    return load_or_build(union_path(views, stop_ids, folder), kind, lambda: build_union(views, stop_ids))
