"""EVA's vocabulary projections cached on disk, one file per (auxiliary, lead) pair and alignment
parameters, keyed by both vocabularies' fingerprints and a hash of both embedding matrices.

Stored as plain tensors (``torch.load(weights_only=True)``); a file that cannot be read, or does not
fit the vocabularies, is rebuilt (as the union vocabulary's cache, union_cache.py).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import astuple
from pathlib import Path

import numpy as np
import torch

from ensemble_bench.cache import atomic_file
from ensemble_bench.union_cache import UNREADABLE
from ensemble_bench.vocab.bytes_view import VocabView
from ensemble_bench.vocab.eva_map import AlignParams, VocabProjection, build_projection
from ensemble_bench.vocab.union import vocab_fingerprint

FORMAT = "eva-1"
log = logging.getLogger(__name__)


def embedding_digest(matrix: torch.Tensor) -> str:
    data = np.ascontiguousarray(matrix.detach().cpu().float().numpy())
    return hashlib.sha256(repr(data.shape).encode() + data.tobytes()).hexdigest()[:20]


def projection_path(views: Sequence[VocabView], stops: Sequence[Sequence[int]], embeddings: Sequence[torch.Tensor],
                    params: AlignParams, folder: Path) -> Path:
    parts = [FORMAT, repr(astuple(params)), *(vocab_fingerprint(v, s) for v, s in zip(views, stops)),
             *(embedding_digest(e) for e in embeddings)]
    return folder / f"eva-{hashlib.sha256('-'.join(parts).encode()).hexdigest()[:24]}.pt"


def projection_from_tensors(saved: dict, aux_size: int, lead_size: int) -> VocabProjection:
    """The cached tensors as a projection; ValueError when they do not fit the vocabularies."""
    if not isinstance(saved, dict):
        raise ValueError(f"the cache holds a {type(saved).__name__}, not EVA's tensors")
    src, dst, weight = saved["src"], saved["dst"], saved["weight"]
    fits = len(src) == len(dst) == len(weight) and (len(src) == 0 or (
        int(src.min()) >= 0 and int(src.max()) < aux_size and int(dst.min()) >= 0 and int(dst.max()) < lead_size))
    if not fits:
        raise ValueError("the cached projection does not fit the vocabularies")
    return VocabProjection(src, dst, weight, lead_size, int(saved["seeds"]))


def cached_projection(aux: VocabView, lead: VocabView, aux_stops: Sequence[int], lead_stops: Sequence[int],
                      aux_embeddings: torch.Tensor, lead_embeddings: torch.Tensor, params: AlignParams,
                      folder: Path) -> VocabProjection:
    """``build_projection``, read from ``folder`` when built before; an unreadable file is rebuilt."""
    path = projection_path([aux, lead], [aux_stops, lead_stops], [aux_embeddings, lead_embeddings], params, folder)
    if path.exists():
        try:
            return projection_from_tensors(torch.load(path, weights_only=True), aux.size, lead.size)
        except UNREADABLE as err:
            log.warning("%s: damaged EVA projection cache (%s); rebuilding it", path, type(err).__name__)
    x, z = aux_embeddings.float().cpu().numpy(), lead_embeddings.float().cpu().numpy()
    projection = build_projection(aux, lead, x, z, aux_stops, lead_stops, params)
    with atomic_file(path) as partial:
        torch.save({"src": projection.src, "dst": projection.dst, "weight": projection.weight,
                    "seeds": torch.tensor(projection.seeds)}, partial)
    return projection
