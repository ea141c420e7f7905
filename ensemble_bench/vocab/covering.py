"""Covering tokenisations of a byte string, for exact byte-level probabilities from a tokenized LM
("Exact Byte-Level Probabilities from Tokenized Language Models for FIM-Tasks and Model
Ensembles", arXiv 2410.09303, Sec. 3; "Sampling from Your Language Model One Byte at a Time",
ByteSampler, arXiv 2506.14123, Sec. 3). Pure functions over a vocabulary: no model.

A token sequence t_1..t_k *covers* bytes x (|x| = n) when bytes(t_1..t_{k-1}) is a strict prefix of x
and x is a prefix of bytes(t_1..t_k). Grouped by where the last token starts (j), the covers whose
first k-1 tokens are the tokenizer's canonical encoding c_j of x[:j] give

    P(x) = sum_j P(c_j) * sum_{t : x[j:] is a prefix of t} p(t | c_j)                         (2410.09303 Eq. 4)

and the next byte b of x (or the end of the text) has mass

    M(b | x) = sum_{j <= n} P(c_j) * sum_{t : x[j:] b is a prefix of t} p(t | c_j),
    M(end | x) = P(c_n) * sum_{s stop} p(s | c_n),                                             (ByteSampler Eq. 2)

normalised over the 256 bytes and the end. Each j is one branch of the covering tree: its trunk is
c_j, its leaves the tokens that extend x[j:]. A branch lives while some token extends x[j:], so at
most (longest piece + 1) branches are live at any byte.

``SortedVocab`` holds a member's text tokens sorted by their bytes: the tokens that extend a byte
string are one contiguous range of it, narrowed byte by byte (``narrow``), and the next-byte masses
of a branch are one scatter-add over its range (``next_byte_mass``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

import torch

END = 256  # index of "the text ends" in a next-byte distribution (257 entries)


def _after_prefix(prefix: bytes) -> bytes | None:
    """The least byte string greater than every string that starts with ``prefix`` (None: no bound)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


class SortedVocab:
    """A member's ordinary text tokens (no special ids, no empty pieces) sorted by their bytes."""

    def __init__(self, pieces: Sequence[bytes | None], excluded: frozenset[int] = frozenset()):
        ids = [i for i, p in enumerate(pieces) if p and i not in excluded]
        ids.sort(key=lambda i: pieces[i])
        self.pieces = [pieces[i] for i in ids]
        self.order = torch.tensor(ids, dtype=torch.long)
        width = max((len(p) for p in self.pieces), default=1)
        matrix = torch.full((len(ids), width + 1), END, dtype=torch.long)  # byte k of each piece, END past its end
        for row, piece in enumerate(self.pieces):
            matrix[row, :len(piece)] = torch.tensor(list(piece), dtype=torch.long)
        self.bytes_at = matrix
        self._placed: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def size(self) -> int:
        return len(self.pieces)

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(order, bytes_at) on ``device`` (copied once)."""
        key = str(device)
        if key not in self._placed:
            self._placed[key] = (self.order.to(device), self.bytes_at.to(device))
        return self._placed[key]

    def narrow(self, lo: int, hi: int, prefix: bytes) -> tuple[int, int]:
        """The range of tokens that start with ``prefix``, inside [lo, hi) (which holds a shorter prefix's)."""
        start = bisect_left(self.pieces, prefix, lo, hi)
        bound = _after_prefix(prefix)
        return start, (hi if bound is None else bisect_left(self.pieces, bound, start, hi))


@dataclass(frozen=True)
class Branch:
    """One branch of the covering tree: trunk c_j (log-probability ``logp``), its next-token
    probabilities in sorted-vocabulary order, and the range of tokens extending x[j:] (``depth`` bytes)."""

    logp: float
    probs: torch.Tensor    # [sorted vocab] p(t | c_j)
    lo: int
    hi: int
    depth: int = 0          # len(x[j:])
    end: float = 0.0        # p(stop | c_j); counts only while depth == 0

    @property
    def width(self) -> int:
        return self.hi - self.lo

    def grow(self, vocab: SortedVocab, suffix: bytes) -> Branch | None:
        """The branch after x grows by one byte (``suffix`` = the new x[j:]); None once no token extends it."""
        lo, hi = vocab.narrow(self.lo, self.hi, suffix)
        if lo == hi:
            return None
        return Branch(self.logp, self.probs, lo, hi, len(suffix), 0.0)

    def next_byte_mass(self, vocab: SortedVocab) -> torch.Tensor:
        """[257] sum of p(t | c_j) over the range's tokens by their byte after x[j:] (END: the stop mass at depth 0)."""
        _, bytes_at = vocab.on(self.probs.device)
        mass = torch.zeros(END + 1, dtype=self.probs.dtype, device=self.probs.device)
        mass.index_add_(0, bytes_at[self.lo:self.hi, self.depth], self.probs[self.lo:self.hi])
        mass[END] = self.end if self.depth == 0 else 0.0  # slot END held the pieces that end with x
        return mass


def branch_at(vocab: SortedVocab, logp: float, logprobs: torch.Tensor, stop_ids: Sequence[int]) -> Branch:
    """A new branch at the end of x (depth 0): every token extends the empty suffix."""
    order, _ = vocab.on(logprobs.device)
    probs = logprobs.float().exp()
    end = float(probs[list(stop_ids)].sum()) if stop_ids else 0.0
    return Branch(logp, probs[order], 0, vocab.size, 0, end)


def next_byte_distribution(vocab: SortedVocab, branches: Sequence[Branch]) -> torch.Tensor:
    """[257] M(. | x) normalised (module docstring), from the live branches of one member."""
    top = max(b.logp for b in branches)
    total = sum(torch.exp(torch.tensor(b.logp - top)) * b.next_byte_mass(vocab).cpu() for b in branches)
    return total / total.sum()
