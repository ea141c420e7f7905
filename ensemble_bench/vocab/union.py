"""GaC's union vocabulary, keyed by bytes (GaC Sec. 3.2: the mapping matrices M^i).

Every text token of every member maps to one union entry holding its bytes; ids with the same
bytes inside one vocabulary map to the same entry (their probabilities add). Each stop id maps to
a stop entry keyed by its literal text in a namespace of its own, so members sharing a marker
(``<|im_end|>``, ``<|endoftext|>``) share the entry and a member's distinct markers stay apart (a
member ensembled with itself then picks exactly what it picks alone); choosing any stop entry
ends the row. Other special tokens and padded head rows map nowhere. The maps are sparse index
arrays (``src_ids[k] -> union_ids[k]``) applied with a scatter-add, never dense |V| x |U| matrices.
(Cached on disk by ``vocab/union_cache.py``; this module only computes.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ensemble_bench.vocab.bytes_view import VocabView

STOP_KEY = b"\x00stop:"  # namespace of stop entries (text tokens never start with a NUL byte + this)


@dataclass(frozen=True)
class MemberMap:
    """One member's M^i as index arrays, plus the way back from union entries to its ids."""

    src_ids: torch.Tensor      # [n] member token ids that map somewhere
    union_ids: torch.Tensor    # [n] their union indices
    to_member: torch.Tensor    # [U] the member's (lowest) id for each union entry, -1 if none
    by_bytes: dict[bytes, int]  # text bytes -> the member's lowest id with exactly those bytes

    def project(self, probs: torch.Tensor, union_size: int) -> torch.Tensor:
        """p^i(.) M^i: member probabilities [rows, V_i] -> union space [rows, U] (scatter-add)."""
        out = torch.zeros((probs.shape[0], union_size), dtype=probs.dtype, device=probs.device)
        return out.index_add_(1, self.union_ids.to(probs.device), probs[:, self.src_ids.to(probs.device)])


@dataclass(frozen=True)
class UnionVocab:
    entries: tuple[bytes, ...]  # union index -> bytes (stop entries: STOP_KEY + marker text)
    maps: tuple[MemberMap, ...]
    stop_mask: torch.Tensor     # [U] bool: entries that end generation

    @property
    def size(self) -> int:
        return len(self.entries)

    def is_stop(self, index: int) -> bool:
        return bool(self.stop_mask[index])


def vocab_fingerprint(view: VocabView, stop_ids: Sequence[int]) -> str:
    digest = hashlib.sha256()
    for piece in view.pieces:
        digest.update(b"\x00" if piece is None else b"\x01" + len(piece).to_bytes(4, "little") + piece)
    digest.update(repr(sorted(view.special_ids)).encode() + repr(sorted(stop_ids)).encode())
    return digest.hexdigest()[:20]


def build_union(views: Sequence[VocabView], stop_ids: Sequence[Sequence[int]]) -> UnionVocab:
    """The union of the members' text tokens by bytes, plus their stop entries."""
    index: dict[bytes, int] = {}
    pairs = []
    for view, stops in zip(views, stop_ids):
        stops = set(stops)
        src, dst = [], []
        for token_id, piece in enumerate(view.pieces):
            if token_id in stops:
                key = STOP_KEY + (piece or str(token_id).encode())
            elif piece and token_id not in view.special_ids:
                key = piece
            else:
                continue
            src.append(token_id)
            dst.append(index.setdefault(key, len(index)))
        pairs.append((torch.tensor(src, dtype=torch.long), torch.tensor(dst, dtype=torch.long)))
    entries = tuple(sorted(index, key=index.__getitem__))
    stop_mask = torch.tensor([e.startswith(STOP_KEY) for e in entries], dtype=torch.bool)
    maps = tuple(member_map(src, dst, entries) for src, dst in pairs)
    return UnionVocab(entries, maps, stop_mask)


def member_map(src: torch.Tensor, dst: torch.Tensor, entries: tuple[bytes, ...]) -> MemberMap:
    """One member's map from its (id -> union index) pairs."""
    missing = torch.iinfo(torch.long).max
    to_member = torch.full((len(entries),), missing, dtype=torch.long)
    to_member.scatter_reduce_(0, dst, src, reduce="amin")  # lowest id among duplicates
    to_member[to_member == missing] = -1
    by_bytes: dict[bytes, int] = {}
    for token_id, union_id in zip(src.tolist(), dst.tolist()):
        by_bytes.setdefault(entries[union_id], token_id)
    return MemberMap(src, dst, to_member, by_bytes)
