"""Giving members text chosen by someone else: the tokens to append, one crop, one forward.

Shared by every token-level and span-level method. Two policies (method parameter
``retokenize``, docs/retokenize.md):
- ``local`` (GaC Eq. 4): the chosen bytes are appended as the member takes them
  (vocab/append.py): one of its own tokens when it has one, a short re-encoded window otherwise;
- ``canonical`` (the UniTE and DeePEn reference code): the member re-encodes the generated text
  back to its last hard boundary (vocab/retokenize.py) so that it always holds its tokenizer's own
  encoding of the text so far; a half UTF-8 character waits (pending) until it is complete.
Either way, all rows of the batch in one crop and one forward. A ``Feeder`` (one per member) is
the seam: methods call ``feeder.give(states, chunks, direct)`` and never ask which policy runs.
"""

from __future__ import annotations

import copy
import weakref
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ensemble_bench.decoding.params import Retokenize as Retokenize
from ensemble_bench.members.base import Member
from ensemble_bench.vocab.append import TextAppender, single_byte_ids
from ensemble_bench.vocab.retokenize import CanonicalTail, Encode, continuation_encoder


def member_continuation(member: Member) -> Encode:
    """Text -> the member's ids for it as a continuation of a sequence (no BOS, no SentencePiece
    dummy-prefix space): vocab/retokenize.py's ``continuation_encoder`` over the member's tokenizer."""
    return continuation_encoder(lambda text: member.encode(text, add_special_tokens=False))


def text_lookup(member: Member) -> dict[bytes, int]:
    """Text bytes -> the member's lowest ordinary (non-special) id with exactly those bytes."""
    found: dict[bytes, int] = {}
    for token_id in member.vocab.text_ids():
        found.setdefault(member.vocab.pieces[token_id], token_id)
    return found


def text_appender(member: Member, window: int, by_bytes: dict[bytes, int] | None = None) -> TextAppender:
    return TextAppender(member.vocab.pieces, text_lookup(member) if by_bytes is None else by_bytes,
                        single_byte_ids(member.vocab.pieces, member.vocab.special_ids),
                        member_continuation(member), window)


def canonical_tail(member: Member) -> CanonicalTail:
    """The member's canonical re-tokeniser (scans the vocabulary once: build it once per member)."""
    return CanonicalTail.from_view(member.vocab, member_continuation(member))


def local_plans(member: Member, appender: TextAppender, chunks: Sequence[Sequence[bytes]],
                direct: Sequence[Sequence[int]] | None = None) -> tuple[list[int] | None, list[int], list[list[int]]]:
    """Local policy for every row: (held lengths or None when no row is re-encoded, tokens to drop, ids to append)."""
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
    return (None if tails is None else [len(t) for t in tails]), drops, tokens


