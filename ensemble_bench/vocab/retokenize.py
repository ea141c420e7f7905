"""Canonical re-tokenisation: a member holds its own tokenizer's encoding of the generated text.

Two ways for a member to take text another member chose (method parameter ``retokenize``):
- ``local`` (GaC Eq. 4, vocab/append.py): the chosen bytes become one of the member's own tokens
  when it has one; the held ids spell the text but need not be what its tokenizer would produce
  (Qwen2.5 emits " Pre" "jud" "ice"; SmolLM2 holds those three, while its tokenizer gives
  " Pre" "judice").
- ``canonical`` (the UniTE and DeePEn reference code): after every chosen piece the member's held
  ids equal its tokenizer's encoding of the generated text so far.

Canonical, precisely. The prompt's ids are never touched. The generated text G (bytes) is encoded
on its own, as a continuation (no BOS, no SentencePiece dummy prefix: ``continuation_encoder``):
- a trailing incomplete UTF-8 character is *pending*: it is held back, not given to the member,
  until a later piece completes it;
- bytes that can never be valid UTF-8 (a stray continuation byte...) are single-byte tokens and
  split G into runs; each valid run is encoded as a continuation.
The reference code re-encodes prompt + generation as one string each step (UniTE ``unite2.py``
``tokenizer2(tokenizer1.batch_decode(input_ids1))``; DeePEn ``assist_model_input_list[i] += new_token``
then ``model_tokenizer(model_input)`` in ``AssistModelThread.run``). That differs from ours only
where the first generated word could merge with the end of the prompt (a prompt ending in "\\n"
followed by a generated "\\n"); like lm-eval's context/continuation split we keep the prompt fixed.

Efficiency. Re-encoding G from scratch every step costs O(len(G)). Instead ``CanonicalTail``
re-encodes only the held tokens after the last *hard boundary* (plus pending and new bytes): a
token boundary no later tokenisation can move and no token can cross, so that
encode(G) == held[:b] + encode(G[b:]). A boundary between bytes x | y is hard when
1. no vocabulary piece contains the byte pair xy (then no token, hence no BPE merge, crosses it),
   y starts a UTF-8 character, and
2. for byte-level BPE the pre-tokeniser's regex (GPT-2, Llama-3, Qwen2 patterns) splits there
   whatever follows: a non-space byte before a space; a newline before a non-space; or a letter
   before a letter (inside one run of letters, which the regexes match to its end from any start).
SentencePiece-style models here (Gemma-3, Llama-2) run BPE over the whole string with no regex
split, so rule 1 alone suffices. The prompt boundary (b = 0) is hard by definition.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ensemble_bench.vocab.append import common_prefix, single_byte_ids

Encode = Callable[[str], list[int]]
_SPACE = 0x20
_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")


def continuation_encoder(encode: Encode, anchor: str = "\n") -> Encode:
    """Text -> ids as a continuation: ``encode`` (no special tokens) behind ``anchor``, anchor ids removed.

    This drops a SentencePiece dummy-prefix space (Llama-2 encodes "hello" alone as "▁hello").
    When the text merges with the anchor (a leading newline), it is encoded alone instead.
    """
    anchor_ids = encode(anchor)

    def encode_continuation(text: str) -> list[int]:
        ids = encode(anchor + text)
        if ids[:len(anchor_ids)] == anchor_ids:
            return ids[len(anchor_ids):]
        return encode(text)

    return encode_continuation


def split_utf8(data: bytes) -> tuple[list[str | int], bytes]:
    """Split bytes into valid text runs and invalid single bytes, and a trailing incomplete character.

    Returns (parts, pending): each part is a ``str`` (a valid run) or an ``int`` (an invalid byte).
    """
    parts: list[str | int] = []
    while data:
        try:
            parts.append(data.decode("utf-8"))
            return parts, b""
        except UnicodeDecodeError as err:
            if err.start:
                parts.append(data[:err.start].decode("utf-8"))
            if err.reason == "unexpected end of data":
                return parts, data[err.start:]
            parts.extend(data[err.start:err.end])
            data = data[err.end:]
    return parts, b""


def pair_set(pieces: Sequence[bytes | None], special_ids=frozenset()) -> frozenset[bytes]:
    """Every adjacent byte pair inside some ordinary vocabulary piece (a token may cross such a pair)."""
    pairs: set[bytes] = set()
    for token_id, piece in enumerate(pieces):
        if piece is None or len(piece) < 2 or token_id in special_ids:
            continue
        pairs.update(piece[k:k + 2] for k in range(len(piece) - 1))
    return frozenset(pairs)


@dataclass(frozen=True)
class Plan:
    """Crop the row's generated ids to ``keep``, append ``ids``; ``pending`` bytes wait for the next piece."""

    keep: int
    ids: tuple[int, ...]
    pending: bytes


