"""LocalMember: a transformers causal LM in this process (CPU or one CUDA device)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ensemble_bench.members import kv
from ensemble_bench.members.base import ALL_CAPABILITIES, ForwardClock, Member, Score, flatten_messages
from ensemble_bench.members.batching import in_batches, left_padded, positions_of
from ensemble_bench.members.kv import CachedRows
from ensemble_bench.members.tokenizer_side import TokenizerSide
from ensemble_bench.vocab import build_vocab_view

__all__ = ["LocalMember", "ForwardClock", "TokenizerSide", "flatten_messages", "stop_ids_of", "max_length_of"]

# Special tokens that end a turn or a document in the model families we meet.
END_MARKERS = frozenset({
    "</s>", "<eos>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "<|end|>",
    "<end_of_turn>", "<|eom_id|>", "<｜end▁of▁sentence｜>", "<|END_OF_TURN_TOKEN|>",
})
DEFAULT_MAX_LENGTH = 2048


def stop_ids_of(tokenizer, generation_config, vocab) -> frozenset[int]:
    """Every id that ends generation: the config's EOS list, the tokenizer's EOS, end markers."""
    ids: set[int] = set()
    eos = getattr(generation_config, "eos_token_id", None)
    ids.update(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    for idx in vocab.special_ids:
        if (vocab.pieces[idx] or b"").decode("utf-8", "replace") in END_MARKERS:
            ids.add(idx)
    return frozenset(i for i in ids if 0 <= i < vocab.size)


WINDOW_FIELDS = ("n_positions", "max_position_embeddings", "n_ctx", "max_seq_len", "seq_length",
                 "max_sequence_length")  # lm-eval's HFLM reads the first three, in this order


def max_length_of(config, tokenizer) -> int:
    """A model's window in tokens: its config's position limit, else the tokenizer's
    ``model_max_length``, else 2048 (lm-eval HFLM's rule, with more config spellings)."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for attr in WINDOW_FIELDS:
        value = getattr(text_config, attr, None)
        if value:
            return int(value)
    limit = getattr(tokenizer, "model_max_length", None)
    if limit and limit < 10**9:
        return int(limit)
    return DEFAULT_MAX_LENGTH


class LocalMember(TokenizerSide, Member):
    capabilities = ALL_CAPABILITIES

    def __init__(self, model, tokenizer, name: str, chat_template: bool = True):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.device = next(model.parameters()).device
        head_size = model.get_output_embeddings().weight.shape[0]
        self.vocab = build_vocab_view(tokenizer, head_size)
        self.stop_ids = stop_ids_of(tokenizer, model.generation_config, self.vocab)
        self.uses_chat_template = bool(chat_template and tokenizer.chat_template)
        self.max_length = max_length_of(model.config, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (tokenizer.eos_token_id or 0)
        bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        self.prefix_token_id = bos
        self._bos_text = tokenizer.decode([bos]) if bos is not None else None
        self.clock = ForwardClock()
        self.batch = CachedRows(self.vocab.size, self.device)
        self.cache_argument = kv.cache_argument(model)  # `cache`, not the deprecated `past_key_values`

    # --- batched, KV-cached stepping --------------------------------------------------------
    def prefill(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """Rows with the same ids (an lm-eval request's ``repeats``, sampled draws of one prompt) are
        computed once and their cache rows copied: n samples of a prompt cost one prefill."""
        distinct = {tuple(row): k for k, row in enumerate(dict.fromkeys(tuple(row) for row in rows))}
        self.batch.start(len(distinct))
        self._append(list(distinct), phase="prefill")
        if len(distinct) < len(rows):
            self.batch.keep([distinct[tuple(row)] for row in rows])
        return self.batch.last

    def extend(self, tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        self.batch.check(tokens)
        self._append(tokens, phase="decode")
        return self.batch.last

    def extend_scored(self, tokens: Sequence[Sequence[int]]) -> tuple[torch.Tensor, list[list[float]]]:
        self.batch.check(tokens)
        reach = max((len(row) for row in tokens), default=1)
        active, logprobs, where = self._append(tokens, phase="decode", reach=reach)
        scored: list[list[float]] = [[] for _ in tokens]
        for k, r in zip(where, active):  # log p of each appended token after the first
            row = list(tokens[r])
            first = reach - len(row)
            steps = torch.arange(first, first + len(row) - 1, device=logprobs.device)
            targets = torch.tensor(row[1:], dtype=torch.long, device=logprobs.device)
            scored[r] = logprobs[k, steps, targets].tolist()
        return self.batch.last, scored

    def read_block(self, tokens: Sequence[Sequence[int]], at: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        at = self.batch.check_block(tokens, at)
        reach = max((len(row) - wanted[0] for row, wanted in zip(tokens, at) if wanted), default=1)
        active, logprobs, where = self._append(tokens, phase="decode", reach=reach)
        columns = {r: [reach - len(tokens[r]) + i for i in at[r]] for r in active}
        if where is active:  # logprobs holds every row of the batch
            return self.batch.blocks(logprobs, range(len(tokens)), [columns.get(r, []) for r in range(len(tokens))])
        return self.batch.blocks(logprobs, active, [columns[r] for r in active])

    @property
    def reads_trees(self) -> bool:
        """Not with sliding-window attention: a tree's 4D mask is taken as is by every layer, so a
        window would be ignored (those models take byte_level's byte-by-byte loop)."""
        config = self.model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        return getattr(text_config, "sliding_window", None) is None

    def read_tree(self, tokens: Sequence[Sequence[int]], parents: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Every row's tree after its held tokens in one forward pass: a 4D mask lets each node see
        its row's cache and its own ancestors, at position (row length + depth); the tree's columns
        leave the cache afterwards."""
        self.batch.check(tokens)
        width = max((len(row) for row in tokens), default=0)
        if not width:
            return [torch.zeros((0, self.vocab.size), device=self.device) for _ in tokens]
        seen, depths = tree_visibility(parents, width)
        held = self.batch.mask.shape[1]
        visible = torch.cat([self.batch.mask.bool()[:, None, :].expand(-1, width, held), seen.to(self.device)], dim=2)
        blocked = torch.finfo(self.model.dtype).min
        mask = torch.zeros(visible.shape, dtype=self.model.dtype, device=self.device).masked_fill_(~visible, blocked)
        positions = self.batch.mask.sum(dim=1, keepdim=True) + depths.to(self.device)
        ids = torch.tensor([list(row) + [self.pad_id] * (width - len(row)) for row in tokens], dtype=torch.long)
        with self.clock.timed("decode"), torch.no_grad():
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask[:, None], position_ids=positions,
                             use_cache=True, **{self.cache_argument: self.batch.cache})
            kv.drop_trailing_columns(self.batch.cache, width)
            logprobs = log_probs_of(out.logits)
        return [logprobs[r, :len(row)] for r, row in enumerate(tokens)]

    def _append(self, tokens: Sequence[Sequence[int]], phase: str,
                reach: int = 1) -> tuple[list[int], torch.Tensor | None, list[int]]:
        """Feed each row its tokens (left padded, one forward pass); (the rows that got tokens, log-probs
        at the block's last ``reach`` positions [n, reach, V] (None when no row got tokens), and where
        each of those rows is among the n: ``active`` itself when the forward pass ran every row, so
        that no row is copied out). ``batch.last`` becomes each row's distribution after its last token."""
        batch = self.batch
        active = batch.take(tokens)
        if not active:
            return active, None, active
        ids, new_mask = left_padded([tokens[r] for r in active], self.pad_id)
        if phase == "decode" and 2 * len(active) <= len(tokens):
            logprobs = self._forward_rows(active, ids, new_mask, phase, reach)
            batch.set_last(active, logprobs[:, -1])
            where = list(range(len(active)))
        else:
            full_ids = torch.full((len(tokens), ids.shape[1]), self.pad_id, dtype=torch.long)
            full_mask = torch.zeros_like(full_ids)
            full_ids[active], full_mask[active] = ids, new_mask
            logprobs, batch.mask = self._forward(batch.cache, batch.mask, full_ids, full_mask, phase, reach)
            batch.set_last_of(active, logprobs[:, -1])
            where = active
        batch.realign(evenly=len({len(row) for row in tokens}) == 1)
        return active, logprobs, where

    def _forward_rows(self, active: list[int], ids, new_mask, phase: str, keep: int = 1) -> torch.Tensor:
        """Run only the rows that receive tokens (few of many): their cache rows are copied out,
        extended, and written back; the other rows get padding columns (re-aligned afterwards)."""
        batch = self.batch
        index = torch.tensor(active, dtype=torch.long, device=self.device)
        sub_cache = kv.copy_rows(batch.cache, index)
        logprobs, _ = self._forward(sub_cache, batch.mask.index_select(0, index), ids, new_mask, phase, keep)
        kv.append_columns(batch.cache, sub_cache, index, ids.shape[1])
        grown = torch.zeros((batch.mask.shape[0], ids.shape[1]), dtype=batch.mask.dtype, device=self.device)
        grown[index] = new_mask.to(self.device)
        batch.mask = torch.cat([batch.mask, grown], dim=1)
        return logprobs

    def _forward(self, cache, mask, ids: torch.Tensor, new_mask: torch.Tensor, phase: str, keep: int = 1):
        """One forward pass over ``ids`` after ``cache``; returns (log-probs of the last ``keep``
        positions [rows, keep, V], mask)."""
        mask = torch.cat([mask, new_mask.to(self.device)], dim=1)
        new_positions = positions_of(mask)[:, -ids.shape[1]:]
        with self.clock.timed(phase), torch.no_grad():  # not inference_mode: the log-probs stay ordinary tensors
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask, position_ids=new_positions,
                             use_cache=True, logits_to_keep=keep, **{self.cache_argument: cache})
            logprobs = log_probs_of(out.logits[:, -keep:, :])
        return logprobs, mask

    def crop(self, lengths: Sequence[int]) -> None:
        self.batch.crop(lengths)

    def keep(self, rows: Sequence[int]) -> None:
        self.batch.keep(rows)

    def row_ids(self) -> list[list[int]]:
        return self.batch.row_ids()

    def input_embeddings(self) -> torch.Tensor:
        weight = self.model.get_input_embeddings().weight.detach()
        return weight[:self.vocab.size]

    def output_embeddings(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight.detach()[:self.vocab.size]

    # --- scoring --------------------------------------------------------------------------------
    def score(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int = 8) -> list[Score]:
        """Sum of continuation log-probs and greedy flag, as lm-eval's HFLM defines them.

        Pairs are cut to the window first (``fit_pairs``: the input is ``(context +
        continuation)[-(max_length + 1):][:-1]``); rows are left padded and only the last
        ``len(continuation)`` positions go through the output head.
        """
        pairs = self.fit_pairs(pairs)
        lengths = [len(context) + len(continuation) for context, continuation in pairs]
        return in_batches(lengths, batch_size, lambda batch: self._score_chunk([pairs[i] for i in batch]))

    def _score_chunk(self, pairs) -> list[Score]:
        inputs = [(ctx + cont)[:-1] for ctx, cont in pairs]
        keep = max(len(cont) for _, cont in pairs)
        ids, mask = left_padded(inputs, self.pad_id)
        with torch.inference_mode():
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                             position_ids=positions_of(mask).to(self.device), use_cache=False, logits_to_keep=keep)
            logprobs = log_probs_of(out.logits)
        scores = []
        for r, (_, cont) in enumerate(pairs):
            rows = logprobs[r, logprobs.shape[1] - len(cont):]
            target = torch.tensor(list(cont), dtype=torch.long, device=logprobs.device)
            picked = rows.gather(1, target[:, None]).squeeze(1)
            scores.append(Score(float(picked.sum()), bool((rows.argmax(dim=-1) == target).all())))
        return scores


def tree_visibility(parents: Sequence[Sequence[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(seen [rows, width, width]: node n sees node m when m is n or one of its ancestors; depth
    [rows, width] of every node, 0 under the root) for trees given by parent indices (-1: the
    root, else an earlier node). Padding nodes see themselves only."""
    rows, cols, depths = [], [], [[0] * width for _ in parents]
    for r, row in enumerate(parents):
        lines: list[list[int]] = []
        for n, parent in enumerate(row):
            if not -1 <= parent < n:
                raise ValueError(f"row {r}: node {n} has parent {parent}, not -1 or an earlier node")
            lines.append((lines[parent] if parent >= 0 else []) + [n])
            depths[r][n] = len(lines[n]) - 1
        lines.extend([n] for n in range(len(row), width))
        for n, line in enumerate(lines):
            rows.extend((r * width + n,) * len(line))
            cols.extend(line)
    seen = torch.zeros((len(parents) * width, width), dtype=torch.bool)
    seen[rows, cols] = True
    return seen.view(len(parents), width, width), torch.tensor(depths, dtype=torch.long)


def log_probs_of(logits: torch.Tensor) -> torch.Tensor:
    """float32 log-softmax over the last dimension of a forward pass's fresh ``logits`` (nothing
    else holds them), written over them (float32 logits) or over their float32 copy (bf16 / fp16):
    the values of ``logits.float().log_softmax(-1)`` bit for bit, without a second vocabulary-sized
    buffer. Inference tensors (``torch.inference_mode``) must not leave the member: methods may
    write into the distributions a step returned."""
    upcast = logits.float()
    if not upcast.is_contiguous():  # a model that ignores logits_to_keep: a slice of its logits
        return upcast.log_softmax(dim=-1)
    return torch.log_softmax(upcast, dim=-1, out=upcast)

