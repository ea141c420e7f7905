"""When a request stops: a stop id (the method says so), one of its ``until`` strings, or its token budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopRule:
    """A request's own stop strings and token budget (stop ids are the method's to see: it
    knows which of its choices are stops)."""

    until: tuple[str, ...]
    max_new_tokens: int

    def finish(self, text: Callable[[], str], count: int) -> str | None:
        """Why generation ends with ``count`` tokens so far and the text ``text()``, or None."""
        if any(self.until) and any(u and u in text() for u in self.until):
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
