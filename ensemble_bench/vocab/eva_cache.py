"""EVA's vocabulary projections cached on disk (the convention of vocab/cache.py), one file per
(auxiliary, lead) pair and alignment parameters, keyed by both vocabularies' fingerprints and a hash
of both embedding matrices.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import astuple
from functools import partial
from pathlib import Path

import numpy as np
import torch

from ensemble_bench.vocab.bytes_view import VocabView
from ensemble_bench.vocab.cache import MapFormat, load_or_build, map_path
from ensemble_bench.vocab.csls import Report
from ensemble_bench.vocab.eva_map import AlignParams, VocabProjection, build_projection
from ensemble_bench.vocab.union import vocab_fingerprint

VERSION = "eva-1"  # part of the file's key: a new rule or layout never reads an old file


def embedding_digest(matrix: torch.Tensor) -> str:
    data = np.ascontiguousarray(matrix.detach().cpu().float().numpy())
    return hashlib.sha256(repr(data.shape).encode() + data.tobytes()).hexdigest()[:20]


def projection_path(views: Sequence[VocabView], stops: Sequence[Sequence[int]], embeddings: Sequence[torch.Tensor],
                    params: AlignParams, folder: Path) -> Path:
    fingerprints = [vocab_fingerprint(view, stop_ids) for view, stop_ids in zip(views, stops)]
    return map_path(folder, "eva", VERSION, [repr(astuple(params)), *fingerprints, *map(embedding_digest, embeddings)])


def projection_tensors(projection: VocabProjection) -> dict[str, torch.Tensor]:
    return {"src": projection.src, "dst": projection.dst, "weight": projection.weight,
            "seeds": torch.tensor(projection.seeds)}


def projection_from_tensors(saved: object, aux_size: int, lead_size: int) -> VocabProjection:
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
                      folder: Path, report: Report | None = None) -> VocabProjection:
    """``build_projection``, read from ``folder`` when built before; an unreadable file is rebuilt."""
    path = projection_path([aux, lead], [aux_stops, lead_stops], [aux_embeddings, lead_embeddings], params, folder)
    kind = MapFormat("EVA projection", projection_tensors,
                     partial(projection_from_tensors, aux_size=aux.size, lead_size=lead.size))
    return load_or_build(path, kind, lambda: build_projection(
        aux, lead, aux_embeddings.float().cpu().numpy(), lead_embeddings.float().cpu().numpy(), aux_stops,
        lead_stops, params, report))
