"""Padding and batching of token-id rows, shared by the members and the methods (no model, no tokenizer).

- ``left_padded`` / ``right_padded``: rows of ids in one [rows, width] tensor and the mask of real
  tokens (a causal LM's rows end together; a seq2seq encoder's or decoder block's start together);
- ``positions_of``: each token's logical position under a left-padded mask;
- ``in_batches``: run a function over batches of requests, longest first, answers in request order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def left_padded(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids right-aligned in a [rows, width] tensor (padding on the left), and the mask of real tokens."""
    return _padded(rows, pad_id, max(len(r) for r in rows), left=True)


def right_padded(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids left-aligned in a [rows, width >= 1] tensor (padding on the right), and the mask of real tokens."""
    return _padded(rows, pad_id, max(1, max(len(r) for r in rows)), left=False)


def _padded(rows: Sequence[Sequence[int]], pad_id: int, width: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if all(len(r) == width for r in rows):  # no padding (a decode step): one tensor, no per-row copy
        ids = torch.tensor([list(r) for r in rows], dtype=torch.long)
        return ids, torch.ones_like(ids)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        if row:
            columns = slice(width - len(row), width) if left else slice(0, len(row))
            ids[r, columns] = torch.tensor(list(row), dtype=torch.long)
            mask[r, columns] = 1
    return ids, mask


def positions_of(mask: torch.Tensor) -> torch.Tensor:
    """Each column's logical position in its row of a left-padded ``mask`` (padding gets 0)."""
    return (mask.cumsum(dim=1) - 1).clamp(min=0)


def in_batches(lengths: Sequence[int], batch_size: int, run_batch: Callable[[list[int]], list]) -> list:
    """Run ``run_batch(indices)`` over batches, longest first; results in the original order."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    results: list = [None] * len(lengths)
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        for i, result in zip(batch, run_batch(batch)):
            results[i] = result
    return results
