"""Giving a member new text: which of its token ids to append, and how many to take back.

GaC Eq. 4 appends T^i(x), the member's tokenisation of the chosen token x. Tokenising x alone
would add spurious prefixes and break words apart, so a member takes new bytes this way:

1. it has a token with exactly these bytes -> append that id (a member ensembled with itself
   therefore follows its own greedy path exactly);
2. otherwise re-encode a short look-behind window (its last ``window`` tokens + the new bytes)
   and replace its tokens from the first position where old and new tokenisations part (the
   caller crops the KV cache there; everything before is kept);
3. bytes that are not yet valid UTF-8 (half a character) become single-byte tokens (byte-level
   BPE and SentencePiece byte fallback have one for every byte); a later re-encode of the window
   merges them once the character is complete.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


def split_valid_utf8(data: bytes) -> tuple[str, bytes]:
    """The longest prefix of ``data`` that is valid UTF-8 (as text), and the remaining bytes."""
    try:
        return data.decode("utf-8"), b""
    except UnicodeDecodeError as err:
        return data[:err.start].decode("utf-8"), data[err.start:]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class AppendPlan:
    drop: int             # tokens to take back from the end of the row
    ids: tuple[int, ...]  # ids to append after that


@dataclass(frozen=True)
class TextAppender:
    """One member's way of taking new bytes (see the module docstring)."""

    pieces: tuple[bytes | None, ...]     # the member's byte view
    by_bytes: dict[bytes, int]           # exact single-token lookup
    byte_ids: tuple[int | None, ...]     # single-byte token for each byte value
    encode: Callable[[str], list[int]]   # text -> ids, no BOS, no dummy-prefix space
    window: int = 4

    def plan(self, tail: Sequence[int], new: bytes) -> AppendPlan:
        exact = self.by_bytes.get(new)
        if exact is not None:
            return AppendPlan(0, (exact,))
        old = list(tail[-self.window:]) if self.window else []
        while old and _starts_mid_character(self.pieces[old[0]]):
            old = old[1:]  # never start the window inside a multi-byte character
        ids = self.encode_bytes(b"".join(self.pieces[i] or b"" for i in old) + new)
        keep = common_prefix(old, ids)
        return AppendPlan(len(old) - keep, tuple(ids[keep:]))

    def plan_all(self, tail: Sequence[int], chunks: Sequence[bytes]) -> tuple[int, list[int]]:
        """Apply several pieces one after another; return (tokens to drop from ``tail``, ids to add).

        Each plan looks at most ``window`` tokens back, so working on the last
        ``window * (len(chunks) + 1)`` tokens of the tail gives the same result as the whole tail.
        """
        base = max(0, len(tail) - self.window * (len(chunks) + 1))
        original = list(tail[base:])
        work = list(original)
        for chunk in chunks:
            step = self.plan(work, chunk)
            work = work[:len(work) - step.drop] + list(step.ids)
        keep = common_prefix(original, work)
        return len(original) - keep, work[keep:]

    def encode_bytes(self, data: bytes) -> list[int]:
        text, rest = split_valid_utf8(data)
        ids = self.encode(text) if text else []
        for byte in rest:
            if self.byte_ids[byte] is None:
                raise ValueError(f"the vocabulary has no token for byte 0x{byte:02X}")
            ids.append(self.byte_ids[byte])
        return ids


def _starts_mid_character(piece: bytes | None) -> bool:
    return bool(piece) and 0x80 <= piece[0] <= 0xBF


def single_byte_ids(pieces: Sequence[bytes | None], special_ids) -> tuple[int | None, ...]:
    """For each byte value, the lowest non-special id whose piece is exactly that byte."""
    found: list[int | None] = [None] * 256
    for token_id, piece in enumerate(pieces):
        if piece is not None and len(piece) == 1 and token_id not in special_ids and found[piece[0]] is None:
            found[piece[0]] = token_id
    return tuple(found)
