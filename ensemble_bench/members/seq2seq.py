"""Seq2SeqMember: an encoder-decoder model (NLLB / M2M100, mBART-50, Marian, T5) behind the Member
interface.

The encoder runs once per row, at ``prefill``; ``extend`` / ``crop`` / ``keep`` act on the decoder
and its KV cache (self-attention cache edited row-wise like LocalMember's, cross-attention cache and
encoder states kept per row). Rows of ids are plain lists, so a row carries its encoder input:

    row = encoder ids + [SOURCE_END] + decoder ids

``render`` and ``encode_pair`` build such rows; ``row_ids`` / ``crop`` lengths count the DECODER ids
only (the forced start and target-language tokens included), so the methods' crop-to-prefix logic
never reaches into the source. A row without SOURCE_END is all encoder input (the decoder starts
from the model's decoder start token).

Which text goes to the encoder (docs/translation.md): a translation prompt ends with the two lines

    <Source language>: <sentence>
    <Target language>:

(the Flores tasks' format); then the encoder gets the sentence alone (no few-shot scaffolding) with
the family's source-language marker, and the decoder starts from the family's forced target-language
token (NLLB ``deu_Latn``, M2M100 ``__de__``, mBART-50 ``de_DE``, Marian ``>>de<<`` where the
vocabulary has it; T5 gets the task prefix "translate English to German: " instead). Any other
prompt goes to the encoder whole.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache, EncoderDecoderCache

from ensemble_bench.members import kv
from ensemble_bench.members.base import ForwardClock, Member, Prompt, Score, fit_window, flatten_messages, last, no_room
from ensemble_bench.members.batching import positions_of, right_padded
from ensemble_bench.members.kv import CachedRows
from ensemble_bench.members.local import LocalMember, log_probs_of, max_length_of, stop_ids_of
from ensemble_bench.members.tokenizer_side import TokenizerSide
from ensemble_bench.vocab import build_vocab_view

SOURCE_END = -1  # separates a row's encoder ids from its decoder ids (never a real token id)

# Language name (as the translation prompts spell it) -> ISO 639-1 and NLLB / mBART-50 codes.
LANGUAGES: dict[str, tuple[str, str, str]] = {
    "English": ("en", "eng_Latn", "en_XX"),
    "German": ("de", "deu_Latn", "de_DE"),
    "Romanian": ("ro", "ron_Latn", "ro_RO"),
    "French": ("fr", "fra_Latn", "fr_XX"),
    "Spanish": ("es", "spa_Latn", "es_XX"),
    "Czech": ("cs", "ces_Latn", "cs_CZ"),
    "Russian": ("ru", "rus_Cyrl", "ru_RU"),
    "Chinese": ("zh", "zho_Hans", "zh_CN"),
    "Japanese": ("ja", "jpn_Jpan", "ja_XX"),
}

_PAIR = re.compile(r"(?:^|\n)([A-Z][a-z]+): ([^\n]+)\n([A-Z][a-z]+):[ \t]*$")


@dataclass(frozen=True)
class Translation:
    """A translation request found in a prompt: the sentence and both language names."""

    source: str
    source_language: str
    target_language: str


def find_translation(text: str) -> Translation | None:
    """The sentence and languages of a prompt ending '<Src>: <sentence>\\n<Tgt>:' (known names only)."""
    match = _PAIR.search(text)
    if match is None or match.group(1) not in LANGUAGES or match.group(3) not in LANGUAGES:
        return None
    return Translation(match.group(2).strip(), match.group(1), match.group(3))


def source_text(prompt: Prompt) -> str:
    """The text a seq2seq member reads: a chat's last user turn (else all turns joined), or the text."""
    if not prompt.is_chat:
        return prompt.text
    users = [content for role, content in prompt.messages if role == "user"]
    whole = flatten_messages(prompt.messages)
    return users[-1] if users and find_translation(users[-1]) else whole


def language_token(tokenizer, family: str, language: str) -> int | None:
    """The id of the family's marker for ``language`` (None where the vocabulary has none)."""
    iso, nllb, mbart = LANGUAGES[language]
    candidates = {"m2m_100": (nllb, f"__{iso}__"), "nllb-moe": (nllb,), "mbart": (mbart,),
                  "marian": (f">>{iso}<<",)}.get(family, ())
    unk = tokenizer.unk_token_id
    for token in candidates:
        found = tokenizer.convert_tokens_to_ids(token)
        if isinstance(found, int) and found != unk:
            return found
    return None