class CanonicalTail:
    """One member's canonical re-tokeniser (stateless: the caller keeps each row's ids and pending bytes).

    ``encode``: text -> ids of that text as a continuation (see ``continuation_encoder``).
    ``pieces``: the member's byte view (VocabView.pieces). ``spelling``: "byte-level" applies the
    regex rule of the module docstring; anything else relies on the pair rule alone.
    ``min_tokens``: held tokens always re-encoded (at least 1: the last token can change).
    """

    def __init__(self, encode: Encode, pieces: Sequence[bytes | None], spelling: str,
                 special_ids=frozenset(), min_tokens: int = 1):
        self.encode = encode
        self.pieces = pieces
        self.byte_level = spelling == "byte-level"
        self.pairs = pair_set(pieces, special_ids)
        self.byte_ids = single_byte_ids(pieces, special_ids)
        self.min_tokens = max(1, min_tokens)

    @classmethod
    def from_view(cls, view, encode: Encode, min_tokens: int = 1) -> CanonicalTail:
        """From a VocabView and a continuation encoder."""
        return cls(encode, view.pieces, view.spelling, view.special_ids, min_tokens)

    def canonical(self, data: bytes) -> tuple[list[int], bytes]:
        """From scratch: the canonical ids of generated bytes ``data`` and its pending tail."""
        parts, pending = split_utf8(data)
        ids: list[int] = []
        for part in parts:
            ids.extend(self.encode(part) if isinstance(part, str) else [self._byte_id(part)])
        return ids, pending

    def plan(self, held: Sequence[int], pending: bytes, new: bytes) -> Plan:
        """Append ``new`` bytes to a row holding generated ids ``held`` (+ ``pending`` bytes).

        If ``held`` is canonical, ``held[:keep] + ids`` is the canonical encoding of the whole text;
        otherwise (a member that appended its own chosen ids) it is canonical from the last hard
        boundary on. ``keep < len(held)`` implies ``ids`` is not empty (the re-encoded ids still
        cover the held bytes past ``keep``), so a crop always comes with ids to feed. ``ids`` empty
        and ``keep == len(held)``: the new bytes wait in ``pending`` (half a UTF-8 character).
        """
        start = self.window_start(held)
        window = b"".join(self.pieces[i] or b"" for i in held[start:])
        ids, rest = self.canonical(window + pending + new)
        same = common_prefix(held[start:], ids)
        return Plan(start + same, tuple(ids[same:]), rest)

    def window_start(self, held: Sequence[int]) -> int:
        """Index of the last hard boundary at least ``min_tokens`` tokens before the end (0: the prompt)."""
        for index in range(len(held) - self.min_tokens, 0, -1):
            before, after = self.pieces[held[index - 1]], self.pieces[held[index]]
            if before and after and self.is_hard(before, after):
                return index
        return 0

    def is_hard(self, before: bytes, after: bytes) -> bool:
        """Whether the boundary between two held tokens is hard (module docstring)."""
        x, y = before[-1], after[0]
        if 0x80 <= y <= 0xBF or bytes((x, y)) in self.pairs:
            return False
        if not self.byte_level:
            return True
        if y == _SPACE:
            return x not in _WHITESPACE
        if x == 0x0A:
            return y not in _WHITESPACE
        return _is_letter(before, at_end=True) and _is_letter(after, at_end=False)

    def _byte_id(self, byte: int) -> int:
        found = self.byte_ids[byte]
        if found is None:
            raise ValueError(f"the vocabulary has no token for byte 0x{byte:02X}")
        return found


def _is_letter(data: bytes, at_end: bool) -> bool:
    """Whether the first (or last) character of ``data`` is a letter (Unicode category L*)."""
    for size in range(1, min(4, len(data)) + 1):
        chunk = data[-size:] if at_end else data[:size]
        try:
            return unicodedata.category(chunk.decode("utf-8"))[0] == "L"
        except UnicodeDecodeError:
            continue
    return False
