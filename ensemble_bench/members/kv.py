"""Row-wise edits of a transformers DynamicCache whose rows are left padded.

Invariant kept by ``CachedRows`` (LocalMember's and Seq2SeqMember's batch): every row is
``[padding][real tokens]`` with no holes, so the physical distance between two real tokens equals
their logical distance. Keys are stored already rotated by their logical position, so moving a
row's columns does not change what they mean.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ensemble_bench.members.rows import RowBatch


def cache_argument(model) -> str:
    """The name under which ``model``'s forward takes its KV cache: ``cache`` (transformers 5.24 on;
    ``past_key_values`` is deprecated there and removed in 5.40), else ``past_key_values`` (older
    transformers, and remote code written for them)."""
    import inspect

    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # no signature to read: the name every version still accepts in 5.x
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def _layers(cache: DynamicCache):
    return [layer for layer in cache.layers if getattr(layer, "keys", None) is not None]


def copy_rows(cache: DynamicCache, rows: torch.Tensor) -> DynamicCache:
    """A new cache holding a copy of ``rows`` of every layer."""
    # rows.to(...): with a device_map the layers live on different devices
    return DynamicCache(ddp_cache_data=[(layer.keys.index_select(0, rows.to(layer.keys.device)),
                                         layer.values.index_select(0, rows.to(layer.values.device)))
                                        for layer in _layers(cache)])


def append_columns(cache: DynamicCache, sub_cache: DynamicCache, rows: torch.Tensor, width: int) -> None:
    """Grow every row of ``cache`` by ``width`` columns: ``rows`` get the last ``width`` columns of
    ``sub_cache`` (which extended a copy of them), the other rows zeros (to be masked as padding)."""
    for layer, sub in zip(_layers(cache), _layers(sub_cache)):
        for name in ("keys", "values"):
            full, new = getattr(layer, name), getattr(sub, name)[:, :, -width:, :]
            grown = torch.cat([full, full.new_zeros((full.shape[0], full.shape[1], width, full.shape[3]))], dim=2)
            grown[rows.to(grown.device), :, -width:, :] = new
            setattr(layer, name, grown)


def select_rows(cache: DynamicCache, rows: torch.Tensor) -> None:
    """Keep only ``rows`` (a 1-D index tensor) of every layer, in that order."""
    for layer in _layers(cache):
        layer.keys = layer.keys.index_select(0, rows.to(layer.keys.device))
        layer.values = layer.values.index_select(0, rows.to(layer.values.device))


def gather_columns(cache: DynamicCache, order: torch.Tensor) -> None:
    """Reorder each row's sequence columns: ``order`` is [rows, length] of column indices."""
    for layer in _layers(cache):
        rows, heads, _, dim = layer.keys.shape
        index = order.to(layer.keys.device)[:, None, :, None].expand(rows, heads, order.shape[1], dim)
        layer.keys = layer.keys.gather(2, index)
        layer.values = layer.values.gather(2, index)


def drop_leading_columns(cache: DynamicCache, count: int) -> None:
    """Remove the first ``count`` columns of every row (padding shared by all rows)."""
    if count <= 0:
        return
    for layer in _layers(cache):
        layer.keys = layer.keys[:, :, count:, :]
        layer.values = layer.values[:, :, count:, :]


def drop_trailing_columns(cache: DynamicCache, count: int) -> None:
    """Remove the last ``count`` columns of every row (a read that must leave the cache as it was)."""
    if count <= 0:
        return
    for layer in _layers(cache):
        layer.keys = layer.keys[:, :, :layer.keys.shape[2] - count, :]
        layer.values = layer.values[:, :, :layer.values.shape[2] - count, :]


def has_holes(mask: torch.Tensor) -> bool:
    """True when some row has padding after a real token."""
    return bool((mask.cummax(dim=1).values > mask).any())


def left_align_padding(cache: DynamicCache, mask: torch.Tensor) -> torch.Tensor:
    """Move every row's padding columns to its left end (stable); trim shared padding.

    Returns the new mask; the cache is edited in place.
    """
    if has_holes(mask):
        mask, order = torch.sort(mask, dim=1, stable=True)
        gather_columns(cache, order)
    shared = int((mask == 0).sum(dim=1).min()) if mask.shape[0] else 0
    drop_leading_columns(cache, shared)
    return mask[:, shared:]


class CachedRows(RowBatch):
    """A RowBatch whose tokens sit in a KV cache: also the cache (the self-attention one of an
    encoder-decoder) and its attention ``mask`` [rows, columns]; crop and keep edit both and end
    with the invariant above holding."""

    def start(self, rows: int, cache: DynamicCache | None = None) -> None:
        super().start(rows)
        self.cache = cache if cache is not None else DynamicCache()
        self.mask = torch.zeros((rows, 0), dtype=torch.long, device=self.device)

    def realign(self, evenly: bool) -> None:
        """Restore the invariant after a step, unless every row just grew by the same number of
        real tokens (a plain decode step): every public call ends with it holding, so it holds already."""
        if not evenly:
            self.mask = left_align_padding(self.cache, self.mask)

    def crop(self, lengths) -> list[int]:
        dropped = super().crop(lengths)
        width = self.mask.shape[1]
        for r, count in enumerate(dropped):
            if count:
                self.mask[r, width - count:] = 0
        self.mask = left_align_padding(self.cache, self.mask)
        return dropped

    def keep(self, rows) -> torch.Tensor:
        index = super().keep(rows)
        select_rows(self.cache, index)
        self.mask = left_align_padding(self.cache, self.mask.index_select(0, index.to(self.mask.device)))
        return index