def give_text(member: Member, appender: TextAppender, chunks: Sequence[Sequence[bytes]],
              direct: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
    """Append each row's pieces (in order) as this member takes them, or the ids in ``direct``
    for rows without pieces; one crop and one batched forward for all rows (the local policy)."""
    lengths, drops, tokens = local_plans(member, appender, chunks, direct)
    if any(drops):
        member.crop([n - d for n, d in zip(lengths, drops)])
    return member.extend(tokens)


@dataclass
class FeedStats:
    """What taking other members' text cost, over generation (``info()``'s retokenize_* fields)."""

    row_steps: int = 0  # rows given chosen text (one row, one step)
    crops: int = 0      # rows cropped (tokens taken back from the KV cache)
    dropped: int = 0    # tokens taken back
    fed: int = 0        # tokens fed for chosen text (forward positions)
    waits: int = 0      # rows given nothing: half a UTF-8 character waits (canonical)

    def add(self, dropped: int, fed: int, waited: bool = False) -> None:
        self.row_steps += 1
        self.crops += dropped > 0
        self.dropped += dropped
        self.fed += fed
        self.waits += waited

    def summary(self, policy: str) -> dict:
        def per(count: int) -> float | None:
            return count / self.row_steps if self.row_steps else None

        return {"retokenize": policy, "retokenize_row_steps": self.row_steps, "retokenize_crops": self.crops,
                "retokenize_tokens_dropped": self.dropped, "retokenize_tokens_fed": self.fed,
                "retokenize_waits": self.waits, "retokenize_crops_per_step": per(self.crops),
                "retokenize_dropped_per_step": per(self.dropped), "retokenize_fed_per_step": per(self.fed)}


@dataclass
class Held:
    """How one member holds one row's generated text: its ids from ``prompt_len`` on, and the
    bytes not yet given to it (half a character, canonical policy)."""

    prompt_len: int
    pending: bytes = b""


class Feeder(ABC):
    """How one member takes chosen text, for all live rows at once (see the module docstring).

    ``states``: the live rows' request states (``RequestState.held`` keeps this member's ``Held``
    per row, so finished rows leave with their states); ``chunks[k]``: the pieces row k takes, in
    order; ``direct[k]``: the member's own ids for a row without pieces (it chose them itself).
    """

    policy: str

    def __init__(self, member: Member, index: int, stats: FeedStats):
        self.member, self.index, self.stats = member, index, stats

    @abstractmethod
    def give(self, states: Sequence, chunks: Sequence[Sequence[bytes]],
             direct: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
        """Give every row its pieces (or its direct ids); the member's next log-probs of all rows."""

    def speaking_to(self, member: Member, stats: FeedStats) -> Feeder:
        """This feeder giving text to ``member`` instead (a stand-in while decoding speculatively) and
        counting in ``stats``; the feeder itself is unchanged."""
        view = copy.copy(self)
        view.member, view.stats = member, stats
        return view

    def held(self, state, length: int) -> Held:
        """This member's record of a row; created when the row is first fed (the member then holds the prompt)."""
        return state.held.setdefault(self.index, Held(length))


class LocalFeeder(Feeder):
    policy = "local"

    def __init__(self, member: Member, index: int, stats: FeedStats, window: int,
                 by_bytes: dict[bytes, int] | None = None):
        super().__init__(member, index, stats)
        self.appender = text_appender(member, window, by_bytes)

    def give(self, states, chunks, direct=None) -> torch.Tensor:
        if any(self.index not in state.held for state in states):  # the batch's first feed: note the prompts
            for state, row in zip(states, self.member.row_ids()):
                self.held(state, len(row))
        lengths, drops, tokens = local_plans(self.member, self.appender, chunks, direct)
        for row_chunks, drop, ids in zip(chunks, drops, tokens):
            if row_chunks:
                self.stats.add(drop, len(ids))
        if any(drops):
            self.member.crop([n - d for n, d in zip(lengths, drops)])
        return self.member.extend(tokens)


class CanonicalFeeder(Feeder):
    policy = "canonical"

    def __init__(self, member: Member, index: int, stats: FeedStats, tail: CanonicalTail | None = None):
        super().__init__(member, index, stats)
        self.tail = tail or canonical_tail(member)

    def give(self, states, chunks, direct=None) -> torch.Tensor:
        rows = self.member.row_ids()
        plans = [self._row(state, row, chunks[k], direct[k] if direct else ())
                 for k, (state, row) in enumerate(zip(states, rows))]
        if any(n < len(row) for (n, _), row in zip(plans, rows)):
            self.member.crop([n for n, _ in plans])  # one crop for the batch
        return self.member.extend([ids for _, ids in plans])

    def _row(self, state, row: list[int], pieces: Sequence[bytes], own: Sequence[int]) -> tuple[int, list[int]]:
        """One row: (the length it keeps, the ids it appends)."""
        held = self.held(state, len(row))
        if pieces:
            data = b"".join(pieces)
        elif own and held.pending:  # its own ids after pending bytes: taken as text
            data = self.member.vocab.join(own)
        else:
            return len(row), list(own)
        plan = self.tail.plan(row[held.prompt_len:], held.pending, data)
        held.pending = plan.pending
        self.stats.add(len(row) - held.prompt_len - plan.keep, len(plan.ids), waited=not plan.ids)
        return held.prompt_len + plan.keep, list(plan.ids)


def make_feeders(members: Sequence[Member], policy: str, stats: FeedStats, window: int = 4,
                 by_bytes: Sequence[dict[bytes, int] | None] | None = None,
                 skip: frozenset[int] = frozenset()) -> list[Feeder | None]:
    """One feeder per member under ``policy`` (None for members in ``skip``, which never take others' text)."""
    feeders: list[Feeder | None] = []
    for index, member in enumerate(members):
        if index in skip:
            feeders.append(None)
        elif policy == "canonical":
            feeders.append(CanonicalFeeder(member, index, stats, cached_tail(member)))
        else:
            feeders.append(LocalFeeder(member, index, stats, window, by_bytes[index] if by_bytes else None))
    return feeders


_TAILS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cached_tail(member: Member) -> CanonicalTail:
    """``canonical_tail`` built once per member object (building scans the vocabulary)."""
    if member not in _TAILS:
        _TAILS[member] = canonical_tail(member)
    return _TAILS[member]