class _PinnedPositions(nn.Module):
    """Wraps a decoder's absolute position embedding so that each row's tokens get their logical
    positions (rows are left padded: the model's own count would include the padding)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.positions: torch.Tensor | None = None  # [rows, new tokens], 0-based, set per forward

    def forward(self, *args, **kwargs):
        if self.positions is None:
            return self.inner(*args, **kwargs)
        return self._lookup(self.positions)

    def _lookup(self, positions: torch.Tensor) -> torch.Tensor:
        inner = self.inner
        if hasattr(inner, "make_weights") and hasattr(inner, "weights"):  # M2M100 / NLLB sinusoids
            index = positions + inner.padding_idx + 1
            if int(index.max()) >= inner.weights.size(0):
                inner.make_weights(int(index.max()) + 1 + inner.offset, inner.embedding_dim, inner.padding_idx)
            table = inner.weights.to(positions.device)
            return table.index_select(0, index.reshape(-1)).view(*index.shape, -1).detach()
        if type(inner).__name__.endswith("SinusoidalPositionalEmbedding"):  # Marian
            return inner(positions.shape, 0, position_ids=positions)
        return inner(positions, 0, position_ids=positions)  # BART / mBART learned positions


def pin_decoder_positions(model) -> _PinnedPositions | None:
    """Install (once) the position wrapper on the decoder; None for relative-position models (T5)."""
    decoder = model.get_decoder()
    current = getattr(decoder, "embed_positions", None)
    if current is None:
        return None
    if not isinstance(current, _PinnedPositions):
        current = _PinnedPositions(current)
        decoder.embed_positions = current
    return current


class Seq2SeqMember(TokenizerSide, Member):
    """An encoder-decoder model in this process, stepped on the decoder side."""

    capabilities = LocalMember.capabilities  # block reads, scoring, embeddings, as a decoder-only model here

    uses_chat_template = False  # the encoder reads the source, not a chat
    remote = False

    def __init__(self, model, tokenizer, name: str):
        if not getattr(model.config, "is_encoder_decoder", False):
            raise ValueError(f"member '{name}': {type(model).__name__} is not an encoder-decoder model")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.family = model.config.model_type
        self.device = next(model.parameters()).device
        self.vocab = build_vocab_view(tokenizer, model.get_output_embeddings().weight.shape[0])
        self.stop_ids = stop_ids_of(tokenizer, model.generation_config, self.vocab)
        self.max_length = max_length_of(model.config, tokenizer)
        self.cache_argument = kv.cache_argument(model)  # `cache`, not the deprecated `past_key_values`
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        start = model.config.decoder_start_token_id
        if start is None:
            start = getattr(model.generation_config, "decoder_start_token_id", None)
        self.start_id = int(start if start is not None else self.pad_id)
        self.prefix_token_id = self.start_id
        self._bos_text = None
        self._positions = pin_decoder_positions(model)
        self.clock = ForwardClock()
        self.batch = CachedRows(self.vocab.size, self.device)

    # --- prompts -> rows ---------------------------------------------------------------------------
    def render_text(self, prompt: Prompt) -> str:
        return source_text(prompt)

    def render(self, prompt: Prompt) -> list[int]:
        return self.source_row(self.render_text(prompt))

    def source_row(self, text: str) -> list[int]:
        """encoder ids + [SOURCE_END] + decoder prefix for a prompt's text (see the module docstring)."""
        found = find_translation(text)
        if found is None:
            return self.tokenizer.encode(text) + [SOURCE_END, self.start_id]
        body = found.source
        if self.family in ("t5", "mt5", "umt5"):
            body = f"translate {found.source_language} to {found.target_language}: {found.source}"
        encoder = self.tokenizer.encode(body, add_special_tokens=False)
        source_code = language_token(self.tokenizer, self.family, found.source_language)
        target_code = language_token(self.tokenizer, self.family, found.target_language)
        eos = self.tokenizer.eos_token_id
        if self.family == "marian":
            encoder = ([target_code] if target_code is not None else []) + encoder
            source_code = target_code = None
        head = [source_code] if source_code is not None else []
        tail = [eos] if eos is not None else []
        decoder = [self.start_id] + ([target_code] if target_code is not None else [])
        return head + encoder + tail + [SOURCE_END] + decoder

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """The context's row (encoder input + decoder prefix) and the continuation's decoder ids."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        return self.source_row(context), self.encode(continuation, add_special_tokens=False)

    def rolling_pairs(self, text: str) -> list[tuple[list[int], list[int]]]:
        """Windows of the text as decoder output over an empty source (perplexity tasks); each
        window follows the start token and the text before it that fits the decoder's window."""
        ids = self.encode(text, add_special_tokens=False)
        eos = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
        pairs = []
        for start in range(0, len(ids), self.max_length):
            window = ids[start:start + self.max_length]
            before = last(ids[:start], self.max_length - len(window))
            pairs.append((eos + [SOURCE_END, self.start_id] + before, window))
        return pairs

    def fit_pair(self, context: Sequence[int], continuation: Sequence[int]) -> tuple[list[int], list[int], bool]:
        """The encoder input keeps its last ``max_length`` tokens (lm-eval's HFLM gives a seq2seq
        encoder the whole window); the decoder prefix and continuation fit it as a causal LM's
        context and continuation do (``fit_window``)."""
        source, decoder = split_row(context, self.start_id)
        decoder, continuation, decoder_cut = fit_window(decoder, continuation, self.max_length)
        return last(source, self.max_length) + [SOURCE_END] + decoder, continuation, \
            decoder_cut or len(source) > self.max_length

    def fit_prompt(self, ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """The encoder input cut to its last ``max_length`` tokens; the decoder prefix and the new
        tokens must fit the window."""
        source, decoder = split_row(ids, self.start_id)
        if len(decoder) + max_new_tokens > self.max_length:
            raise no_room(self, max_new_tokens)
        self.contexts_truncated += len(source) > self.max_length
        return last(source, self.max_length) + [SOURCE_END] + decoder

    # --- batched, KV-cached stepping --------------------------------------------------------
    def prefill(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        split = [split_row(row, self.start_id) for row in rows]
        self._cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        self.batch.start(len(rows), self._cache.self_attention_cache)
        self._encoded, self._encoder_mask = self._encode([s for s, _ in split])
        self._append([d for _, d in split], phase="prefill")
        return self.batch.last

    def _encode(self, sources: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the encoder once over right-padded sources; (hidden states, mask)."""
        ids, mask = right_padded(sources, self.pad_id)
        with self.clock.timed("prefill", calls=0), torch.inference_mode():
            hidden = self.model.get_encoder()(input_ids=ids.to(self.device),
                                              attention_mask=mask.to(self.device)).last_hidden_state
        return hidden, mask.to(self.device)

    def extend(self, tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        self.batch.check(tokens)
        self._append(tokens, phase="decode")
        return self.batch.last

    def extend_scored(self, tokens: Sequence[Sequence[int]]) -> tuple[torch.Tensor, list[list[float]]]:
        self.batch.check(tokens)
        active, logprobs = self._append(tokens, phase="decode")
        scored: list[list[float]] = [[] for _ in tokens]
        for r in active:
            steps = logprobs[r, :len(tokens[r]) - 1]
            targets = torch.tensor([int(t) for t in tokens[r][1:]], dtype=torch.long, device=steps.device)
            scored[r] = steps.gather(1, targets[:, None]).squeeze(1).tolist()
        return self.batch.last, scored

    def read_block(self, tokens: Sequence[Sequence[int]], at: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        at = self.batch.check_block(tokens, at)
        _, logprobs = self._append(tokens, phase="decode")  # every row's block: a row without tokens asks for none
        return self.batch.blocks(logprobs, range(len(tokens)), at)

    def _append(self, tokens, phase: str) -> tuple[list[int], torch.Tensor | None]:
        """Feed each row's new decoder tokens (all rows in one forward); (the rows that got tokens,
        the log-probs of every row at every block position [rows, new, V], None when no row did).
        The new block is right padded, so a row's new tokens follow its old ones without a gap
        (relative-position models such as T5 see true distances); the padding moves to the left
        afterwards."""
        active = self.batch.take(tokens)
        if not active:
            return active, None
        rows = [[int(t) for t in row] for row in tokens]
        ids, new_mask = right_padded(rows, self.pad_id)
        logprobs = self._forward(ids, new_mask, phase)
        evenly = len({len(row) for row in rows}) == 1
        self.batch.set_last(active, self._next_logprobs(logprobs, rows, active, evenly))
        self.batch.realign(evenly)
        return active, logprobs

    def _next_logprobs(self, logprobs: torch.Tensor, rows: list[list[int]], active: list[int],
                       evenly: bool) -> torch.Tensor:
        """The active rows' next-token log-probs after their new tokens (``logprobs`` [rows, new, V]
        of right-padded blocks): a view of the last position when every row got as many tokens."""
        if evenly:
            return logprobs[:, -1].to(self.device)
        index = torch.tensor(active, dtype=torch.long, device=logprobs.device)
        ends = torch.tensor([len(rows[r]) - 1 for r in active], dtype=torch.long, device=logprobs.device)
        return logprobs[index, ends].to(self.device)

    def _forward(self, ids: torch.Tensor, new_mask: torch.Tensor, phase: str) -> torch.Tensor:
        """One decoder forward over ``ids`` after the cache; log-probs [rows, new, V] (float32)."""
        batch = self.batch
        batch.mask = torch.cat([batch.mask, new_mask.to(self.device)], dim=1)
        if self._positions is not None:
            self._positions.positions = positions_of(batch.mask)[:, -ids.shape[1]:]
        with self.clock.timed(phase):
            try:
                with torch.no_grad():  # not inference_mode: the log-probs it returns stay ordinary tensors
                    out = self.model(encoder_outputs=(self._encoded,), attention_mask=self._encoder_mask,
                                     decoder_input_ids=ids.to(self.device), decoder_attention_mask=batch.mask,
                                     use_cache=True, **{self.cache_argument: self._cache})
                    logprobs = log_probs_of(out.logits)
            finally:
                if self._positions is not None:
                    self._positions.positions = None
        return logprobs

    def crop(self, lengths: Sequence[int]) -> None:
        self.batch.crop(lengths)

    def keep(self, rows: Sequence[int]) -> None:
        index = self.batch.keep(rows)
        kv.select_rows(self._cache.cross_attention_cache, index)
        self._encoded = self._encoded.index_select(0, index)
        self._encoder_mask = self._encoder_mask.index_select(0, index)

    def row_ids(self) -> list[list[int]]:
        return self.batch.row_ids()

    def input_embeddings(self) -> torch.Tensor:
        weight = self.model.get_decoder().get_input_embeddings().weight.detach()
        return weight[:self.vocab.size]

    def output_embeddings(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight.detach()[:self.vocab.size]

    # --- scoring --------------------------------------------------------------------------------
    def score(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int = 8) -> list[Score]:
        """Sum of the continuation's log-probs given the row's source and decoder prefix, and whether
        greedy decoding yields it; batched without a cache (right padding)."""
        pairs = self.fit_pairs(pairs)
        results: list[Score] = []
        for start in range(0, len(pairs), batch_size):
            results.extend(self._score_chunk(pairs[start:start + batch_size]))
        return results

    def _score_chunk(self, pairs) -> list[Score]:
        split = [split_row(context, self.start_id) for context, _ in pairs]
        decoder_rows = [(prefix + list(cont))[:-1] for (_, prefix), (_, cont) in zip(split, pairs)]
        encoded, encoder_mask = self._encode([s for s, _ in split])
        ids, mask = right_padded(decoder_rows, self.pad_id)
        with torch.inference_mode():
            logits = self.model(encoder_outputs=(encoded,), attention_mask=encoder_mask,
                                decoder_input_ids=ids.to(self.device), decoder_attention_mask=mask.to(self.device),
                                use_cache=False).logits
            logprobs = log_probs_of(logits)
        scores = []
        for r, ((_, prefix), (_, cont)) in enumerate(zip(split, pairs)):
            rows = logprobs[r, len(prefix) - 1:len(prefix) - 1 + len(cont)]
            target = torch.tensor(list(cont), dtype=torch.long, device=logprobs.device)
            picked = rows.gather(1, target[:, None]).squeeze(1)
            scores.append(Score(float(picked.sum()), bool((rows.argmax(dim=-1) == target).all())))
        return scores


def split_row(row: Sequence[int], start_id: int) -> tuple[list[int], list[int]]:
    """(encoder ids, decoder ids) of a row; a row without SOURCE_END is all source."""
    row = [int(t) for t in row]
    if SOURCE_END not in row:
        return row, [start_id]
    cut = row.index(SOURCE_END)
    decoder = row[cut + 1:]
    if not decoder:
        raise ValueError("a seq2seq row needs at least one decoder token after SOURCE_END")
    return row[:cut], decoder


KINDS = ("auto", "causal", "seq2seq")


def is_seq2seq(location: str, gguf_file: str | None, kind: str = "auto", trust_remote_code: bool = False) -> bool:
    """Whether a model source loads as an encoder-decoder member: ``kind`` says so, or (``auto``)
    its config has ``is_encoder_decoder`` (GGUF files are causal models)."""
    if kind not in KINDS:
        raise ValueError(f"member kind '{kind}' is not one of {', '.join(KINDS)}")
    if kind != "auto" or gguf_file is not None:
        return kind == "seq2seq"
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(location, trust_remote_code=trust_remote_code)
    return bool(getattr(config, "is_encoder_decoder", False))
