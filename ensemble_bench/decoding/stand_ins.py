"""The members a speculative round talks to (decoding/speculative.py): ``Rehearsal`` records what a
member would be given and computes nothing; ``StandIn`` answers from the distributions fetched for the
round's block, reading any it was not given in one forward. Both see rows through ``focus``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from ensemble_bench.members.base import Member


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    k = 0
    while a[k] == b[k]:
        k += 1
    return k


class Read(NamedTuple):
    """What a row of a ``StandIn`` is to hold (``target`` ids) and the lengths of it whose
    distributions are needed."""

    target: list[int]
    needed: list[int]


class Focused:
    """Rows of a member as a method sees them: ``focus`` names the rows (of the whole batch) that
    the method's next calls mean, in order; tokenizer attributes come from the member itself."""

    def __init__(self, member: Member, rows: list[list[int]]):
        self.member = member
        self.virtual = rows
        self.focus = list(range(len(rows)))

    def __getattr__(self, name: str):
        return getattr(self.member, name)

    def row_ids(self) -> list[list[int]]:
        return [list(self.virtual[r]) for r in self.focus]

    def crop(self, lengths: Sequence[int]) -> None:
        for r, length in zip(self.focus, lengths):
            self._cropped(r, int(length))
            del self.virtual[r][int(length):]

    def extend(self, tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        for r, row in zip(self.focus, tokens):
            self.virtual[r].extend(int(t) for t in row)
        return self._after_extend([r for r, row in zip(self.focus, tokens) if row])

    def _cropped(self, row: int, length: int) -> None:
        """A hook: row ``row`` is about to be cut to ``length`` tokens."""

    def _after_extend(self, rows: list[int]) -> torch.Tensor:
        raise NotImplementedError


class Rehearsal(Focused):
    """A member without its model: it records what it is given (ids) and the lengths at which the
    method will ask for its distribution; the distributions it returns are empty placeholders."""

    def __init__(self, member: Member, rows: list[list[int]]):
        super().__init__(member, [list(r) for r in rows])
        self.needed: list[list[int]] = [[len(r)] for r in rows]

    def _cropped(self, row: int, length: int) -> None:
        self.needed[row] = [n for n in self.needed[row] if n <= length]  # the block cannot serve them

    def _after_extend(self, rows: list[int]) -> torch.Tensor:
        for r in rows:
            self.needed[r].append(len(self.virtual[r]))
        return torch.empty((len(self.focus), 0))


class StandIn(Focused):
    """A member during decoding: ``virtual`` is what the method gave each row, ``real`` what the
    member's KV cache holds, ``known[r]`` the fetched distributions of row r by length (valid while
    ``real[r]`` keeps that prefix). A distribution asked for and not known is fetched at once."""

    def __init__(self, member: Member, dists: torch.Tensor):
        real = member.row_ids()
        super().__init__(member, [list(r) for r in real])
        self.real = real
        self.known: list[dict[int, torch.Tensor]] = [{len(r): dists[k]} for k, r in enumerate(real)]
        self.forwards = [0] * len(real)  # forward passes each row took part in
        self.calls = 0
        self.width = 0  # the widest row of the last block read, in tokens

    def _after_extend(self, rows: list[int]) -> torch.Tensor:
        return self.current()

    def served(self, row: int) -> torch.Tensor | None:
        length = len(self.virtual[row])
        dist = self.known[row].get(length)
        if dist is None or self.real[row][:length] != self.virtual[row]:
            return None
        return dist

    def current(self) -> torch.Tensor:
        """The focused rows' distributions [rows, V] (those not known fetched first, in one forward)."""
        missing = {r: Read(self.virtual[r], [len(self.virtual[r])]) for r in self.focus if self.served(r) is None}
        if missing:
            self.fetch(missing)
        return torch.stack([self.served(r) for r in self.focus])

    def fetch(self, plans: dict[int, Read]) -> None:
        """For each row r in ``plans``: hold its ``target`` and know its distributions at the
        ``needed`` lengths. One crop and one ``read_block`` for all rows."""
        lengths = [len(r) for r in self.real]
        blocks: list[list[int]] = [[] for _ in self.real]
        wanted: list[list[int]] = [[] for _ in self.real]
        for r, (target, needed) in plans.items():
            keep = common_length(self.real[r], target)
            missing = sorted({n for n in needed if n > keep or n not in self.known[r]})
            if not missing:
                continue
            keep = min(keep, missing[0] - 1)
            lengths[r], blocks[r], wanted[r] = keep, list(target[keep:]), missing
        if not any(blocks):
            return
        if any(n < len(r) for n, r in zip(lengths, self.real)):
            self.member.crop(lengths)
            for r, n in enumerate(lengths):
                del self.real[r][n:]
                self.known[r] = {m: d for m, d in self.known[r].items() if m <= n}
        dists = self.member.read_block(blocks, [[n - lengths[r] - 1 for n in wanted[r]] for r in range(len(blocks))])
        self.calls += 1
        self.width = max(len(block) for block in blocks)
        for r, block in enumerate(blocks):
            if block:
                self.real[r].extend(block)
                self.forwards[r] += 1
                self.known[r].update(zip(wanted[r], dists[r]))

    def keep(self, rows: Sequence[int]) -> None:
        """Only these rows stay (finished rows leave), in the member too."""
        self.member.keep(rows)
        for name in ("virtual", "real", "known", "forwards"):
            values = getattr(self, name)
            setattr(self, name, [values[r] for r in rows])
        self.focus = list(range(len(rows)))

    def prune(self) -> None:
        """Forget distributions no later decision can ask for (shorter than what the row holds now)."""
        for r, row in enumerate(self.virtual):
            self.known[r] = {n: d for n, d in self.known[r].items() if n >= len(row)}


def focus(members: Sequence[Focused], rows: list[int]) -> None:
    for member in members:
        member.focus = list(rows)


