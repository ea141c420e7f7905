"""An in-process vLLM engine that decodes in its own thread while ensbench chooses every token.

vLLM runs its own decode loop (``LLMEngine.step`` in a thread of its own, ``EngineThread``). A v1
logits processor (``ForcingProcessor``, selected per request through ``SamplingParams.extra_args``)
meets every steered row at each step: a row with no tokens queued publishes its next-token log-probs
(a float32 tensor on the engine's device) and the step waits until the member answers with the
tokens to append; the processor then forces the first of them (every other logit set to -inf), and
the next ones at the following steps without asking again. ``Steering`` is the meeting point: a
condition variable shared by the member's thread and the engine thread.

A row the engine cannot advance by one forced token per step (a crop, a row that takes nothing this
step, a row whose tokens outnumber its batch's) is finished and submitted again with its whole prefix
as the prompt; prefix caching gives back every full KV block it held.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass, field

import torch

EXTRA_KEY = "ensbench_steer"  # SamplingParams.extra_args key: (steering id, row key)
STEERINGS: dict[str, Steering] = {}  # steering id -> Steering (the processor finds its member here)
# One engine step at a time in this process: two vLLM CPU engines computing at once corrupted the heap
# (a SweetSpan run aborted with "corrupted double-linked list"). A step waiting for its member lets go.
STEPPING = threading.Lock()
_ids = itertools.count()


@dataclass
class SteeredRow:
    """One vLLM request steered by the member: what to force next and what it published."""

    key: str
    queue: deque = field(default_factory=deque)  # tokens to force, one per engine step
    waiting: bool = False          # published its distribution; the step waits for its tokens
    dist: torch.Tensor | None = None  # the last distribution it published
    dropped: bool = False          # leaving: forced anything, then aborted after the step
    scoring: bool = False          # record log p of each forced token after the first of a call
    first: bool = True             # the next forced token is the first of its call
    scored: list = field(default_factory=list)
    wanted: frozenset = frozenset()  # block read: the call's token indices whose next-token log-probs it keeps
    captured: list = field(default_factory=list)  # those log-probs, in order (the published one not included)
    index: int = 0                 # the call's tokens forced and computed so far, after the first


@dataclass
class Command:
    kind: str            # "add", "abort", "score", "close"
    key: str = ""
    prompt: list = field(default_factory=list)
    at: int = 0          # run it once this many engine steps have completed (before the next one starts)
    params: object = None


class Steering:
    """The rows of one member's engine, and the commands for its engine thread."""

    def __init__(self):
        self.id = f"s{next(_ids)}"
        self.cond = threading.Condition()
        self.rows: dict[str, SteeredRow] = {}
        self.commands: list[Command] = []
        self.results: dict[str, object] = {}  # scoring requests by key: None until finished
        self.error: BaseException | None = None
        self.closed = False
        self.steps = 0  # engine steps completed (the index of the step in progress, or of the next one)
        STEERINGS[self.id] = self

    def wait(self, ready) -> None:
        """Block the member's thread until ``ready()`` (under the lock); an engine error is raised here."""
        self.cond.wait_for(lambda: self.error is not None or self.closed or ready())
        if self.error is not None:
            raise RuntimeError(f"the vLLM engine thread failed: {self.error}") from self.error

    def steer(self, logits: torch.Tensor, rows: list[tuple[int, str]]) -> torch.Tensor:
        """The engine thread's side of one step (logits: float32 [batch, V], rows: our batch indices)."""
        with self.cond:
            held = [(i, self.rows.get(key)) for i, key in rows]
            for i, row in held:
                if row is not None and not row.dropped and not row.queue:
                    row.dist = torch.log_softmax(logits[i], dim=-1)
                    row.waiting = True
            waits = any(row is not None and row.waiting for _, row in held)
        if waits:
            STEPPING.release()  # other engines may step while this one waits for its member
            with self.cond:
                self.cond.notify_all()
                self.cond.wait_for(lambda: self.closed or not any(r is not None and r.waiting for _, r in held))
            STEPPING.acquire()
        with self.cond:
            forced = [(i, self._next_token(row, logits[i])) for i, row in held]
        index = torch.tensor([i for i, _ in forced], dtype=torch.long, device=logits.device)
        tokens = torch.tensor([t for _, t in forced], dtype=torch.long, device=logits.device)
        logits[index] = float("-inf")
        logits[index, tokens] = 0.0
        return logits

    @staticmethod
    def _next_token(row: SteeredRow | None, logits: torch.Tensor) -> int:
        """The row's next queued token; after the call's first one, ``logits`` follow the call's token
        ``row.index``: its log-probs are kept when wanted, the forced token's log-prob when scoring."""
        if row is None or row.dropped or not row.queue:
            return 0  # a row on its way out: its token is never read
        token = row.queue.popleft()
        if not row.first and (row.scoring or row.index in row.wanted):
            logprobs = torch.log_softmax(logits, dim=-1)
            if row.index in row.wanted:
                row.captured.append(logprobs)
            if row.scoring:
                row.scored.append(float(logprobs[token]))
        row.index += not row.first
        row.first = False
        return token


