"""Word boundaries as each tokenizer sees them, and the boundaries common to several
(Cool-Fusion Sec. 2.1-2.2; SweetSpan's spans of whole words).

A tokenizer's words are the pieces its own pre-tokenisation makes, and no token crosses them:
- byte-level BPE (GPT-2, Llama-3, Qwen, SmolLM): the pre-tokenizer's regex split, e.g. SmolLM2
  splits "Multi-tasking" into "Multi" | "-" | "tasking", Llama-3 and Qwen2 into "Multi" | "-tasking";
- SentencePiece (Llama-2, Gemma): a word begins with its '▁' (space): every run of spaces starts
  a new word and everything up to the next run belongs to it ("Multi-tasking" is one word).
``word_starts`` gives the character offsets (> 0) where a word other than the first begins; a
segment of text may end at such an offset (the words before it are complete, the one after may
not be). ``common_ends`` intersects these over tokenizers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

PreTokenize = Callable[[str], list[tuple[str, tuple[int, int]]]]


def whitespace_word_starts(text: str) -> list[int]:
    """SentencePiece words: each run of spaces begins a word."""
    return [i for i in range(1, len(text)) if text[i] == " " and text[i - 1] != " "]


def word_starts(text: str, spelling: str, pre_tokenize: PreTokenize | None = None) -> list[int]:
    """Offsets > 0 where a word begins, by the tokenizer's own pre-tokenisation."""
    if spelling == "byte-level" and pre_tokenize is not None:
        return sorted({start for _, (start, _) in pre_tokenize(text) if 0 < start < len(text)})
    return whitespace_word_starts(text)


def common_ends(starts: Sequence[Sequence[int]]) -> list[int]:
    """Offsets where every tokenizer has a word boundary (sorted)."""
    common = set(starts[0])
    for other in starts[1:]:
        common &= set(other)
    return sorted(common)
