"""VllmMember: a member whose model an in-process vLLM engine steps (recipe: ``backend: vllm``).

The engine decodes in its own thread and ensbench chooses every token (members/vllm_engine.py). How
the Member calls map onto it (docs/backends.md):
- ``prefill``: one request per row; each publishes its distribution after its prompt.
- ``extend``: every live row takes its tokens in place in one engine step (drafted steps: the first
  token is forced where the row waits, the rest are that step's drafts, which vLLM's speculative
  decoding computes in one forward pass and the steering forces; more than ``max_drafts`` + 1 tokens
  take more steps). A row without a live request (cropped past its undecided drafts, new) is submitted
  again with its prefix and new tokens as the prompt (prefix caching keeps its full KV blocks), timed
  to publish at the same step as the rest. Without drafted steps (no ``PromptReader``: tensor
  parallel engines) each token is forced in a step of its own and rows whose token count differs
  from the batch's are submitted again.
- ``crop``: a crop inside the drafts of the step a row waits in is a rejection there (its next token
  is forced where the first cropped draft was); a deeper crop marks the row for re-submission.
  ``keep`` finishes the rows that leave.
- ``extend_scored``: as ``extend``; each forced token's log-prob kept (read from the prompt positions
  for a row submitted again).
- ``score``: vLLM's prompt log-probs (``prompt_logprobs=0``: each given token's log-prob and rank).
- ``read_block``: as ``extend``, the log-probs after each wanted block token kept as its position is
  computed: for a live row the block is one drafted step; a row submitted again is read in the one
  step that computes its prompt (``PromptReader``). Without drafted steps, one engine step for the
  re-submitted rows or one step per token for the rows that hold a live request, whichever the
  member's measured costs (``StepCosts``) say is cheaper. ``read_tree``: not given (``reads_trees``
  False: byte_level takes its byte-by-byte loop; docs/backends.md says why).
- Before each call the rows' KV blocks are counted against the engine's cache (a row vLLM preempted
  would never publish): a batch that outgrows it is a UserError.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import time
from collections import Counter, deque
from collections.abc import Sequence
from pathlib import Path

import torch

from ensemble_bench.errors import UserError
from ensemble_bench.members.base import ALL_CAPABILITIES, ForwardClock, Member, Score
from ensemble_bench.members.batching import in_batches
from ensemble_bench.members.rows import RowBatch
from ensemble_bench.members.tokenizer_side import TokenizerSide
from ensemble_bench.members.vllm_engine import (
    EXTRA_KEY,
    Command,
    ComputedBlocks,
    DraftedSteps,
    EngineThread,
    PromptReader,
    SteeredRow,
    Steering,
    StepCosts,
)
from ensemble_bench.vocab import build_vocab_view


class VllmMember(TokenizerSide, Member):
    reads_trees = False
    capabilities = ALL_CAPABILITIES

    def __init__(self, engine, tokenizer, generation_config, config, name: str, chat_template: bool,
                 max_model_len: int, max_num_seqs: int, folder: Path):
        from ensemble_bench.members.local import stop_ids_of

        self.engine, self.tokenizer, self.name, self.folder = engine, tokenizer, name, folder
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.vocab = build_vocab_view(tokenizer, config.get_text_config().vocab_size)
        self.stop_ids = stop_ids_of(tokenizer, generation_config, self.vocab)
        self.uses_chat_template = bool(chat_template and tokenizer.chat_template)
        self.max_length, self.max_num_seqs = max_model_len, max_num_seqs
        bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        self.prefix_token_id = bos
        self._bos_text = tokenizer.decode([bos]) if bos is not None else None
        cache = engine.vllm_config.cache_config
        self.kv_blocks, self.block_size = cache.num_gpu_blocks - 1, cache.block_size  # less the null block
        self.clock = ForwardClock()
        self.batch = RowBatch(self.vocab.size, self.device)
        self.handles: list[SteeredRow | None] = []  # per batch row: its live request, None when parked
        self.stale: list[bool] = []                 # per batch row: cropped since its request published
        self.steering = Steering()
        self.steering.reader = PromptReader.attach(engine)
        self.drafting = DraftedSteps.attach(engine, self.steering)
        self.computed = ComputedBlocks(self.block_size)  # what its prefix cache may serve
        self.step_costs, self.computing = StepCosts(), 0  # its calls' costs; tokens the current call computes
        self.thread = EngineThread(engine, self.steering)
        self.thread.start()
        self.resubmitted = 0  # rows finished and submitted again (crops past a step's drafts, new rows)
        self.rejected = 0     # rows whose cropped drafts the step they waited in rejected
        self._keys = itertools.count()
        atexit.register(self.close)

    @property
    def max_drafts(self) -> int:
        """The most queued tokens a row's engine step takes after the one it forces (drafted steps; a
        row re-submitted reads its new tokens from its prompt): 0 without a ``PromptReader``."""
        return self.drafting.max_drafts if self.drafting is not None and self.steering.reader is not None else 0

    # --- the engine thread's commands --------------------------------------------------------------
    def _params(self, key: str, prompt_len: int, fresh: bool = False):
        from vllm import SamplingParams

        return SamplingParams(temperature=0.0, max_tokens=max(1, self.max_length - prompt_len), ignore_eos=True,
                              detokenize=False, extra_args={EXTRA_KEY: (self.steering.id, key)},
                              skip_reading_prefix_cache=True if fresh else None)

    def _submit(self, ids: Sequence[int], queue: Sequence[int] = (), at: int | None = None,
                scoring: bool = False, wanted: frozenset = frozenset(), in_prompt: tuple = ()) -> SteeredRow:
        """A new steered request for ``ids`` (the lock is held), added before engine step ``at`` (default:
        the next); ``queue`` is forced after its prompt, one token a step; ``in_prompt``: the prompt
        positions (counted back from its last) whose next-token log-probs its first step keeps, so
        computed by it: where the prefix cache could serve one of them (tokens computed before, read
        again), the request does not read the cache."""
        key = f"{self.name}-{next(self._keys)}"
        row = SteeredRow(key, queue=deque(queue), scoring=scoring, first=False, wanted=wanted, in_prompt=in_prompt)
        self.steering.rows[key] = row
        at = self.steering.steps if at is None else at
        served = self.computed.served(ids)
        fresh = bool(in_prompt) and served > len(ids) - 1 - max(in_prompt)
        self.steering.commands.append(Command("add", key, list(ids), at, self._params(key, len(ids), fresh)))
        self.computed.add(list(ids) + list(queue))
        self.computing += len(ids) - (0 if fresh else served) + len(queue)
        return row

    @contextlib.contextmanager
    def _costed(self):
        """A call observed for ``StepCosts`` (the lock is held): the engine steps until its rows publish,
        the tokens those steps compute for it, its seconds."""
        self.computing, first, start = 0, self.steering.steps, time.perf_counter()
        yield
        self.step_costs.observe(max(1, self.steering.steps - first), self.computing, time.perf_counter() - start)

    def _drop(self, row: SteeredRow) -> None:
        """Finish a live request (the lock is held): its pending step forces a throwaway token."""
        row.dropped, row.waiting = True, False
        self.steering.rows.pop(row.key, None)
        self.steering.commands.append(Command("abort", row.key, at=self.steering.steps))

    def _collect(self, rows: list[SteeredRow]) -> list[torch.Tensor]:
        """Wait (the lock is held) until every row published; their distributions."""
        self.steering.cond.notify_all()
        self.steering.wait(lambda: all(r.waiting for r in rows))
        return [r.dist for r in rows]

    # --- batched stepping ----------------------------------------------------------------------------
    def prefill(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        if len(rows) > self.max_num_seqs:
            raise UserError(f"member '{self.name}': a batch of {len(rows)} rows exceeds its vllm.max_num_seqs "
                            f"({self.max_num_seqs}): lower batch_size or raise max_num_seqs")
        self._check_room([[]] * len(rows), [len(ids) for ids in rows])
        with self.steering.cond, self.clock.timed("prefill"), self._costed():
            for handle in self.handles:
                if handle is not None:
                    self._drop(handle)
            self.batch.start(len(rows))
            self.handles = [self._submit(ids) for ids in rows]
            self.stale = [False] * len(rows)
            dists = self._collect(self.handles)
        self.batch.take(rows)
        return self.batch.set_last(range(len(rows)), torch.stack(dists))

    def extend(self, tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        return self._extend(tokens, scoring=False)[0]

    def extend_scored(self, tokens: Sequence[Sequence[int]]) -> tuple[torch.Tensor, list[list[float]]]:
        return self._extend(tokens, scoring=True)[:2]

    def read_block(self, tokens: Sequence[Sequence[int]], at: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """The block as ``extend`` moves it, each wanted position's log-probs kept as it is computed: one
        drafted step for a live row, the step that computes its prompt for a row submitted again.
        Without drafted steps: one engine step (every row submitted again) or one step per token with
        the rows that hold a live request forced in place, whichever the member's measured costs say
        is cheaper (``_read_steps``); without a ``PromptReader``, one forced step per token."""
        wanted = self.batch.check_block(tokens, at)
        steps = self._read_steps(tokens) if self.steering.reader is not None and any(tokens) and not self.max_drafts \
            else None
        return self._extend(tokens, scoring=False, wanted=wanted, steps=steps)[2]

    def _read_steps(self, tokens: Sequence[Sequence[int]]) -> int:
        """A block read's engine steps: 1, or its longest block with the live rows of that length forced
        in place, by ``StepCosts`` (a tie: one step). The other rows' re-submissions compute their last
        partial KV block and their block (more where the cache lost their blocks)."""
        longest = max(len(row) for row in tokens)
        live = [r for r, row in enumerate(tokens) if row and self.handles[r] is not None and not self.stale[r]]
        held = self.batch.ids

        def cost(steps: int) -> float:
            in_place = [r for r in live if len(tokens[r]) == steps]
            submitted = [r for r, row in enumerate(tokens) if row and r not in in_place]
            prompts = [held[r] + list(tokens[r]) for r in submitted]
            return self.step_costs.of(steps, steps * len(in_place) + sum(len(p) - self.computed.served(p)
                                                                          for p in prompts))

        return min((1, longest), key=cost)

    def _extend(self, tokens: Sequence[Sequence[int]], scoring: bool, wanted: list[list[int]] | None = None,
                steps: int | None = None) -> tuple[torch.Tensor, list[list[float]], list[torch.Tensor]]:
        """Append ``tokens``; every row's next-token log-probs, the scored log-probs (``scoring``) and
        the block read's distributions at ``wanted`` positions. Live rows take their tokens in place in
        ``steps`` engine steps (drafted steps: chunks of up to ``max_drafts`` + 1 tokens a step); other
        rows are submitted again with all their tokens in the prompt. Without drafted steps, scoring
        and block reads (``steps`` None) compute every token after a row's first in a step of its own."""
        self.batch.check(tokens)
        by_token = not self.max_drafts and (scoring or (wanted is not None and steps is None))
        wanted = wanted or [[] for _ in tokens]
        if not any(tokens):  # no row moves: no engine step (a live row given nothing would be forced a token)
            return self.batch.last, [[] for _ in tokens], [self._block(None, 0, []) for _ in tokens]
        self._check_room(tokens, [len(ids) for ids in self.batch.ids])
        steps = self._steps(tokens, by_token) if steps is None else steps
        for r, row in enumerate(tokens):
            handle = self.handles[r]
            if handle is not None and handle.rejected and row and row[0] == handle.undecided[-handle.rejected]:
                self.stale[r] = True  # vLLM's sampler would take the rejected draft back as it is
        live = [h is not None and not s for h, s in zip(self.handles, self.stale)]
        forced = [here and self._in_place(len(row), steps) for here, row in zip(live, tokens)]
        held = self.batch.row_ids()
        moved = [r for r, row in enumerate(tokens) if row]
        with self.steering.cond, self.clock.timed("decode", calls=steps), self._costed():
            publish = self._publish_step(tokens, steps if any(forced) else None, by_token)
            for r, row in enumerate(tokens):
                handle = self.handles[r]
                if forced[r]:
                    if (len(held[r]) + len(row)) // self.block_size > len(held[r]) // self.block_size:
                        self.computed.add(held[r] + list(row))  # a KV block filled
                    self.computing += len(row)
                    self.rejected += handle.rejected > 0
                    handle.queue.extend(row)
                    handle.chunks = deque(chunk_sizes(len(row), steps)) if self.max_drafts else deque()
                    handle.scoring, handle.first, handle.scored, handle.waiting = scoring, True, [], False
                    handle.wanted, handle.captured, handle.index = frozenset(wanted[r]), [], 0
                    continue
                if handle is not None:  # cropped, or a count the batch does not step: finished here
                    self._drop(handle)
                    self.handles[r] = None
                if row:
                    read = frozenset(range(len(row) - 1)) if scoring and self.max_drafts else frozenset(wanted[r])
                    self.handles[r] = self._resubmit(held[r], row, publish, scoring, by_token, read)
                    self.stale[r] = False
            dists = self._collect([self.handles[r] for r in moved])
        scored = [self._scored(r, tokens[r], forced[r]) if scoring and r in moved else [] for r in range(len(tokens))]
        blocks = [self._block(self.handles[r] if row else None, len(row), wanted[r]) for r, row in enumerate(tokens)]
        self.batch.take(tokens)
        if moved:
            self.batch.set_last(moved, torch.stack(dists))
        return self.batch.last, scored, blocks

    def _in_place(self, count: int, steps: int) -> bool:
        """Whether a live row given ``count`` tokens publishes after ``steps`` engine steps: one token a
        step, or with drafted steps a chunk of 1 to ``max_drafts`` + 1 tokens a step."""
        return steps <= count <= steps * (self.max_drafts + 1) if count else False

    def _scored(self, r: int, row: Sequence[int], forced: bool) -> list[float]:
        """A scoring call's log-probs of row ``r``'s tokens after its first: kept as they were forced, or
        (re-submitted with drafted steps) read from the prompt positions its step computed."""
        handle = self.handles[r]
        if forced or not self.max_drafts:
            return list(handle.scored)
        return [float(dist[token]) for dist, token in zip(handle.captured, row[1:])]

    def _block(self, handle: SteeredRow | None, length: int, wanted: list[int]) -> torch.Tensor:
        """A block read's answer for one row: what its steps kept, and the published distribution when
        the position after its last token is wanted; [0, V] when nothing is."""
        kept = []
        if handle is not None:
            kept = list(handle.captured) + ([handle.dist] if wanted and wanted[-1] == length - 1 else [])
        return torch.stack(kept) if kept else torch.empty((0, self.vocab.size), device=self.device)

    def _publish_step(self, tokens: Sequence[Sequence[int]], forced_steps: int | None, by_token: bool) -> int:
        """The engine step at which every row that moves publishes (the lock is held). Live rows wait
        inside step ``steering.steps``, which forces their first tokens: rows forced in place publish
        ``forced_steps`` later. Without them, a request added now is first computed in the next step
        (the step itself on an idle engine), and the row forcing the most tokens after its prompt sets
        the pace."""
        now = self.steering.steps
        if forced_steps is not None:
            return now + forced_steps
        after_prompt = max((len(row) - 1 for row in tokens if row), default=0) if by_token else 0
        return now + any(h is not None for h in self.handles) + after_prompt

    def _check_room(self, tokens: Sequence[Sequence[int]], held: Sequence[int]) -> None:
        """Refuse a step whose rows would not all fit the KV cache (vLLM would preempt a row and the
        step waiting for it would never end): rows holding ``held`` tokens, then given ``tokens``, each
        with a block of room for its next one."""
        needed = sum(room_blocks(n + len(row), self.block_size) for n, row in zip(held, tokens))
        if needed > self.kv_blocks:
            tokens_held = sum(held) + sum(len(row) for row in tokens)
            raise UserError(f"member '{self.name}': its vLLM KV cache holds {self.kv_blocks * self.block_size} tokens "
                            f"({self.kv_blocks} blocks of {self.block_size}), {len(held)} rows of {tokens_held} tokens "
                            "need more: raise vllm.kv_cache_gib (gpu_memory_utilization on a GPU), or lower "
                            "batch_size or max_gen_toks")

    def _steps(self, tokens: Sequence[Sequence[int]], by_token: bool) -> int:
        """The engine steps until the rows forced in place publish. With drafted steps: the fewest that
        take every row's tokens (one step unless a row has more than ``max_drafts`` + 1). Otherwise one
        token a step: the longest row's count when every token is computed in a step of its own
        (scoring, block reads: a re-submitted row forces all but its first, so none may force more);
        else the most common count (re-submitting the fewest)."""
        if self.max_drafts:
            return max((-(-len(row) // (self.max_drafts + 1)) for row in tokens if row), default=0)
        if by_token:
            return max((len(row) for row in tokens), default=0)
        counts = Counter(len(row) for row in tokens if row)
        return min(counts.items(), key=lambda pair: (-pair[1], pair[0]))[0] if counts else 0

    def _resubmit(self, held: list[int], row: Sequence[int], publish: int, scoring: bool, by_token: bool,
                  wanted: frozenset) -> SteeredRow:
        """A row again as a new request: its prompt the held ids and new tokens (all of them, or only
        the first when each later one is computed as it is forced), added so that it publishes at
        engine step ``publish`` with the rest of the batch. With all of them in the prompt, its first
        step keeps the log-probs after the ``wanted`` ones before the last."""
        self.resubmitted += 1
        if by_token:
            return self._submit(held + list(row[:1]), row[1:], at=publish - len(row) + 1, scoring=scoring,
                                wanted=wanted)
        back = tuple(len(row) - 1 - j for j in sorted(wanted) if j < len(row) - 1)
        return self._submit(held + list(row), at=publish, in_prompt=back)

    def crop(self, lengths: Sequence[int]) -> None:
        """Rows lose their last tokens: drafts still undecided in the step a live row waits in are
        rejected there (no engine work); a row cropped further is submitted again when it moves."""
        with self.steering.cond:
            for r, dropped in enumerate(self.batch.crop(lengths)):
                handle = self.handles[r]
                if dropped and not self.stale[r] and handle is not None and handle.waiting \
                        and handle.rejected + dropped <= len(handle.undecided):
                    handle.rejected += dropped
                else:
                    self.stale[r] = self.stale[r] or dropped > 0

    def keep(self, rows: Sequence[int]) -> None:
        rows = [int(r) for r in rows]
        with self.steering.cond:
            for r, handle in enumerate(self.handles):
                if handle is not None and r not in rows:
                    self._drop(handle)
            handles = []
            for k, r in enumerate(rows):  # a row named twice: its copy is parked (submitted when it moves)
                handles.append(self.handles[r] if r not in rows[:k] else None)
            self.handles, self.stale = handles, [self.stale[r] for r in rows]
            self.steering.cond.notify_all()
        self.batch.keep(rows)

    def row_ids(self) -> list[list[int]]:
        return self.batch.row_ids()

    def input_embeddings(self) -> torch.Tensor:
        """The embedding matrix, read from the weights folder (the engine's copy stays in the engine)."""
        from safetensors import safe_open

        for path in sorted(self.folder.glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as weights:
                name = next((k for k in weights.keys() if k.endswith("embed_tokens.weight")), None)  # noqa: SIM118
                if name is not None:
                    return weights.get_tensor(name).float()[:self.vocab.size].to(self.device)
        raise UserError(f"vLLM member '{self.name}': no embed_tokens weights in {self.folder}")

    # --- scoring ---------------------------------------------------------------------------------------
    def score(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int = 8) -> list[Score]:
        """Each continuation's summed log-prob and greedy flag from vLLM's prompt log-probs (HFLM's window)."""
        pairs = self.fit_pairs(pairs)
        lengths = [len(c) + len(x) for c, x in pairs]
        return in_batches(lengths, batch_size, lambda batch: self._score_chunk([pairs[i] for i in batch]))

    def _score_chunk(self, pairs) -> list[Score]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
        outputs = self._unsteered([list(context) + list(continuation) for context, continuation in pairs], params)
        return [score_of(output, len(continuation)) for output, (_, continuation) in zip(outputs, pairs)]

    def generate_plain(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
        """vLLM's own greedy decoding of each prompt, ``max_tokens`` new ids each (no stop): the
        baseline the steered loop is measured and tested against."""
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        return [list(output.outputs[0].token_ids) for output in self._unsteered(prompts, params)]

    def _unsteered(self, prompts: Sequence[Sequence[int]], params) -> list:
        """Plain requests run to their end (decoding rows are parked first: the engine must be free)."""
        with self.steering.cond:
            for r, handle in enumerate(self.handles):
                if handle is not None:
                    self._drop(handle)
                    self.handles[r] = None
            keys = [f"{self.name}-plain-{next(self._keys)}" for _ in prompts]
            for key, prompt in zip(keys, prompts):
                self.steering.results[key] = None
                self.steering.commands.append(Command("add", key, list(prompt), 0, params))
            self.steering.cond.notify_all()
            self.steering.wait(lambda: all(self.steering.results[k] is not None for k in keys))
            outputs = [self.steering.results.pop(k) for k in keys]
        for output in outputs:
            self.computed.add(list(output.prompt_token_ids) + list(output.outputs[0].token_ids))
        return outputs

    def close(self) -> None:
        with self.steering.cond:
            self.steering.closed = True
            self.steering.cond.notify_all()


def chunk_sizes(count: int, steps: int) -> list[int]:
    """``count`` tokens over ``steps`` engine steps, as evenly as they go (the larger chunks first)."""
    return [count // steps + (k < count % steps) for k in range(steps)]


def room_blocks(tokens: int, block_size: int) -> int:
    """KV blocks a row of ``tokens`` tokens needs, with room for the one it computes next."""
    return tokens // block_size + 1


def score_of(output, count: int) -> Score:
    """A continuation's Score from a request's prompt log-probs (its last ``count`` prompt tokens)."""
    ids = output.prompt_token_ids[len(output.prompt_token_ids) - count:]
    entries = output.prompt_logprobs[len(output.prompt_logprobs) - count:]
    picked = [entry[token] for entry, token in zip(entries, ids)]
    return Score(sum(p.logprob for p in picked), all(p.rank == 1 for p in picked))