class ForcingProcessor:
    """vLLM v1 logits processor: hands steered rows to their ``Steering``; leaves other rows alone.
    (Subclassed from vLLM's ``LogitsProcessor`` by ``processor_class`` when vLLM is imported.)"""

    def __init__(self, vllm_config, device, is_pin_memory):
        self.keys: dict[int, tuple[str, str]] = {}  # batch index -> (steering id, row key)

    def is_argmax_invariant(self) -> bool:
        return False  # forcing changes the argmax: greedy requests must pass through apply

    def update_state(self, batch_update) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.keys.pop(index, None)
        for index, params, _, _ in batch_update.added:
            steer = (getattr(params, "extra_args", None) or {}).get(EXTRA_KEY)
            if steer:
                self.keys[index] = tuple(steer)
            else:
                self.keys.pop(index, None)
        for first, second, direction in batch_update.moved:
            a, b = self.keys.pop(first, None), self.keys.pop(second, None)
            if a is not None:
                self.keys[second] = a
            if b is not None and direction.name == "SWAP":
                self.keys[first] = b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        by_steering: dict[str, list[tuple[int, str]]] = {}
        for index, (steering, key) in self.keys.items():
            if index < logits.shape[0]:
                by_steering.setdefault(steering, []).append((index, key))
        for steering, rows in by_steering.items():
            if steering in STEERINGS:
                logits = STEERINGS[steering].steer(logits, rows)
        return logits


def processor_class() -> type:
    """``ForcingProcessor`` as a subclass of vLLM's ``LogitsProcessor`` (vLLM checks the type)."""
    from vllm.v1.sample.logits_processor import LogitsProcessor

    return type("EnsbenchForcingProcessor", (ForcingProcessor, LogitsProcessor), {})


class EngineThread(threading.Thread):
    """Runs the engine's steps and the member's commands (between steps) until closed."""

    def __init__(self, engine, steering: Steering):
        super().__init__(name=f"vllm-{steering.id}", daemon=True)
        self.engine, self.steering = engine, steering
        self.steps = 0

    def run(self) -> None:
        steering = self.steering
        # OpenMP keeps a thread count per thread: this new thread starts at the process default (the cores,
        # or OMP_NUM_THREADS) until torch's first parallel call sets the count torch was given (--threads).
        # vLLM's CPU attention plans a step with the count it reads first and checks it again inside the
        # kernel ("thread_num == thread_num (2 vs. 1)"): asking torch first makes both read torch's.
        torch.get_num_threads()
        try:
            busy = False
            while True:
                with steering.cond:
                    if not busy:
                        steering.cond.wait_for(lambda: steering.commands or steering.closed)
                    if steering.closed:
                        return
                    due = self._due(busy)
                    steering.commands = [c for c in steering.commands if c not in due]
                for command in due:
                    self._run(command)
                busy = self.engine.has_unfinished_requests()
                if busy:
                    self._step()
                    busy = self.engine.has_unfinished_requests()
        except BaseException as err:  # noqa: BLE001 - handed to the member's thread, raised there
            with steering.cond:
                steering.error = err
                steering.cond.notify_all()

    def _due(self, busy: bool) -> list[Command]:
        """The commands to run before the next step (the lock is held): those whose step has come; on an
        idle engine the earliest ones, since no step will come before something runs."""
        commands = self.steering.commands
        due = [c for c in commands if c.at <= self.steering.steps]
        if not due and not busy and commands:
            first = min(c.at for c in commands)
            self.steering.steps = first  # an idle engine: the timeline moves to the first command
            due = [c for c in commands if c.at <= first]
        return due

    def _step(self) -> None:
        with STEPPING:
            outputs = self.engine.step()
        with self.steering.cond:
            self.steering.steps += 1
            for output in outputs:
                if output.finished and output.request_id in self.steering.results:  # a scoring request
                    self.steering.results[output.request_id] = output
            self.steering.cond.notify_all()

    def _run(self, command: Command) -> None:
        if command.kind == "abort":
            self.engine.abort_request([command.key])
        else:
            self.engine.add_request(command.key, {"prompt_token_ids": list(command.prompt)}, command.params)
