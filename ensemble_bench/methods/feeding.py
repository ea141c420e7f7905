"""Giving members text chosen by someone else: the tokens to append, one crop, one forward.

Shared by every token-level method: the chosen token's bytes are appended to each member as
that member takes them (vocab/append.py), for all rows of the batch in one call.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ensemble_bench.members.base import Member
from ensemble_bench.vocab.append import TextAppender, single_byte_ids


def encode_continuation(member: Member, text: str, anchor: list[int] | None = None) -> list[int]:
    """Ids for text that continues a sequence: encoded behind an anchor, the anchor's ids removed
    (no BOS, no SentencePiece dummy-prefix space). ``anchor``: the member's ids of the anchor, if known."""
    if anchor is None:
        anchor = member.encode("\n", add_special_tokens=False)
    ids = member.encode("\n" + text, add_special_tokens=False)
    if ids[:len(anchor)] == anchor:
        return ids[len(anchor):]
    return member.encode(text, add_special_tokens=False)


def text_lookup(member: Member) -> dict[bytes, int]:
    """Text bytes -> the member's lowest ordinary (non-special) id with exactly those bytes."""
    found: dict[bytes, int] = {}
    for token_id in member.vocab.text_ids():
        found.setdefault(member.vocab.pieces[token_id], token_id)
    return found


def text_appender(member: Member, window: int, by_bytes: dict[bytes, int] | None = None) -> TextAppender:
    anchor = member.encode("\n", add_special_tokens=False)
    return TextAppender(member.vocab.pieces, text_lookup(member) if by_bytes is None else by_bytes,
                        single_byte_ids(member.vocab.pieces, member.vocab.special_ids),
                        lambda text: encode_continuation(member, text, anchor), window)


def give_text(member: Member, appender: TextAppender, chunks: Sequence[Sequence[bytes]],
              direct: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
    """Append each row's pieces (in order) as this member takes them, or the ids in ``direct``
    for rows without pieces; one crop and one batched forward for all rows."""
    simple = all(len(c) <= 1 and (not c or c[0] in appender.by_bytes) for c in chunks)
    tails = None if simple else member.row_ids()
    drops, tokens = [], []
    for k, row_chunks in enumerate(chunks):
        if not row_chunks:
            drops.append(0)
            tokens.append(list(direct[k]) if direct else [])
        elif tails is None:
            drops.append(0)
            tokens.append([appender.by_bytes[row_chunks[0]]])
        else:
            drop, ids = appender.plan_all(tails[k], row_chunks)
            drops.append(drop)
            tokens.append(ids)
    if any(drops):
        member.crop([len(t) - d for t, d in zip(tails, drops)])
    return member.extend(tokens)
