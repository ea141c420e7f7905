"""SAFE's pieces (methods/safe.py): a draft of the drafter, a verifier's reading of committed text + draft,
moving members' rows with one crop and one extend, and the sharpened choice of the ensemble (Sec. 3.3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ensemble_bench.members.base import Member
from ensemble_bench.vocab.append import common_prefix

SPACE = b" "  # never a sharpening candidate (authors' code: the bare space prefixes every word)


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    seen: list[torch.Tensor] = field(default_factory=list)  # the drafter's log-probs before each token (and the stop)
    stop: bool = False                                      # the drafter chose a stop id after ``tokens``
    offsets: list[int] = field(default_factory=lambda: [0])  # byte offset of each token's start, then the end


@dataclass(frozen=True)
class Reading:
    """One verifier's ids of committed text + draft: ``prefix`` (generated ids kept), then ``ids``
    whose ends fall at ``ends`` (byte offsets from the draft's start; the prefix ends at ``start``)."""

    prefix: tuple[int, ...]
    ids: tuple[int, ...]
    ends: tuple[int, ...]
    start: int
    pending: bytes = b""

    def count_to(self, offset: int) -> int | None:
        """How many of ``ids`` end exactly at ``offset`` (None: ``offset`` is inside a token)."""
        if offset == self.start:
            return 0
        return self.ends.index(offset) + 1 if offset in self.ends else None

    def starts_token(self, offset: int) -> bool:
        count = self.count_to(offset)
        return count is not None and count < len(self.ids)


def crop_rows(member: Member, held: Sequence[Sequence[int]], keep: Sequence[int]) -> None:
    """Crop row r of ``member`` (holding ``held[r]``) to ``keep[r]`` tokens; no call when no row shrinks."""
    if any(k < len(row) for k, row in zip(keep, held)):
        member.crop(keep)


def move_rows(member: Member, targets: Sequence[Sequence[int]]) -> torch.Tensor:
    """Bring each row of ``member`` to hold exactly ``targets[r]`` (whole rows, prompt included)
    with one crop and one extend; returns the next-token log-probs of every row. A row that must
    shrink to a prefix of what it holds re-reads its last token (a crop needs tokens after it)."""
    held = member.row_ids()
    keep = []
    for row, target in zip(held, targets):
        same = common_prefix(row, target)
        keep.append(same - 1 if same == len(target) < len(row) else same)
    crop_rows(member, held, keep)
    return member.extend([list(target[k:]) for k, target in zip(keep, targets)])


def sharpened_choice(mixed: torch.Tensor, entries: Sequence[bytes], stops: frozenset[int], sharpen: float,
                     candidates: Sequence[int] = (), pool: Sequence[int] = (), floor: float = 0.1) -> int:
    """The ensemble's union entry (Sec. 3.3): argmax of the average ``mixed`` (lowest index on
    ties) or, when its top probability is below ``sharpen``, argmax after each of ``candidates``
    (the drafter's top entries) whose average exceeds ``floor`` (lambda) gains the average of the
    other ``pool`` entries that extend it (start with its bytes). Stop entries, empty entries and
    the bare space neither gain nor give."""
    if float(mixed.max()) >= sharpen:
        return int(mixed.argmax())
    scores = mixed.clone()
    for c in dict.fromkeys(candidates):
        base = entries[c]
        if c in stops or not base or base == SPACE or float(mixed[c]) <= floor:
            continue
        gain = sum(float(mixed[o]) for o in dict.fromkeys(pool)
                   if o != c and o not in stops and entries[o].startswith(base))
        scores[c] = float(mixed[c]) + gain
    return int(scores.argmax())
