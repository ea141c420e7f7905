"""A byte-exact view of a tokenizer's vocabulary: token id -> the bytes it stands for.

Decoding one token at a time by text is lossy (a byte-level piece holding half of a UTF-8
character decodes to U+FFFD), so everything that compares vocabularies keys tokens by bytes.

Three spellings of bytes are covered:
- byte-level BPE (GPT-2, Llama-3, Qwen, SmolLM): every byte is written as one printable
  character ('Ġ' is the space byte, 'Ċ' the newline byte);
- SentencePiece (Llama-2, Gemma): '▁' is a space and ``<0xNN>`` pieces are raw bytes
  (byte fallback); other pieces are UTF-8 text;
- added tokens (chat markers, special tokens): their literal text, in UTF-8.
Ids with no text of their own (rows of an embedding matrix padded beyond the tokenizer, or
placeholder tokens such as ``[PAD151665]``) get ``None`` and are ignored by every map.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_PLACEHOLDER = re.compile(r"^\[PAD\d+\]$")
SPACE_MARK = "\u2581"  # '▁'


@lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[str, int]:
    """Character -> byte of the byte-level BPE alphabet.

    Printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the remaining
    68 bytes are written as the characters U+0100, U+0101, ... in increasing byte order.
    """
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    alphabet: dict[str, int] = {}
    shifted = 0
    for byte in range(256):
        if byte in printable:
            alphabet[chr(byte)] = byte
        else:
            alphabet[chr(0x100 + shifted)] = byte
            shifted += 1
    return alphabet


@dataclass(frozen=True)
class VocabView:
    """Token id -> bytes for every row of a model's output head.

    ``pieces[i]`` is the bytes of id ``i`` or ``None`` for ids without text (padded head rows,
    placeholders). ``special_ids`` are control tokens (BOS/EOS/chat markers): they keep their
    literal text in ``pieces`` so that concatenation reproduces ``decode(...,
    skip_special_tokens=False)``, but ensembling maps treat them apart.
    """

    pieces: tuple[bytes | None, ...]
    special_ids: frozenset[int]
    spelling: str  # "byte-level" | "sentencepiece" | "text"
    strips_leading_space: bool = False  # the tokenizer's decode drops one space at the very start
    merges: tuple[tuple[int, int, int], ...] = ()  # a BPE model's merges (left, right, result ids), by rank

    @property
    def size(self) -> int:
        return len(self.pieces)

    def join(self, ids) -> bytes:
        """Concatenate the bytes of ``ids``; an id without bytes contributes nothing."""
        return b"".join(self.pieces[i] or b"" for i in ids)

    def text_ids(self) -> list[int]:
        """Ids that stand for ordinary text (not special, not empty)."""
        return [i for i, p in enumerate(self.pieces) if p is not None and i not in self.special_ids]


def _decoder_types(tokenizer_json: dict) -> set[str]:
    """Every component type named in the tokenizer's decoder (nested sequences flattened)."""
    found: set[str] = set()
    stack = [tokenizer_json.get("decoder")]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "type" in node:
                found.add(node["type"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def _strips_leading_space(tokenizer_json: dict) -> bool:
    """SentencePiece decoders remove the dummy-prefix space: a Strip step, or Metaspace prepending."""
    stack = [tokenizer_json.get("decoder")]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "Strip" and node.get("start", node.get("left", 0)):
                return True
            if node.get("type") == "Metaspace" and node.get("prepend_scheme", "always") != "never":
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _spelling(tokenizer_json: dict) -> str:
    types = _decoder_types(tokenizer_json)
    if "ByteLevel" in types:
        return "byte-level"
    if types & {"Metaspace", "ByteFallback", "Replace"}:
        return "sentencepiece"
    return "text"


def piece_bytes(piece: str, spelling: str) -> bytes:
    """Bytes of one (non-added) vocabulary piece under the tokenizer's spelling."""
    if spelling == "byte-level":
        alphabet = byte_level_alphabet()
        if all(ch in alphabet for ch in piece):
            return bytes(alphabet[ch] for ch in piece)
        return piece.encode("utf-8")
    if spelling == "sentencepiece":
        byte = _BYTE_FALLBACK.match(piece)
        if byte:
            return bytes([int(byte.group(1), 16)])
        return piece.replace(SPACE_MARK, " ").encode("utf-8")
    return piece.encode("utf-8")


def build_vocab_view(tokenizer, head_size: int | None = None) -> VocabView:
    """Build the byte view of a transformers fast tokenizer for a head of ``head_size`` rows."""
    backend = tokenizer.backend_tokenizer
    described = json.loads(backend.to_str())
    spelling = _spelling(described)
    vocab = backend.get_vocab(with_added_tokens=False)
    added = {i: tok for i, tok in tokenizer.added_tokens_decoder.items()}
    size = max(head_size or 0, len(tokenizer), max(vocab.values(), default=-1) + 1)
    pieces: list[bytes | None] = [None] * size
    for piece, idx in vocab.items():
        if idx < size and not _PLACEHOLDER.match(piece):
            pieces[idx] = piece_bytes(piece, spelling)
    special: set[int] = set(tokenizer.all_special_ids)
    for idx, token in added.items():
        if idx >= size or _PLACEHOLDER.match(token.content):
            continue
        pieces[idx] = token.content.encode("utf-8")
        if token.special:
            special.add(idx)
    if head_size is not None:
        pieces = pieces[:head_size] + [None] * (head_size - len(pieces[:head_size]))
    return VocabView(tuple(pieces), frozenset(i for i in special if i < len(pieces)), spelling,
                     _strips_leading_space(described), _bpe_merges(described.get("model") or {}, vocab, len(pieces)))


def _bpe_merges(model: dict, vocab: dict[str, int], size: int) -> tuple[tuple[int, int, int], ...]:
    """A BPE model's merges as (left, right, result) ids in rank order; () for other models."""
    if model.get("type") != "BPE":
        return ()
    merges = []
    for merge in model.get("merges") or ():
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        ids = vocab.get(left), vocab.get(right), vocab.get(left + right)
        if None not in ids and max(ids) < size:
            merges.append(ids)
    return tuple(merges)
