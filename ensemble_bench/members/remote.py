"""RemoteMember: a member whose model runs in a Ray actor (another process, GPU or machine).

The actor (``MemberServer``) holds the member as its backend loads it (a LocalMember on transformers,
a VllmMember with its engine on vLLM); ``RemoteMember`` implements the Member interface in the driver
by forwarding calls. What crosses the wire, whatever the backend:

- once, at start: the tokenizer (pickled), the byte vocabulary view, stop ids, max length;
  tokenizer-only calls (render, encode, decode, word_starts, encode_pair, rolling_pairs) then
  run in the driver on that copy and never reach the actor;
- per step (``prefill`` / ``extend`` / ``extend_scored``): the new token ids in; out, the
  float32 next-token log-probs of the rows that received tokens only (4 x head size bytes per
  such row) plus four clock numbers; ``read_block`` returns the positions asked for, plus each
  such row's distribution after its last token when they do not name it. Rows given no tokens
  keep their previous distribution, which the driver mirrors, as it mirrors each row's ids
  (``row_ids`` costs no call) and the NaN rows that ``crop`` leaves. A step that gives no row a
  token makes no call;
- ``crop`` and ``keep`` are sent without waiting (an actor runs its calls in order); their
  errors are checked here first and any remote error surfaces at the next call that waits;
- ``score`` sends token id pairs, already cut to the window, and gets (log-prob, greedy) pairs
  back. Every cut to the window (``fit_pairs``, ``fit_prompt``) happens in the driver, so the
  driver's ``contexts_truncated`` counts them all.

Methods read whole distributions (GaC projects every id onto the union vocabulary, DeePEn
every valid id, UniTE's alignment and the span methods look up arbitrary ids), so the rows are
sent whole: a top-k transfer would change results. ``traffic`` counts calls and bytes received.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ensemble_bench.errors import UserError
from ensemble_bench.members.base import ALL_CAPABILITIES, ForwardClock, Member, Score
from ensemble_bench.members.loading import load_member
from ensemble_bench.members.rows import RowBatch
from ensemble_bench.members.tokenizer_side import TokenizerSide

FORWARDED_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME",
                 "ENSBENCH_CACHE", "TOKENIZERS_PARALLELISM", "VLLM_CPU_KVCACHE_SPACE")


class MemberServer:
    """The actor side: one member (any backend's), answering with the rows that changed."""

    def __init__(self, load: dict[str, Any], threads: int | None = None):
        if threads:
            torch.set_num_threads(threads)
        self.error: str | None = None
        try:
            self.member = load_member(**load)
        except UserError as err:  # reported by describe(), as one line
            self.error = str(err)

    def describe(self) -> dict[str, Any]:
        if self.error is not None:
            return {"error": self.error}
        m = self.member
        return {"tokenizer": m.tokenizer, "vocab": m.vocab, "stop_ids": m.stop_ids, "max_length": m.max_length,
                "prefix_token_id": m.prefix_token_id, "bos_text": m._bos_text, "name": m.name,
                "uses_chat_template": m.uses_chat_template, "device": str(m.device), "clock": self._clock()}

    def _clock(self) -> tuple[float, float, int, int]:
        c = self.member.clock
        return c.prefill_seconds, c.decode_seconds, c.prefill_calls, c.decode_calls

    @staticmethod
    def _changed(logprobs: torch.Tensor, tokens: Sequence[Sequence[int]]) -> np.ndarray:
        """The rows that got tokens (all of them: the tensor itself, no copy before Ray's own on a CPU)."""
        active = [r for r, row in enumerate(tokens) if row]
        return (logprobs if len(active) == len(tokens) else logprobs[active]).cpu().numpy()

    def prefill(self, rows):
        return self._changed(self.member.prefill(rows), rows), self._clock()

    def extend(self, tokens):
        return self._changed(self.member.extend(tokens), tokens), self._clock()

    def extend_scored(self, tokens):
        logprobs, scored = self.member.extend_scored(tokens)
        return self._changed(logprobs, tokens), scored, self._clock()

    def read_block(self, tokens, at):
        return [block.cpu().numpy() for block in self.member.read_block(tokens, at)], self._clock()

    def reads_trees(self) -> bool:
        return self.member.reads_trees

    def read_tree(self, tokens, parents):
        return [nodes.cpu().numpy() for nodes in self.member.read_tree(tokens, parents)], self._clock()

    def crop(self, lengths) -> None:
        self.member.crop(lengths)

    def keep(self, rows) -> None:
        self.member.keep(rows)

    def row_ids(self) -> list[list[int]]:
        return self.member.row_ids()

    def score(self, pairs, batch_size: int = 8) -> list[Score]:
        return self.member.score(pairs, batch_size=batch_size)

    def input_embeddings(self) -> torch.Tensor:
        return self.member.input_embeddings().detach().cpu().clone()

    def output_embeddings(self) -> torch.Tensor:
        return self.member.output_embeddings().detach().cpu().clone()


# Replies up to this size travel inside the call's reply rather than through Ray's object store (Ray's
# default: 100 KB). A step's reply is 4 x head size bytes per row (608 KB for Qwen2's head at batch 1):
# inline, a 600 KB reply came back in 2.0 ms against 6.0 ms through the store (median of 60, this CPU).
INLINE_REPLY_BYTES = 16 * 1024 * 1024
# A local instance's settings: replies inline up to INLINE_REPLY_BYTES; member actors at the driver's
# priority (Ray's default niceness for workers, 15, lets the driver's and Ray's own threads preempt them).
LOCAL_SYSTEM_CONFIG = {"max_direct_call_object_size": INLINE_REPLY_BYTES, "worker_niceness": 0}


def connect(address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    """Join the Ray cluster at ``address`` ("auto", "ray://host:port", "host:port"), or start a
    local one (``num_cpus`` / ``num_gpus``: its size; None: what Ray detects; replies inline up to
    ``INLINE_REPLY_BYTES``). Once per process."""
    import ray

    if ray.is_initialized():
        return
    if address is None:  # "local": a new instance even where another runs (``ray start``, a test cluster)
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                 logging_level=logging.WARNING, _system_config=LOCAL_SYSTEM_CONFIG)
    else:
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise UserError(f"cannot connect to the Ray cluster at '{address}': {first}") from None


def _runtime_env() -> dict:
    import os

    env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    return {"env_vars": env} if env else {}


class _PlacedServer(MemberServer):
    """A MemberServer whose model loads in ``start`` rather than in the constructor, so that the
    actor being placed on a node (its cheap constructor done: ``placed``) is seen apart from its
    model loading (which may take minutes)."""

    def __init__(self, load: dict[str, Any], threads: int | None = None):
        self._args, self._failure = (load, threads), None

    def placed(self) -> bool:
        return True

    def start(self) -> None:
        if self._args is not None:
            args, self._args = self._args, None
            try:
                MemberServer.__init__(self, *args)
            except Exception as err:  # raised again by describe(), where the driver waits
                self._failure = err
                raise

    def describe(self) -> dict[str, Any]:
        self.start()
        if self._failure is not None:
            raise self._failure
        return super().describe()


_PLACED: dict[Any, tuple[Any, dict[str, Any]]] = {}  # actor -> (its ``placed`` call, its options)


def launch(load: Any, options: dict[str, Any] | None = None, server: type = _PlacedServer):
    """Start the actor of one member (returns at once; the model loads in the background).

    ``load``: ``load_member``'s keyword arguments; ``options``: Ray actor options (num_gpus,
    num_cpus, resources). Several members launched before their RemoteMember is built load in parallel.
    ``wait_placed`` waits, with a time limit, until Ray has found room for them. ``server``: the actor's
    class, ``_PlacedServer`` or another with its ``placed`` and ``start`` (a replica: run/replica_server.py).
    """
    import ray

    options = {k: v for k, v in (options or {}).items() if v is not None and v != {}}
    cpus = options.get("num_cpus")
    env = _runtime_env()
    actor = ray.remote(server).options(**options, **({"runtime_env": env} if env else {})).remote(
        load, threads=max(1, int(cpus)) if cpus else None)
    _PLACED[actor] = (actor.placed.remote(), options)  # queued first: answers once the actor runs
    actor.start.remote()
    return actor


def _asked(options: dict[str, Any]) -> dict[str, float]:
    """The resources an actor with these options needs to be placed (Ray's names)."""
    cpus = options.get("num_cpus")
    asked = {"CPU": 1 if cpus is None else cpus, "GPU": options.get("num_gpus", 0), **options.get("resources", {})}
    return {k: v for k, v in asked.items() if v}


def _resources(amounts: dict[str, float], keys) -> str:
    return ", ".join(f"{k} {amounts.get(k, 0):g}" for k in keys) or "no resources"


def wait_placed(actors: dict[str, Any], timeout_s: float, what: str = "member") -> None:
    """Wait until Ray has placed every launched actor (member label -> actor); after ``timeout_s``
    seconds, kill them all and raise one line naming the first member (or ``what``) left waiting, what
    it asked for and what the cluster has."""
    import ray

    waiting = {label: _PLACED.pop(actor) for label, actor in actors.items() if actor in _PLACED}
    refs = [ref for ref, _ in waiting.values()]
    _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    if not pending:
        return
    label, (_, options) = next((label, item) for label, item in waiting.items() if item[0] in pending)
    for actor in actors.values():
        ray.kill(actor)
    asked = _asked(options)
    keys = list(dict.fromkeys(["CPU", "GPU", *asked]))
    raise UserError(f"Ray could not place {what} '{label}' within {timeout_s:g} s: it asks for "
                    f"{_resources(asked, asked)}; the cluster has {_resources(ray.cluster_resources(), keys)} "
                    f"({_resources(ray.available_resources(), keys)} free): lower its num_gpus / num_cpus / "
                    "resources, add nodes, or raise placement.schedule_timeout_s")


class RemoteMember(TokenizerSide, Member):
    """The driver side: the Member interface over a ``MemberServer`` actor.

    ``load`` / ``options``: as for ``launch``; or ``actor``, one that ``launch`` started. Call
    ``connect`` first (or ``ray.init``). Waits until the model is loaded.
    """

    capabilities = ALL_CAPABILITIES

    remote = True  # decoding/concurrent.py: steps of remote members overlap
    device = torch.device("cpu")  # where the log-probs it returns live (the actor's own: remote_device)

    def __init__(self, load: dict[str, Any], options: dict[str, Any] | None = None, actor=None):
        import ray

        self.actor = actor if actor is not None else launch(load, options)
        try:
            info = ray.get(self.actor.describe.remote())
        except ray.exceptions.RayError as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise UserError(f"cannot start a Ray actor for model '{load.get('model')}': {first}") from None
        if "error" in info:
            ray.kill(self.actor)
            raise UserError(info["error"])
        self.tokenizer = info["tokenizer"]
        self.vocab = info["vocab"]
        self.stop_ids = info["stop_ids"]
        self.max_length = info["max_length"]
        self.prefix_token_id = info["prefix_token_id"]
        self._bos_text = info["bos_text"]
        self.name = info["name"]
        self.uses_chat_template = info["uses_chat_template"]
        self.remote_device = info["device"]  # as the actor sees it
        self.clock = ForwardClock()
        self._remote_clock = info["clock"]
        self._pending: list = []
        self._embeddings: torch.Tensor | None = None
        self.traffic = {"step_calls": 0, "step_bytes": 0, "rows_returned": 0}
        self.batch = RowBatch(self.vocab.size, self.device)  # mirrors the actor's ids and distributions

    # --- plumbing ---------------------------------------------------------------------------
    def _wait(self, ref):
        """The result of ``ref``; also raises any error of the calls sent without waiting."""
        import ray

        pending, self._pending = self._pending, []
        return ray.get([*pending, ref])[-1]

    def _tick(self, clock: tuple[float, float, int, int]) -> None:
        old, self._remote_clock = self._remote_clock, clock
        self.clock.prefill_seconds += clock[0] - old[0]
        self.clock.decode_seconds += clock[1] - old[1]
        self.clock.prefill_calls += clock[2] - old[2]
        self.clock.decode_calls += clock[3] - old[3]

    def _apply(self, tokens: Sequence[Sequence[int]], changed: np.ndarray) -> torch.Tensor:
        active = self.batch.take(tokens)
        self.batch.set_last(active, _tensor(changed))
        self._count(changed.nbytes, len(active))
        return self.batch.last

    def _count(self, nbytes: int, rows: int) -> None:
        self.traffic["step_calls"] += 1
        self.traffic["step_bytes"] += nbytes
        self.traffic["rows_returned"] += rows

    @staticmethod
    def _plain(rows: Sequence[Sequence[int]]) -> list[list[int]]:
        return [[int(t) for t in row] for row in rows]

    # --- batched, KV-cached stepping --------------------------------------------------------
    def prefill(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        rows = self._plain(rows)
        changed, clock = self._wait(self.actor.prefill.remote(rows))
        self.batch.start(len(rows))
        self._tick(clock)
        return self._apply(rows, changed)

    def extend(self, tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        self.batch.check(tokens)
        if not any(tokens):
            return self.batch.last
        tokens = self._plain(tokens)
        changed, clock = self._wait(self.actor.extend.remote(tokens))
        self._tick(clock)
        return self._apply(tokens, changed)

    def extend_scored(self, tokens: Sequence[Sequence[int]]) -> tuple[torch.Tensor, list[list[float]]]:
        self.batch.check(tokens)
        if not any(tokens):
            return self.batch.last, [[] for _ in tokens]
        tokens = self._plain(tokens)
        changed, scored, clock = self._wait(self.actor.extend_scored.remote(tokens))
        self._tick(clock)
        return self._apply(tokens, changed), scored

    def read_block(self, tokens: Sequence[Sequence[int]], at: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """One actor call; each row that gets tokens also asks for the distribution after its last
        one (unless ``at`` names it already), which the mirrored batch keeps as ``last``."""
        at = self.batch.check_block(tokens, at)
        if not any(tokens):
            return self.batch.blocks(None, [], [])
        tokens = self._plain(tokens)
        asked = [wanted + [len(row) - 1] if row and wanted[-1:] != [len(row) - 1] else wanted
                 for row, wanted in zip(tokens, at)]
        arrays, clock = self._wait(self.actor.read_block.remote(tokens, asked))
        self._tick(clock)
        active = self.batch.take(tokens)
        blocks = [_tensor(array) for array in arrays]
        self.batch.set_last(active, torch.stack([blocks[r][-1] for r in active]))
        self._count(sum(array.nbytes for array in arrays), sum(len(array) for array in arrays))
        return [block[:len(wanted)] for block, wanted in zip(blocks, at)]

    @property
    def reads_trees(self) -> bool:
        """Whether the actor's member reads token trees (asked once)."""
        if not hasattr(self, "_reads_trees"):
            self._reads_trees = self._wait(self.actor.reads_trees.remote())
        return self._reads_trees

    def read_tree(self, tokens: Sequence[Sequence[int]], parents: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """One actor call; the rows are left as they were (nothing to mirror)."""
        self.batch.check(tokens)
        arrays, clock = self._wait(self.actor.read_tree.remote(self._plain(tokens), self._plain(parents)))
        self._tick(clock)
        self._count(sum(array.nbytes for array in arrays), sum(len(array) for array in arrays))
        return [_tensor(array) for array in arrays]

    def crop(self, lengths: Sequence[int]) -> None:
        lengths = [int(n) for n in lengths]
        self.batch.crop(lengths)
        self._pending.append(self.actor.crop.remote(lengths))

    def keep(self, rows: Sequence[int]) -> None:
        rows = [int(r) for r in rows]
        self.batch.keep(rows)
        self._pending.append(self.actor.keep.remote(rows))

    def row_ids(self) -> list[list[int]]:
        return self.batch.row_ids()

    def remote_row_ids(self) -> list[list[int]]:
        """The actor's own view (tests: it must equal ``row_ids``)."""
        return self._wait(self.actor.row_ids.remote())

    def input_embeddings(self) -> torch.Tensor:
        if self._embeddings is None:
            self._embeddings = self._wait(self.actor.input_embeddings.remote())
        return self._embeddings

    def output_embeddings(self) -> torch.Tensor:
        return self._wait(self.actor.output_embeddings.remote())

    # --- scoring --------------------------------------------------------------------------------
    def score(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int = 8) -> list[Score]:
        """Pairs are fitted to the window here, so ``contexts_truncated`` counts them in the driver
        (the actor's member then has nothing to cut)."""
        plain = [(self._plain([ctx])[0], self._plain([cont])[0]) for ctx, cont in self.fit_pairs(pairs)]
        return self._wait(self.actor.score.remote(plain, batch_size))

    def close(self) -> None:
        import ray

        ray.kill(self.actor)


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A float32 tensor of its own from an array in Ray's read-only buffer (one copy: ``RowBatch.last``
    is replaced, never written in place)."""
    return torch.from_numpy(np.array(array, dtype=np.float32, copy=True))
