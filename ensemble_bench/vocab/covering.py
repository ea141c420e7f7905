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

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

import torch

END = 256  # index of "the text ends" in a next-byte distribution (257 entries)


def _after_prefix(prefix: Spelling) -> Spelling | None:
    """The least spelling greater than every spelling that starts with ``prefix`` (None: no bound).
    Bytes stop at 0xff; a tuple of symbols has no largest symbol, so its last one steps up."""
    if isinstance(prefix, tuple):
        return prefix[:-1] + (prefix[-1] + 1,) if prefix else None
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


Spelling = bytes | tuple[int, ...]  # a token's bytes, or (lvr) its symbols in a smaller vocabulary


class SortedVocab:
    """A member's ordinary text tokens (no special ids, no empty pieces) sorted by their spelling:
    bytes over the 256-byte alphabet, or tuples of symbol ids over an alphabet of ``end`` symbols
    (``end`` is also the index of "the text ends" in a next-symbol distribution)."""

    def __init__(self, pieces: Sequence[Spelling | None], excluded: frozenset[int] = frozenset(), end: int = 256):
        ids = [i for i, p in enumerate(pieces) if p and i not in excluded]
        ids.sort(key=lambda i: pieces[i])
        self.pieces = [pieces[i] for i in ids]
        self.end = end
        self.order = torch.tensor(ids, dtype=torch.long)
        width = max((len(p) for p in self.pieces), default=1)
        # columns[k, r]: symbol k of sorted piece r, end past its end (symbol-major: a branch reads one row)
        columns = torch.full((width + 1, len(ids)), end, dtype=torch.long)
        for row, piece in enumerate(self.pieces):
            columns[:len(piece), row] = torch.tensor(list(piece), dtype=torch.long)
        self.columns = columns
        self.bytes_at = columns.T  # [sorted piece, k] (a view)
        # the first symbol of every id of the head (end + 1: excluded, no piece, or past the pieces)
        first = torch.full((len(pieces),), end + 1, dtype=torch.long)
        first[self.order] = columns[0]
        self.first_byte = first
        self._placed: dict[str, tuple[torch.Tensor, ...]] = {}

    @property
    def size(self) -> int:
        return len(self.pieces)

    def _on(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        key = str(device)
        if key not in self._placed:
            self._placed[key] = tuple(t.to(device) for t in (self.order, self.columns, self.first_byte))
        return self._placed[key]

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(order, bytes_at) on ``device`` (copied once)."""
        order, columns, _ = self._on(device)
        return order, columns.T

    def narrow(self, lo: int, hi: int, prefix: Spelling) -> tuple[int, int]:
        """The range of tokens that start with ``prefix``, inside [lo, hi) (which holds a shorter prefix's)."""
        start = bisect_left(self.pieces, prefix, lo, hi)
        bound = _after_prefix(prefix)
        return start, (hi if bound is None else bisect_left(self.pieces, bound, start, hi))


@dataclass(frozen=True)
class Branch:
    """One branch of the covering tree: trunk c_j (log-probability ``logp``), its next-token
    probabilities p(t | c_j) in the member's id order, and the range of sorted tokens extending
    x[j:] (``depth`` bytes). ``mass``: its next-byte masses when opened at depth 0 (computed with
    every branch opened in the same step, ``open_branches``)."""

    logp: float
    probs: torch.Tensor    # [head] p(t | c_j), id order
    lo: int
    hi: int
    depth: int = 0          # len(x[j:])
    end: float = 0.0        # p(stop | c_j); counts only while depth == 0
    mass: torch.Tensor | None = None  # [257] at depth 0, when already summed
    allowed: frozenset[int] | None = None  # at depth 0: the first symbols its tokens may have (vocab/lookahead.py)

    @property
    def width(self) -> int:
        return self.hi - self.lo

    def grow(self, vocab: SortedVocab, suffix: Spelling) -> Branch | None:
        """The branch after x grows by one symbol (``suffix`` = the new x[j:]); None once no token extends it."""
        if self.allowed is not None and suffix[0] not in self.allowed:
            return None
        lo, hi = vocab.narrow(self.lo, self.hi, suffix)
        if lo == hi:
            return None
        return Branch(self.logp, self.probs, lo, hi, len(suffix), 0.0)

    def next_byte_mass(self, vocab: SortedVocab) -> torch.Tensor:
        """[257] sum of p(t | c_j) over the range's tokens by their byte after x[j:] (END: the stop mass at depth 0)."""
        return next_byte_masses(vocab, [self])[0]


def exact_exp(logprobs: torch.Tensor) -> torch.Tensor:
    """``logprobs.float().exp()`` without exp's slow path where the result leaves float32's normal
    range (below -87.3: subnormal, then 0 below -104; most of a peaked distribution is there): the
    normal part in one exp, the few subnormal results by themselves, the rest exactly 0."""
    logprobs = logprobs.float()
    small = logprobs < -87.0
    if not bool(small.any()):
        return logprobs.exp()
    probs = torch.where(small, -80.0, logprobs).exp().masked_fill_(small, 0.0)
    subnormal = (small & (logprobs > -110.0)).nonzero(as_tuple=True)
    if subnormal[0].numel():
        probs[subnormal] = logprobs[subnormal].exp()
    return probs


def open_branches(vocab: SortedVocab, logps: Sequence[float], logprobs: torch.Tensor,
                  stop_ids: Sequence[int]) -> list[Branch]:
    """New branches at the end of x (depth 0), one per row of ``logprobs`` [rows, head]: one exp,
    one scatter-add of every row's probabilities by first byte, one stop sum for all rows
    (ByteSampler Eq. 2, the j = n term)."""
    probs, mass = opening_masses(vocab, logprobs, stop_ids)
    return [opened_branch(vocab, logp, probs[k], mass[k]) for k, logp in enumerate(logps)]


def opened_branch(vocab: SortedVocab, logp: float, probs: torch.Tensor, mass: torch.Tensor) -> Branch:
    """The branch at the end of x with trunk log-probability ``logp``, from ``opening_masses``' row."""
    return Branch(float(logp), probs, 0, vocab.size, 0, 0.0, mass)


def opening_masses(vocab: SortedVocab, logprobs: torch.Tensor,
                   stop_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities [rows, head], next-byte masses [rows, 257]) of branches opened on each row of
    ``logprobs``: the first-byte sums and the stop mass of ``open_branches``."""
    probs = exact_exp(logprobs)
    return probs, first_byte_masses(vocab, probs, stop_ids)


def first_byte_masses(vocab: SortedVocab, probs: torch.Tensor, stop_ids: Sequence[int]) -> torch.Tensor:
    """[rows, 257] each row's probabilities ``probs`` [rows, head] summed by the first byte of
    their token (one scatter-add along the vocabulary, token by token in id order), END: the stop mass."""
    rows, head = probs.shape
    _, _, first_byte = vocab._on(probs.device)
    if head > len(first_byte):  # a head wider than the pieces: the rest is no ordinary piece
        first_byte = torch.cat([first_byte, first_byte.new_full((head - len(first_byte),), vocab.end + 1)])
    mass = torch.zeros((rows, vocab.end + 2), dtype=probs.dtype, device=probs.device)
    mass.index_add_(1, first_byte[:head], probs)
    mass = mass[:, :vocab.end + 1]
    stops = [s for s in stop_ids if s < head]
    mass[:, vocab.end] = probs[:, stops].sum(dim=1) if stops else 0.0
    return mass


def shifted_opening(vocab: SortedVocab, logprobs: torch.Tensor,
                    stop_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``opening_masses`` scaled by each row's largest probability, written over ``logprobs``:
    (probabilities p(t) / p_max [rows, head], their first-byte masses [rows, 257], log p_max [rows]).
    A branch opened on a row takes log p_max into its trunk log-probability, so its weighted masses
    are the same. Relative to p_max, exp's result stays in float32's normal range down to e^-87
    and the rest is read as e^-87 (at most head * e^-87 of the largest, far below what a score
    resolves): one clamp and one exp, without exp's slow path on the underflowing tail."""
    top = logprobs.amax(dim=1)
    probs = logprobs.sub_(top[:, None]).clamp_(min=-87.0).exp_()
    return probs, first_byte_masses(vocab, probs, stop_ids), top


def branch_at(vocab: SortedVocab, logp: float, logprobs: torch.Tensor, stop_ids: Sequence[int]) -> Branch:
    """A new branch at the end of x (depth 0): every token extends the empty suffix."""
    return open_branches(vocab, [logp], logprobs[None], stop_ids)[0]


def next_byte_masses(vocab: SortedVocab, branches: Sequence[Branch]) -> torch.Tensor:
    """[branches, 257] each branch's next-byte masses: the ones opened this step as summed then, the
    narrowed ones in one scatter-add over all their ranges (each range's tokens by their byte after
    x[j:]; the pieces equal to x[j:] land on END, which holds no mass past depth 0). No branches: no rows."""
    width = vocab.end + 1
    if not branches:
        return torch.zeros((0, width))
    device = branches[0].probs.device
    order, columns, _ = vocab._on(device)
    masses = torch.zeros((len(branches), width), dtype=branches[0].probs.dtype, device=device)
    opened = [k for k, b in enumerate(branches) if b.mass is not None]
    if opened:
        masses[opened] = torch.stack([branches[k].mass for k in opened])
    narrowed = [k for k, b in enumerate(branches) if b.mass is None]
    if narrowed:
        chosen = [branches[k] for k in narrowed]
        values = torch.cat([b.probs[order[b.lo:b.hi]] for b in chosen])
        bins = torch.cat([columns[b.depth, b.lo:b.hi] + width * k for k, b in zip(narrowed, chosen)])
        masses.view(-1).index_add_(0, bins, values)
        masses[narrowed, vocab.end] = torch.tensor([b.end if b.depth == 0 else 0.0 for b in chosen],
                                             dtype=masses.dtype, device=device)
    return masses


def mixture_by_row(masses: torch.Tensor, logps: torch.Tensor, rows: torch.Tensor, count: int) -> torch.Tensor:
    """[count, 257] M(. | x) normalised per row (module docstring): the branches' masses ``masses``
    [branches, 257] weighted by P(c_j) = exp(``logps``) relative to the row's largest, summed into
    their ``rows``. A row with no mass (no live branch, or only pieces that end at x) stays all zero:
    the member gives every continuation of x probability zero."""
    top = torch.full((count,), -math.inf, dtype=logps.dtype).scatter_reduce(0, rows, logps, "amax")
    weights = (logps - top[rows]).exp().to(device=masses.device, dtype=masses.dtype)
    total = torch.zeros((count, masses.shape[1]), dtype=masses.dtype, device=masses.device)
    total.index_add_(0, rows.to(masses.device), weights[:, None] * masses)
    sums = total.sum(dim=1, keepdim=True)
    return total / torch.where(sums > 0, sums, 1.0)


def next_byte_distribution(vocab: SortedVocab, branches: Sequence[Branch]) -> torch.Tensor:
    """[257] M(. | x) normalised (module docstring), from the live branches of one member."""
    logps = torch.tensor([b.logp for b in branches], dtype=torch.float64)
    rows = torch.zeros(len(branches), dtype=torch.long)
    return mixture_by_row(next_byte_masses(vocab, branches), logps, rows, 1)[0].cpu()
