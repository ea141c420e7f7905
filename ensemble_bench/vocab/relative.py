"""DeePEn's relative representations (DeePEn Sec. 3.2-3.4), without dense |V| x |A| matrices.

Anchors A are the tokens every member has (keyed by bytes). The relative representation of a
token v is the cosine similarity of its input embedding to every anchor's, softmax-normalised
over the anchors (Eq. 2, 4):  R^[v] = softmax_a(cos(e_v, e_a)).

The reference implementation stores R^ densely (|V| x |A| float32: 56 GB for Llama-3's 128k
tokens against Qwen2's 110k common anchors). Here rows are computed on demand, in chunks, for
the tokens that carry probability: a distribution's relative representation r = p R^ (Eq. 5's
r_i) only needs the rows of its support, so a member's top-``support`` tokens are used (the
dropped mass bounds the error: every row of R^ sums to 1, so ||r_exact - r||_1 equals the
probability mass left out). ``support=None`` uses every token (exact, slow, memory still
bounded by the chunk size).
"""

from __future__ import annotations

from collections.abc import Sequence
from collections import OrderedDict

import torch

from ensemble_bench.vocab.bytes_view import VocabView

CHUNK_ELEMENTS = 1 << 26  # rows x anchors computed at once (256 MiB of float32)


def anchor_ids(views: Sequence[VocabView]) -> list[list[int]]:
    """For each member, the ids of the common text tokens (by bytes), in one shared order."""
    keyed = []
    for view in views:
        ids: dict[bytes, int] = {}
        for token_id in view.text_ids():
            ids.setdefault(view.pieces[token_id], token_id)  # lowest id among duplicates
        keyed.append(ids)
    common = sorted(set.intersection(*(set(k) for k in keyed)))
    return [[ids[piece] for piece in common] for ids in keyed]


class RelativeSpace:
    """One member's embeddings seen through the anchors: rows of R^ on demand.

    Recently used rows are kept in a fixed block of ``cache_bytes`` (least recently used rows
    make room), since the same tokens carry the probability step after step.
    """

    def __init__(self, embeddings: torch.Tensor, anchor_index: Sequence[int], cache_bytes: int = 256 << 20):
        norms = torch.cat([torch.linalg.vector_norm(block.float(), dim=-1)  # in blocks: no float copy of E
                           for block in embeddings.split(8192)]).clamp(min=1e-12)
        index = torch.tensor(list(anchor_index), dtype=torch.long, device=embeddings.device)
        self.embeddings = embeddings  # [V, d] the member's input embeddings (any dtype and device)
        self.anchors = (embeddings.index_select(0, index).float() / norms[index, None]).to(embeddings.dtype)
        self.inverse_norms = (1.0 / norms).float()  # [V]
        capacity = max(1, cache_bytes // (4 * self.size))
        self._store = torch.empty((0, self.size), dtype=torch.float32, device=embeddings.device)
        self._capacity = capacity
        self._slots: OrderedDict[int, int] = OrderedDict()  # token id -> row of _store, oldest first

    @property
    def size(self) -> int:
        return self.anchors.shape[0]

    def compute_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """R^[ids]: [len(ids), A] float32 (Eq. 2 then Eq. 4), computed now."""
        ids = ids.to(self.embeddings.device)
        cosine = (self.embeddings.index_select(0, ids) @ self.anchors.T).float()
        cosine *= self.inverse_norms[ids, None]
        return cosine.softmax(dim=-1)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """R^[ids], through the cache when they fit in it."""
        wanted = list(dict.fromkeys(ids.tolist()))
        if len(wanted) > self._capacity:
            return self.compute_rows(ids)
        missing = [i for i in wanted if i not in self._slots]
        for i in wanted:
            if i in self._slots:
                self._slots.move_to_end(i)  # the oldest rows, not these, make room below
        if missing:
            self._insert(missing, self.compute_rows(torch.tensor(missing, dtype=torch.long)))
        slots = torch.tensor([self._slots[i] for i in ids.tolist()], dtype=torch.long, device=self._store.device)
        return self._store.index_select(0, slots)

    def warm(self, ids: torch.Tensor) -> None:
        """Compute the missing rows of ``ids`` in one call, if they fit in the cache."""
        if len(ids) <= self._capacity:
            self.rows(ids)

    def _insert(self, ids: list[int], rows: torch.Tensor) -> None:
        if self._store.shape[0] == 0:  # allocated once, on first use
            self._store = torch.empty((self._capacity, self.size), dtype=torch.float32, device=self._store.device)
        free = list(range(len(self._slots), min(self._capacity, len(self._slots) + len(ids))))
        recycled = [self._slots.popitem(last=False)[1] for _ in range(len(ids) - len(free))]
        slots = free + recycled
        self._store[torch.tensor(slots, dtype=torch.long, device=self._store.device)] = rows
        self._slots.update(zip(ids, slots))

    def fits(self, count: int) -> bool:
        """Whether ``count`` rows can be held at once (cache and chunk limits)."""
        return count <= self._capacity and count * self.size <= CHUNK_ELEMENTS

    def represent(self, probs: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """r = p[ids] R^[ids] (Eq. 5's r_i, restricted to ``ids``); float32 [A]. Uses ``rows``
        (R^[ids]) when given, else computes them chunk by chunk."""
        if rows is not None:
            return probs.float().to(rows.device) @ rows
        parts = [weights @ self.rows(chunk) for chunk, weights in self._chunks(ids, probs)]
        return torch.stack(parts).sum(dim=0) if len(parts) > 1 else parts[0]

    def pull_back(self, ratio: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """R^[ids] @ ratio: [len(ids)] float32, in chunks (the gradient of Eq. 6, up to sign)."""
        return torch.cat([self.rows(chunk) @ ratio for chunk, _ in self._chunks(ids, None)])

    def _chunks(self, ids: torch.Tensor, probs: torch.Tensor | None):
        step = max(1, CHUNK_ELEMENTS // max(1, self.size))
        for start in range(0, len(ids), step):
            chunk = ids[start:start + step]
            yield chunk, None if probs is None else probs[start:start + step].to(self.anchors.device)


def inverse_transform(probs: torch.Tensor, ids: torch.Tensor, space: RelativeSpace, target: torch.Tensor,
                      eta: float, steps: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 6-7: ``steps`` gradient steps on p (the main model's probabilities of ``ids``) of
    KL(target || p R^), starting from the model's own p; returns the updated p (float32).

    d/dp_v KL(r || p R^) = -sum_a R^[v, a] r_a / (p R^)_a, so each step adds
    eta * R^[ids] @ (r / p R^) to p. ``rows`` (R^[ids]) may be given; without them the rows
    are recomputed chunk by chunk each step (bounded memory).
    """
    p = probs.float().to(space.anchors.device)
    target = target.to(space.anchors.device)
    for _ in range(steps):
        current = space.represent(p, ids, rows)
        ratio = target / current.clamp(min=1e-30)
        p = p + eta * (space.pull_back(ratio, ids) if rows is None else rows @ ratio)
    return p


def kl_divergence(target: torch.Tensor, current: torch.Tensor) -> float:
    """KL(target || current) for two distributions over the anchors (the loss of Eq. 6)."""
    mask = target > 0
    return float((target[mask] * (target[mask].log() - current[mask].clamp(min=1e-30).log())).sum())
