"""When a row stops: a stop id, one of the request's ``until`` strings, or the token budget."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopRule:
    until: tuple[str, ...]
    max_new_tokens: int
    stop_ids: frozenset[int]

    def finish(self, token: int, text: str, count: int) -> str | None:
        """Why generation ends after ``token`` (``count`` tokens so far, ``text`` decoded), or None."""
        if token in self.stop_ids:
            return "stop_id"
        if any(u and u in text for u in self.until):
            return "until"
        if count >= self.max_new_tokens:
            return "length"
        return None


def cut_at_until(text: str, until: Sequence[str]) -> str:
    """The text before the first occurrence of any stop string (lm-eval's convention)."""
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text
