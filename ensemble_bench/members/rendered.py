"""What each member made of a chat prompt, for the record a run keeps.

Members render a chat with their own templates, so the context string lm-eval logs for a chat
request (its samples file's ``arguments``) cannot be one member's text. It holds the messages and,
per member, the SHA-256 of the text that member renders from them (``RenderedPrompts.record``);
the first chat prompt's rendered text per member is kept too (``RenderedPrompts.first``), for the
run's model info. The hash is of ``render_text``, the very text a member encodes for the request.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ensemble_bench.members.base import Prompt, Tokenizing


def chat_prompt(messages: Sequence[Mapping[str, str]]) -> Prompt:
    """lm-eval's chat history (``{"role", "content"}`` dicts) as a Prompt."""
    return Prompt(messages=tuple((m["role"], m["content"]) for m in messages))


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class RenderedPrompts:
    """Per member: the SHA-256 of each chat prompt it renders, and the first prompt's text and SHA-256."""

    first: dict[str, dict[str, str]] = field(default_factory=dict)

    def record(self, members: Sequence[Tokenizing], messages: Sequence[Mapping[str, str]]) -> dict:
        """The chat request as it is logged: its messages and each member's SHA-256 of its rendering."""
        texts = {m.name: m.render_text(chat_prompt(messages)) for m in members}
        digests = {name: text_sha256(text) for name, text in texts.items()}
        if not self.first:
            self.first = {name: {"sha256": digests[name], "first_text": text} for name, text in texts.items()}
        return {"messages": list(messages), "rendered_sha256": digests}

    def info(self) -> dict:
        """``{"rendered_prompts": first}`` once a chat prompt was rendered, else nothing."""
        return {"rendered_prompts": self.first} if self.first else {}
