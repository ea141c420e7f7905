"""The Member interface: one causal LM and its tokenizer, driven step by step by a method.

Two halves: ``Tokenizing`` (text <-> ids, chat templates, word starts; needs no model) and
``Stepping`` (the model: batched KV-cached steps and scoring). ``Member`` is both. Methods import
this module only; implementations live in members/local.py and members/remote.py.

Plain data in and out (token id lists, float32 tensors, frozen dataclasses) so that a remote
implementation (a Ray actor) can stand behind the same interface. Next-token log-probs stay on
the member's device (a CUDA member's distributions never cross to the host as a whole; methods
reduce them there and move only ids and a few values); a returned tensor is never changed by a
later call.

Batched decoding state lives inside the member: ``prefill`` starts a batch of rows, ``extend``
appends tokens to rows and returns each row's next-token log-probabilities, ``read_block`` appends
a block and returns the distributions at chosen positions inside it, ``crop`` rolls rows back,
``keep`` drops finished rows. KV caches are kept across calls, never recomputed.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ensemble_bench.errors import UserError
from ensemble_bench.vocab import VocabView


@dataclass(frozen=True)
class Prompt:
    """What a request asks: plain text, or chat messages that each member renders itself."""

    text: str = ""
    messages: tuple[tuple[str, str], ...] = ()  # (role, content) pairs

    @property
    def is_chat(self) -> bool:
        return bool(self.messages)


@dataclass(frozen=True)
class Score:
    """Log-likelihood of a continuation: summed log-prob and whether greedy decoding yields it."""

    logprob: float
    is_greedy: bool


@dataclass
class ForwardClock:
    """Wall time spent in forward passes, split into prefill and decode."""

    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    prefill_calls: int = 0
    decode_calls: int = 0

    def tick(self, phase: str, seconds: float, calls: int = 1) -> None:
        """Account ``seconds`` (and ``calls`` forward passes) to ``phase``: "prefill" or "decode"."""
        if phase == "prefill":
            self.prefill_seconds += seconds
            self.prefill_calls += calls
        else:
            self.decode_seconds += seconds
            self.decode_calls += calls

    @contextmanager
    def timed(self, phase: str, calls: int = 1) -> Iterator[None]:
        """Time the block and ``tick`` it (a block that raises is not counted)."""
        start = time.perf_counter()
        yield
        self.tick(phase, time.perf_counter() - start, calls)


def flatten_messages(messages: Sequence[tuple[str, str]]) -> str:
    """A chat as plain text for members without a chat template: contents joined, no roles."""
    return "".join(content for _, content in messages)


class Tokenizing(ABC):
    """The tokenizer half of a member: text <-> ids, chat rendering, word starts. No model."""

    name: str
    vocab: VocabView
    stop_ids: frozenset[int]
    max_length: int
    prefix_token_id: int  # conditions a continuation whose context is empty (BOS, else EOS)
    uses_chat_template: bool  # render applies the tokenizer's chat template to chat prompts
    contexts_truncated: int = 0  # requests cut from the left to fit ``max_length`` (fit_pairs, fit_prompt)

    @abstractmethod
    def render_text(self, prompt: Prompt) -> str:
        """The prompt as text, after this member's chat template (if any)."""

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """Tokenise text (None: the tokenizer's default, unless the text starts with BOS)."""

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The tokenizer's own decode."""

    @abstractmethod
    def word_starts(self, text: str) -> list[int]:
        """Offsets > 0 where a word begins in this tokenizer's pre-tokenisation (vocab/words.py)."""

    def render(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt: chat template if enabled and available, else plain text."""
        return self.encode(self.render_text(prompt))

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Split ``context + continuation`` into ids the way lm-eval's HFLM does.

        Trailing spaces of the context move to the continuation; the whole string is encoded
        and the context's own encoding length decides the split. An empty context becomes the
        prefix token (BOS, else EOS).
        """
        if not context:
            cont = self.encode(continuation, add_special_tokens=False)
            if cont and cont[0] == self.prefix_token_id:
                return cont[:1], cont[1:]
            return [self.prefix_token_id], cont
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.encode(context + continuation)
        context_ids = self.encode(context)
        return context_ids, whole[len(context_ids):]

    def rolling_pairs(self, text: str) -> list[tuple[list[int], list[int]]]:
        """Disjoint windows covering every token of ``text`` (perplexity tasks).

        Each window predicts up to ``max_length`` tokens given the tokens before it that fit in
        the window beside it (the first window given the prefix token), as lm-eval's HFLM does;
        the pairs fit the window already, so they count as no truncation.
        """
        ids = self.encode(text)
        pairs = []
        for start in range(0, len(ids), self.max_length):
            window = ids[start:start + self.max_length]
            context = [self.prefix_token_id] + ids[:start]
            pairs.append((last(context, self.max_length + 1 - len(window)), window))
        return pairs

    def fit_pairs(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[tuple[list[int], list[int]]]:
        """Each (context, continuation) cut from the left to the window (``fit_pair``); every pair
        cut adds one to ``contexts_truncated``."""
        fitted = []
        for context, continuation in pairs:
            context, continuation, cut = self.fit_pair(context, continuation)
            self.contexts_truncated += cut
            fitted.append((context, continuation))
        return fitted

    def fit_pair(self, context: Sequence[int], continuation: Sequence[int]) -> tuple[list[int], list[int], bool]:
        """One pair fitted to the window (``fit_window``), and whether it was cut."""
        return fit_window(context, continuation, self.max_length)

    def fit_prompt(self, ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """The last ``max_length - max_new_tokens`` prompt tokens, as lm-eval's HFLM keeps for
        generation (so the prompt and every new token fit the window); a cut prompt adds one to
        ``contexts_truncated``. A budget that leaves no room for the prompt is refused, as HFLM does."""
        room = self.max_length - max_new_tokens
        if room <= 0:
            raise no_room(self, max_new_tokens)
        self.contexts_truncated += len(ids) > room
        return last(ids, room)


def no_room(member: Tokenizing, new_tokens: int) -> UserError:
    """A request whose new tokens alone fill the member's window (lm-eval's HFLM refuses it too)."""
    return UserError(f"member '{member.name}' has a window of {member.max_length} tokens: a request needing "
                     f"{new_tokens} new tokens (max_gen_toks, or a continuation scored token by token) leaves "
                     "no room for its prompt; lower max_gen_toks or use a member with a longer context")


def last(ids: Sequence[int], count: int) -> list[int]:
    """The last ``count`` ids (none when ``count`` <= 0, unlike ``ids[-0:]``)."""
    return list(ids[len(ids) - count:]) if count > 0 else []


def fit_window(context: Sequence[int], continuation: Sequence[int],
               max_length: int) -> tuple[list[int], list[int], bool]:
    """(context, continuation, whether it was cut) fitting a window of ``max_length`` inputs, as
    lm-eval's HFLM fits a causal LM's input: ``context + continuation`` keep their last
    ``max_length + 1`` tokens (the last one is only predicted), so the context loses tokens from
    its left and the continuation is scored whole. A continuation longer than ``max_length``
    keeps its last ``max_length`` tokens, after the one token before them (HFLM itself fails there).
    """
    if len(context) + len(continuation) <= max_length + 1:
        return list(context), list(continuation), False
    window = last(list(context) + list(continuation), max_length + 1)
    kept = min(len(continuation), max_length)
    return window[:len(window) - kept], window[len(window) - kept:], True


# The optional capabilities of a member's stepping half, each a call beyond what the decode loop needs. A
# member declares the ones it answers (``Stepping.capabilities``; token trees: ``reads_trees``), as a
# speculating method declares its calls (decoding/speculative.py, ``Speculable``); a method that needs one
# checks the declaration before it calls (``require``).
BLOCK_READS = "read_block"        # a block of tokens in one forward pass (speculation, SAFE, PackLLM's weights)
SCORING = "score"                 # a continuation's log-likelihood by itself (members alone, sample-level methods)
EMBEDDINGS = "input_embeddings"   # the embedding matrices (DeePEn's anchors, EVA's map)
CAPABILITIES = {BLOCK_READS: "read a block of tokens in one forward pass", SCORING: "score continuations",
                EMBEDDINGS: "give their embedding matrices"}
ALL_CAPABILITIES = frozenset(CAPABILITIES)  # what every member kind of this package answers


def require(members: Sequence[Member], capability: str, needing: str) -> None:
    """A one-line UserError when a member does not declare ``capability`` (``needing``: what needs it)."""
    lacking = next((m for m in members if capability not in m.capabilities), None)
    if lacking is not None:
        raise UserError(f"{needing} needs members that {CAPABILITIES[capability]}: member '{lacking.name}' "
                        f"({type(lacking).__name__}) does not")


class Stepping(ABC):
    """The model half of a member: batched, KV-cached stepping over token ids, what the decode loop calls
    (``prefill``, ``extend``, ``extend_scored``, ``crop``, ``keep``, ``row_ids``); and the optional
    capabilities it declares (``capabilities``, ``reads_trees``).

    Row indices refer to the current batch (after the last ``keep``).
    """

    device: torch.device  # where the log-probs it returns live (the driver's CPU for a remote member)
    remote: bool = False  # its forward passes run in another process (decoding/concurrent.py overlaps them)
    clock: ForwardClock
    capabilities: frozenset[str] = frozenset()  # which of BLOCK_READS, SCORING, EMBEDDINGS it answers

    @abstractmethod
    def prefill(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """Start a batch (left padded); return next-token log-probs, float32 [rows, head], on the member's device."""

    @abstractmethod
    def extend(self, tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        """Append ``tokens[r]`` to row r (may be empty); return next-token log-probs of all rows."""

    @abstractmethod
    def extend_scored(self, tokens: Sequence[Sequence[int]]) -> tuple[torch.Tensor, list[list[float]]]:
        """``extend``, also returning per row the log-prob of each appended token after the first
        (the first one's comes from the distribution the previous call returned)."""

    def read_block(self, tokens: Sequence[Sequence[int]], at: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Append ``tokens[r]`` to row r (may be empty) in ONE forward pass for the whole batch and
        return, per row, the next-token log-probs after the appended tokens named in ``at[r]``
        (0-based indices into ``tokens[r]``, ascending): a float32 tensor [len(at[r]), head] on the
        member's device. Afterwards the row holds all of ``tokens[r]`` and ``extend([[]...])`` gives
        the distribution after its last one, exactly as a series of one-token ``extend`` calls would
        leave it (within float tolerance). With ``crop`` it is how a method reads a draft and keeps
        a prefix of it (decoding/speculative.py, SAFE's verifier)."""
        raise NotImplementedError(f"{type(self).__name__} does not read blocks (capabilities)")

    reads_trees: bool = False  # implements ``read_tree``

    def read_tree(self, tokens: Sequence[Sequence[int]], parents: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Read a tree of tokens after each row in ONE forward pass, leaving the rows as they were:
        node n of row r is ``tokens[r][n]``, following node ``parents[r][n]`` (an earlier index of
        the row) or, for -1, the row's last held token. Returns per row the next-token log-probs
        after each node, float32 [len(tokens[r]), head] on the member's device: what ``extend``
        would give after the row's tokens and the node's path from the root (within float
        tolerance). Only members with ``reads_trees`` implement it (byte_level's multiple-choice
        scoring reads every re-tokenisation of a continuation with it)."""
        raise NotImplementedError(f"{type(self).__name__} does not read token trees")

    @abstractmethod
    def crop(self, lengths: Sequence[int]) -> None:
        """Roll each row back to ``lengths[r]`` tokens; the next ``extend`` must give it tokens."""

    @abstractmethod
    def keep(self, rows: Sequence[int]) -> None:
        """Keep only these rows, in this order (finished rows leave the batch)."""

    @abstractmethod
    def row_ids(self) -> list[list[int]]:
        """The token ids currently held by each row."""

    def input_embeddings(self) -> torch.Tensor:
        """The input embedding matrix [head rows, d] (DeePEn's relative representations)."""
        raise NotImplementedError(f"{type(self).__name__} does not give its embeddings (capabilities)")

    def output_embeddings(self) -> torch.Tensor:
        """The output head's matrix [head rows, d] (EVA's vocabulary alignment); a member that
        cannot reach its head gives its input embeddings."""
        return self.input_embeddings()

    def score(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int = 8) -> list[Score]:
        """Score each continuation given its context (token ids), ``batch_size`` pairs per forward
        pass, no shared state."""
        raise NotImplementedError(f"{type(self).__name__} does not score continuations (capabilities)")


class Member(Tokenizing, Stepping):
    """One model: its tokenizer half and its stepping half."""
