"""The tokenizer half of a member over a transformers tokenizer (members/base.Tokenizing).

Shared by LocalMember and RemoteMember (which runs it in the driver on a copy of the actor's
tokenizer). Needs ``tokenizer``, ``vocab``, ``uses_chat_template`` and ``_bos_text``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ensemble_bench.members.base import Prompt, Tokenizing, flatten_messages
from ensemble_bench.vocab.words import word_starts


class TokenizerSide(Tokenizing):
    tokenizer: object  # a transformers tokenizer
    _bos_text: str | None  # the BOS token's text: a text starting with it is encoded without another

    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        kwargs = {}
        if add_special_tokens is not None:
            kwargs["add_special_tokens"] = add_special_tokens
        elif self._bos_text and text.startswith(self._bos_text):
            kwargs["add_special_tokens"] = False  # the text already carries its BOS
        return self.tokenizer.encode(text, **kwargs)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_text(self, prompt: Prompt) -> str:
        if not prompt.is_chat:
            return prompt.text
        messages = [{"role": role, "content": content} for role, content in prompt.messages]
        if self.uses_chat_template:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return flatten_messages(prompt.messages)

    def word_starts(self, text: str) -> list[int]:
        pre = self.tokenizer.backend_tokenizer.pre_tokenizer
        return word_starts(text, self.vocab.spelling, pre.pre_tokenize_str if pre is not None else None)
