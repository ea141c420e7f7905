"""The members' common vocabulary and each member's tokens spelled in it, for lossless vocabulary
reduction ("Lossless Vocabulary Reduction for Auto-Regressive Language Models", Chijiwa et al.,
ICLR 2026, arXiv 2510.08102, Sec. 3-4). Pure functions over vocabularies: no model.

- The maximal common vocabulary C: the byte strings that are an ordinary token of every member
  (the intersection), less, with the members' BPE merges given, every token that a BPE restricted
  to C could not build: a common token stays only when, for each member, it is one of that
  member's base symbols or some merge of that member builds it from two tokens still in C (the
  largest such set, by removal until nothing changes). Without merges: the plain intersection.
  (The paper's method section could not be read here; two secondary sources, the ICLR reviews and
  a papernotes.org summary, describe the MCV as "formed by intersecting vocabularies and
  restricting BPE merges accordingly": /work/helpers/papers_notes.md.)
- Nested tokenisation: each token v of a member is spelled as a sequence of common tokens
  dec(v) (a token that is itself common is spelled by itself), and a member's token sequence
  x_1..x_T maps to dec(x_1) ... dec(x_T) over C. Every token boundary is then a boundary of C
  tokens, which is what lets the reduced model open covering branches only where a common token
  ends (vocab/covering.py over symbols). dec is the member's own BPE restricted to the merges whose
  result is in C, run on v's base symbols (``BpeSpeller``), or, for a member without merges, the
  longest common token first, again and again (MaxMatch over C, ``CommonSpeller``). A token that
  cannot be spelled leaves the reduced model (``None``).
"""

from __future__ import annotations

from collections.abc import Sequence

Merge = tuple[bytes, bytes]  # a BPE merge by the bytes of its two operands (the result is their concatenation)


def common_vocabulary(pieces: Sequence[Sequence[bytes | None]], excluded: Sequence[frozenset[int]],
                      merges: Sequence[Sequence[Merge]] = ()) -> list[bytes]:
    """The members' maximal common vocabulary, sorted: the byte strings that are an ordinary (not
    ``excluded``) token of every member, closed under each member's BPE ``merges`` (none: no closure)."""
    shared: set[bytes] | None = None
    for member, skip in zip(pieces, excluded):
        own = {p for i, p in enumerate(member) if p and i not in skip}
        shared = own if shared is None else shared & own
    shared = shared or set()
    builders = [_builders(member) for member in merges if member]
    while True:
        buildable = {t for t in shared if all(_buildable(t, built, shared) for built in builders)}
        if buildable == shared:
            return sorted(shared)
        shared = buildable


def member_merges(pieces: Sequence[bytes | None], merges: Sequence[tuple[int, int, int]]) -> list[Merge]:
    """A member's merges (ids, by rank) as byte pairs, in rank order."""
    return [(pieces[left], pieces[right]) for left, right, _ in merges if pieces[left] and pieces[right]]


def _builders(merges: Sequence[Merge]) -> dict[bytes, list[Merge]]:
    built: dict[bytes, list[Merge]] = {}
    for left, right in merges:
        built.setdefault(left + right, []).append((left, right))
    return built


def _buildable(token: bytes, built: dict[bytes, list[Merge]], shared: set[bytes]) -> bool:
    """A base symbol of the member (no merge builds it), or some merge builds it from tokens in ``shared``."""
    ways = built.get(token)
    return ways is None or any(left in shared and right in shared for left, right in ways)


class CommonSpeller:
    """Spells bytes as common tokens, longest first (MaxMatch over the common vocabulary)."""

    def __init__(self, common: Sequence[bytes]):
        self.common = list(common)
        self.index = {piece: symbol for symbol, piece in enumerate(self.common)}
        self.longest = max((len(p) for p in self.common), default=0)

    def spell(self, data: bytes) -> tuple[int, ...] | None:
        """The common tokens of ``data``, longest match first (None: some position starts no common token)."""
        symbols, at = [], 0
        while at < len(data):
            for size in range(min(self.longest, len(data) - at), 0, -1):
                symbol = self.index.get(data[at:at + size])
                if symbol is not None:
                    symbols.append(symbol)
                    at += size
                    break
            else:
                return None
        return tuple(symbols)

    def nested(self, pieces: Sequence[bytes | None], excluded: frozenset[int]) -> list[tuple[int, ...] | None]:
        """dec(v) of every id of a member (None: excluded, empty, or not spelled in common tokens)."""
        return [None if not p or i in excluded else self.spell(p) for i, p in enumerate(pieces)]

    def spells(self, spellings: Sequence[tuple[int, ...] | None], ids: Sequence[int], symbols: Sequence[int]) -> bool:
        """Whether the member's ``ids`` map to exactly ``symbols`` (dec(x_1) ... dec(x_T) = y)."""
        at = 0
        for token in ids:
            spelled = spellings[token]
            if spelled is None or tuple(symbols[at:at + len(spelled)]) != spelled:
                return False
            at += len(spelled)
        return at == len(symbols)


class BpeSpeller:
    """One member's nested tokenisation: its BPE restricted to the merges whose result is common,
    run on each token's base symbols (the tokens no merge of the member builds)."""

    def __init__(self, common: CommonSpeller, merges: Sequence[Merge]):
        self.index = common.index
        self.rank: dict[Merge, int] = {}
        self.split: dict[bytes, Merge] = {}
        for rank, (left, right) in enumerate(merges):
            self.split.setdefault(left + right, (left, right))  # the first-ranked merge builds the token
            if left + right in self.index:
                self.rank.setdefault((left, right), rank)

    def base_symbols(self, token: bytes) -> list[bytes]:
        """The token taken apart along its own merges down to the member's base symbols."""
        parts = self.split.get(token)
        return [token] if parts is None else [*self.base_symbols(parts[0]), *self.base_symbols(parts[1])]

    def spell(self, token: bytes) -> tuple[int, ...] | None:
        """dec(token): restricted BPE, the best-ranked adjacent common merge first (leftmost on a tie)."""
        symbols = self.base_symbols(token)
        while len(symbols) > 1:
            ranks = [self.rank.get(pair, -1) for pair in zip(symbols, symbols[1:])]
            allowed = [(rank, at) for at, rank in enumerate(ranks) if rank >= 0]
            if not allowed:
                break
            _, at = min(allowed)
            symbols[at:at + 2] = [symbols[at] + symbols[at + 1]]
        spelled = [self.index.get(symbol) for symbol in symbols]
        return None if None in spelled else tuple(spelled)

    def nested(self, pieces: Sequence[bytes | None], excluded: frozenset[int]) -> list[tuple[int, ...] | None]:
        """dec(v) of every id of a member (None: excluded, empty, or not spelled in common tokens)."""
        return [None if not p or i in excluded else self.spell(p) for i, p in enumerate(pieces)]
