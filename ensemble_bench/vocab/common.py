"""The members' common vocabulary and each member's tokens spelled in it, for lossless vocabulary
reduction ("Lossless Vocabulary Reduction for Auto-Regressive Language Models", Chijiwa et al.,
ICLR 2026, arXiv 2510.08102, Sec. 3-4). Pure functions over vocabularies: no model.

- The common vocabulary C: the byte strings that are an ordinary token of every member (the
  paper's maximal common vocabulary of byte-level tokenizers is their intersection).
- Nested tokenisation: each token v of a member is spelled as a sequence of common tokens
  dec(v) (a token that is itself common is spelled by itself), and a member's token sequence
  x_1..x_T maps to dec(x_1) ... dec(x_T) over C. Every token boundary is then a boundary of C
  tokens, which is what lets the reduced model open covering branches only where a common token
  ends (vocab/covering.py over symbols). dec spells a token by the longest common token that
  starts it, again and again (MaxMatch over C); a token with a byte no common token starts with
  cannot be spelled and leaves the reduced model (``None``).
"""

from __future__ import annotations

from collections.abc import Sequence


def common_vocabulary(pieces: Sequence[Sequence[bytes | None]], excluded: Sequence[frozenset[int]]) -> list[bytes]:
    """The byte strings that are an ordinary (not ``excluded``) token of every member, sorted."""
    shared: set[bytes] | None = None
    for member, skip in zip(pieces, excluded):
        own = {p for i, p in enumerate(member) if p and i not in skip}
        shared = own if shared is None else shared & own
    return sorted(shared or ())


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
