"""The batch of rows a member is stepping: each row's ids and next-token log-probs, with the
bookkeeping every member does alike (checking a step's row count, recording appended ids, replacing
the distributions of the rows that moved, crop and keep). LocalMember, Seq2SeqMember and
RemoteMember compose it; members/kv.py's ``CachedRows`` adds the KV cache's mask.

``last`` is replaced, never written in place, so a tensor a step returned is never changed by a
later call; a cropped row's distribution is NaN until it gets tokens again.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class RowBatch:
    """Rows in flight on one member (row indices refer to the batch after the last ``keep``)."""

    def __init__(self, vocab_size: int, device: torch.device):
        self.vocab_size, self.device = vocab_size, device
        self.start(0)

    def start(self, rows: int) -> None:
        """A fresh batch of ``rows`` rows: no ids, no distributions yet."""
        self.ids: list[list[int]] = [[] for _ in range(rows)]
        self.last = torch.full((rows, self.vocab_size), float("nan"), device=self.device)

    def check(self, tokens: Sequence[Sequence[int]]) -> None:
        """A step must give every row of the batch its (possibly empty) tokens."""
        if len(tokens) != len(self.ids):
            raise ValueError(f"extend got {len(tokens)} rows, the batch has {len(self.ids)}")

    def check_block(self, tokens: Sequence[Sequence[int]], at: Sequence[Sequence[int]]) -> list[list[int]]:
        """A ``read_block`` call's positions as plain lists, after checking them: one list per row,
        ascending indices into that row's block."""
        self.check(tokens)
        if len(at) != len(tokens):
            raise ValueError(f"read_block got positions for {len(at)} rows, the batch has {len(tokens)}")
        picks = [[int(i) for i in row] for row in at]
        for r, (row, wanted) in enumerate(zip(tokens, picks)):
            if any(not 0 <= i < len(row) for i in wanted) or any(a >= b for a, b in zip(wanted, wanted[1:])):
                raise ValueError(f"row {r}: positions {wanted} are not ascending indices into its {len(row)} tokens")
        return picks

    def take(self, tokens: Sequence[Sequence[int]]) -> list[int]:
        """The rows that receive tokens (in order); their ids are recorded."""
        active = [r for r, row in enumerate(tokens) if row]
        for r in active:
            self.ids[r].extend(int(t) for t in tokens[r])
        return active

    def set_last(self, active: Sequence[int], logprobs: torch.Tensor) -> torch.Tensor:
        """Every row's next-token log-probs, after ``active`` rows got ``logprobs`` [len(active), V]."""
        if len(active) == len(self.ids):
            self.last = logprobs
        elif active:
            index = torch.tensor(list(active), dtype=torch.long, device=self.last.device)
            self.last = self.last.index_copy(0, index, logprobs)
        return self.last

    def set_last_of(self, active: Sequence[int], logprobs: torch.Tensor) -> torch.Tensor:
        """``set_last`` from ``logprobs`` [rows, V] holding a row for every row of the batch (those of
        rows outside ``active`` are ignored): one pass into a new tensor, no copy of the active rows."""
        if len(active) == len(self.ids):
            self.last = logprobs
        elif active:
            moved = torch.zeros((len(self.ids), 1), dtype=torch.bool, device=self.last.device)
            moved[list(active)] = True
            self.last = torch.where(moved, logprobs, self.last)
        return self.last

    def crop(self, lengths: Sequence[int]) -> list[int]:
        """Roll row r back to ``lengths[r]`` ids (all rows checked first); the tokens each row lost."""
        lengths = [int(n) for n in lengths]
        for r, length in enumerate(lengths):
            if not 0 <= length <= len(self.ids[r]):
                raise ValueError(f"row {r}: cannot crop {len(self.ids[r])} tokens to {length}")
        dropped = [len(ids) - length for ids, length in zip(self.ids, lengths)]
        cropped = [r for r, count in enumerate(dropped) if count]
        for r in cropped:
            del self.ids[r][lengths[r]:]
        if cropped:
            index = torch.tensor(cropped, dtype=torch.long, device=self.last.device)
            self.last = self.last.index_fill(0, index, float("nan"))
        return dropped

    def keep(self, rows: Sequence[int]) -> torch.Tensor:
        """Keep only ``rows``, in this order (a row named twice becomes two rows with their own ids);
        returns them as an index tensor on the batch's device."""
        index = torch.tensor([int(r) for r in rows], dtype=torch.long, device=self.last.device)
        self.ids = [list(self.ids[r]) for r in index.tolist()]
        self.last = self.last.index_select(0, index)
        return index

    def blocks(self, logprobs: torch.Tensor | None, active: Sequence[int],
               columns: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """``read_block``'s answer: per row, the positions ``columns[k]`` of ``logprobs[k]`` ([active
        rows, positions, V]) for the k-th row in ``active``; an empty [0, V] tensor for the other
        rows. One gather, into a new tensor (never a view of ``logprobs``)."""
        out = [torch.empty((0, self.vocab_size), device=self.device)] * len(self.ids)
        if logprobs is None or not active:
            return out
        device = logprobs.device
        which = torch.tensor([k for k, cols in enumerate(columns) for _ in cols], dtype=torch.long, device=device)
        where = torch.tensor([c for cols in columns for c in cols], dtype=torch.long, device=device)
        picked = logprobs[which, where].to(self.device).split([len(cols) for cols in columns])
        for r, block in zip(active, picked):
            out[r] = block
        return out

    def row_ids(self) -> list[list[int]]:
        """A copy of each row's ids."""
        return [list(r) for r in self.ids]

