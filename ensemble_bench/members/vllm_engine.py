"""An in-process vLLM engine that decodes in its own thread while ensbench chooses every token.

vLLM runs its own decode loop (``LLMEngine.step`` in a thread of its own, ``EngineThread``). Every
steered row meets its member at each step: a row with no tokens queued publishes its next-token
log-probs (a float32 tensor on the engine's device) and the step waits until the member answers with
the tokens to append; the step forces the first of them (every other logit set to -inf). The engine
is built with vLLM's speculative decoding and an n-gram proposer that ``DraftedSteps`` replaces: the
rest of a row's queued tokens (up to ``num_speculative_tokens``) are the next step's drafts, computed
in one forward pass and forced there, so a block read or a several-token extend is one step. Drafts
the member crops while the row waits are rejected in that step. ``DraftedSteps`` meets the model
runner's sampling; an engine it cannot meet (tensor parallel) takes a v1 logits processor
(``ForcingProcessor``) and one forced token per step. ``Steering`` is the meeting point: a condition
variable shared by the member's thread and the engine thread.

A row the engine cannot advance in place (cropped past its undecided drafts, or new) is finished and
submitted again with its whole prefix as the prompt; prefix caching gives back every full KV block
it held. Such a row's block is read in the one step that computes the prompt: the log-probs after
every block token (``PromptReader``: the step's hidden states at those positions through the model's
own output head), not only after the last.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

EXTRA_KEY = "ensbench_steer"  # SamplingParams.extra_args key: (steering id, row key)
STEERINGS: dict[str, Steering] = {}  # steering id -> Steering (the processor finds its member here)
# One engine step at a time in this process: two vLLM CPU engines computing at once corrupted the heap
# (a SweetSpan run aborted with "corrupted double-linked list"). A step waiting for its member lets go.
# Engines in other processes (each member's own Ray actor under placement ray) step side by side.
STEPPING = threading.Lock()
COST_DECAY = 0.9  # StepCosts: the weight of a member's earlier calls against its latest
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
    in_prompt: tuple = ()          # one-pass block read: positions before the prompt's last token, counted back
                                   # from it, whose next-token log-probs the step computing the prompt keeps
    chunks: deque = field(default_factory=deque)  # the queue's tokens each later step takes (drafted steps)
    drafts: int = 0                # queued tokens the next step takes as drafts after the one just forced
    undecided: list = field(default_factory=list)  # the drafts of the step it waits in: still rejectable
    rejected: int = 0              # how many of those the member cropped: the step rejects them


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
        self.reader: PromptReader | None = None  # one-pass block reads (None: one forced step per token)
        STEERINGS[self.id] = self

    def wait(self, ready) -> None:
        """Block the member's thread until ``ready()`` (under the lock); an engine error is raised here."""
        self.cond.wait_for(lambda: self.error is not None or self.closed or ready())
        if self.error is not None:
            raise RuntimeError(f"the vLLM engine thread failed: {self.error}") from self.error

    def steer(self, logits: torch.Tensor, rows: list[tuple[int, str, Sequence[int]]]) -> torch.Tensor:
        """The engine thread's side of one step (logits: float32 [positions, V]; rows: each request's
        batch index, key and logits positions: one, or its drafts' and the one after them). A row that
        publishes keeps its step's drafts undecided: the member may crop the last ``rejected`` of them,
        and its next token is then forced where the first of those was (vLLM's rejection sampler takes
        the drafts before it, rejects that one and gives the forced token instead)."""
        forced: dict[int, int] = {}
        with self.cond:
            held = [(i, positions, self.rows.get(key)) for i, key, positions in rows]
            for i, positions, row in held:
                for position in positions[:-1]:  # drafted: the row's queued tokens, forced as they were drafted
                    forced[position] = self._next_token(row, logits[position], drafted=True)
                if row is not None and not row.dropped and not row.queue:
                    if row.in_prompt:
                        row.captured.extend(self.reader.log_probs(i, row.in_prompt))
                        row.in_prompt = ()
                    row.dist = torch.log_softmax(logits[positions[-1]], dim=-1)
                    row.waiting = True
                    row.undecided = [forced[p] for p in positions[:-1]]
            waits = any(row is not None and row.waiting for _, _, row in held)
        if waits:
            STEPPING.release()  # other engines may step while this one waits for its member
            with self.cond:
                self.cond.notify_all()
                self.cond.wait_for(lambda: self.closed or not any(r is not None and r.waiting for _, _, r in held))
            STEPPING.acquire()
        with self.cond:
            for _, positions, row in held:
                answered = positions[-1 - row.rejected] if row is not None else positions[-1]
                for position in positions[positions.index(answered) + 1:]:  # rejected: vLLM reads no further
                    forced.pop(position, None)
                forced[answered] = self._next_token(row, logits[answered])
                if row is not None:
                    row.undecided, row.rejected = [], 0
        index = torch.tensor(list(forced), dtype=torch.long, device=logits.device)
        tokens = torch.tensor(list(forced.values()), dtype=torch.long, device=logits.device)
        logits[index] = float("-inf")
        logits[index, tokens] = 0.0
        return logits

    def drafts(self, key: str | None) -> list[int]:
        """The tokens the row ``key`` gives its next step as drafts (its queue's next chunk after the
        token just forced; vLLM verifies them in that step and the steering forces each)."""
        row = self.rows.get(key) if key is not None else None
        if row is None or row.dropped:
            return []
        return list(itertools.islice(row.queue, row.drafts))

    @staticmethod
    def _next_token(row: SteeredRow | None, logits: torch.Tensor, drafted: bool = False) -> int:
        """The row's next queued token; after the call's first one, ``logits`` follow the call's token
        ``row.index``: its log-probs are kept when wanted, the forced token's log-prob when scoring. A
        token not ``drafted`` starts the next chunk: the rest of it is the next step's drafts."""
        if row is None or row.dropped or not row.queue:
            return 0  # a row on its way out: its token is never read
        token = row.queue.popleft()
        if not drafted:
            row.drafts = row.chunks.popleft() - 1 if row.chunks else 0
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
                logits = STEERINGS[steering].steer(logits, [(index, key, [index]) for index, key in rows])
        return logits


class PromptReader:
    """Next-token log-probs at a prompt's positions before its last, read in the engine step that
    computes the prompt. vLLM samples (and its logits processors see) only a request's last position;
    a forward hook keeps the step's hidden states, the model runner's ``query_start_loc`` (where each
    batch row's tokens start in this step) finds the row's positions among them, and the model's own
    ``compute_logits`` (the sampled position's output head, scaling and all) turns them into logits."""

    def __init__(self, runner):
        self.runner = runner
        self.hidden: torch.Tensor | None = None
        self.padded: list[int] = []  # this step's -1 drafts after each request's tokens (DraftedSteps)
        runner.model.register_forward_hook(self._keep)

    def _keep(self, module, args, output) -> None:
        self.hidden = output if isinstance(output, torch.Tensor) else None

    def log_probs(self, row: int, back: Sequence[int]) -> torch.Tensor:
        """float32 log-softmax [len(back), V] after the tokens ``back[j]`` positions before batch row
        ``row``'s last token in this step."""
        padded = self.padded[row] if row < len(self.padded) else 0
        first = int(self.runner.query_start_loc.np[row])
        last = int(self.runner.query_start_loc.np[row + 1]) - 1 - padded
        if last - max(back) < first:  # the member asks vLLM not to read the cache where it could serve them
            raise RuntimeError(f"prompt positions {back} before the last were not computed in this step")
        index = torch.tensor([last - b for b in back], dtype=torch.long, device=self.hidden.device)
        logits = self.runner.model.compute_logits(self.hidden.index_select(0, index))
        return torch.log_softmax(logits.float(), dim=-1)

    @classmethod
    def attach(cls, engine) -> PromptReader | None:
        """A reader on ``engine``'s model, or None where the engine does not expose what it reads (its
        worker in another process, CUDA graphs around the model, another vLLM's runner, speculative
        decoding): block reads then take one forced engine step per token."""
        in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        if not in_process or engine.vllm_config.parallel_config.world_size != 1:
            return None
        [runner] = engine.collective_rpc(_model_runner)
        readable = (isinstance(getattr(runner, "model", None), torch.nn.Module)
                    and callable(getattr(runner.model, "compute_logits", None))
                    and hasattr(getattr(runner, "query_start_loc", None), "np"))
        return cls(runner) if readable else None


class DraftedSteps:
    """Several forced tokens of a row in one engine step, through vLLM's speculative decoding: the
    engine is built with an n-gram proposer whose ``propose`` this replaces (each steered row's drafts
    are its next queued tokens, ``Steering.drafts``), and the model runner's ``_sample`` meets the
    steering first, with every position the step computed for a row (its drafts' and the one after
    them). The steering forces every draft (so vLLM's rejection sampler accepts it) and the token after
    them, as the logits processor forces one token a step where the engine has no proposer."""

    def __init__(self, runner, steering: Steering):
        self.runner, self.steering = runner, steering
        self.max_drafts = runner.speculative_config.num_speculative_tokens
        self._sample = runner._sample
        runner._sample = self.sample
        runner.drafter.propose = self.propose

    def _key(self, request_id: str) -> str | None:
        steer = (self.runner.requests[request_id].sampling_params.extra_args or {}).get(EXTRA_KEY)
        return steer[1] if steer and steer[0] == self.steering.id else None

    def sample(self, logits: torch.Tensor, spec_decode_metadata):
        if self.steering.reader is not None:
            self.steering.reader.padded = []
        if spec_decode_metadata is None:
            spans = [[i] for i in range(logits.shape[0])]
        else:  # a request's positions: its drafts', then the one after them (vLLM pads some with -1: not ours)
            drafts = spec_decode_metadata.draft_token_ids.tolist()
            counts = spec_decode_metadata.num_draft_tokens
            real = [real_drafts(drafts[end - n:end]) for end, n in zip(itertools.accumulate(counts), counts)]
            spans = [list(range(bonus - n, bonus - n + r + 1))
                     for bonus, n, r in zip(spec_decode_metadata.bonus_logits_indices.tolist(), counts, real)]
            if self.steering.reader is not None:
                self.steering.reader.padded = [n - r for n, r in zip(counts, real)]
        request_ids = self.runner.input_batch.req_ids[:len(spans)]
        rows = [(i, key, spans[i]) for i, request_id in enumerate(request_ids)
                if (key := self._key(request_id)) is not None]
        if rows:
            logits = self.steering.steer(logits, rows)
        return self._sample(logits, spec_decode_metadata)

    def propose(self, num_speculative_tokens, sampled_token_ids, *args, **kwargs) -> list[list[int]]:
        request_ids = self.runner.input_batch.req_ids[:len(sampled_token_ids)]
        with self.steering.cond:
            return [self.steering.drafts(self._key(request_id)) if sampled else []
                    for request_id, sampled in zip(request_ids, sampled_token_ids)]

    @classmethod
    def attach(cls, engine, steering: Steering) -> DraftedSteps | None:
        """Drafted steps on ``engine`` (in this process, built by ``engine_arguments`` with its n-gram
        proposer), or None: one forced token per step, through the logits processor."""
        if engine.vllm_config.speculative_config is None or os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
            return None
        [runner] = engine.collective_rpc(_model_runner)
        return cls(runner, steering)


class StepCosts:
    """What a member's call costs: f seconds per engine step plus c per token the steps compute, fitted
    by least squares over its calls (each call weighing COST_DECAY times the one after it). Until calls
    of two shapes are seen, c is 0: a step costs the same whatever it computes (as on a GPU, where a
    step is memory-bound). On a CPU a step that computes a prompt is compute-bound: c counts."""

    def __init__(self):
        self.sums = [0.0] * 5  # sum of s*s, s*t, t*t, s*y, t*y over (steps s, tokens t, seconds y)

    def observe(self, steps: int, tokens: int, seconds: float) -> None:
        terms = (steps * steps, steps * tokens, tokens * tokens, steps * seconds, tokens * seconds)
        self.sums = [COST_DECAY * total + term for total, term in zip(self.sums, terms)]

    def of(self, steps: int, tokens: int) -> float:
        per_step, per_token = self.fitted()
        return per_step * steps + per_token * tokens

    def fitted(self) -> tuple[float, float]:
        """(f, c): the least-squares line through the calls seen, never negative."""
        ss, st, tt, sy, ty = self.sums
        det = ss * tt - st * st
        if det <= 1e-6 * ss * tt:  # one shape of call (or none) so far: no per-token cost to tell apart
            return (sy / ss if ss else 0.0), 0.0
        per_step, per_token = (sy * tt - ty * st) / det, (ty * ss - sy * st) / det
        if per_token < 0 or per_step < 0:
            return (sy / ss, 0.0) if per_token < 0 else (0.0, ty / tt)
        return per_step, per_token


class ComputedBlocks:
    """The full KV blocks an engine may hold in its prefix cache: every full block of every token
    sequence a request computed, keyed as a prefix cache keys them (a block's tokens after the key of
    the blocks before it). vLLM evicts blocks, so this may say more than the cache holds, never less:
    ``served`` bounds how many of a prompt's leading tokens a step may take from the cache instead
    of computing them."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.keys: set[int] = set()

    def _chain(self, ids: Sequence[int]):
        key = 0
        for start in range(0, len(ids) - self.block_size + 1, self.block_size):
            key = hash((key, tuple(ids[start:start + self.block_size])))
            yield key

    def add(self, ids: Sequence[int]) -> None:
        self.keys.update(self._chain(ids))

    def served(self, prompt: Sequence[int]) -> int:
        """The most prompt tokens the cache may serve (vLLM computes at least the last one)."""
        served = 0
        for key in self._chain(prompt[:-1]):
            if key not in self.keys:
                break
            served += self.block_size
        return served


def real_drafts(drafts: Sequence[int]) -> int:
    """How many of a request's drafts are tokens: vLLM pads a new request that computes one token with
    -1 drafts (for CUDA graphs of one shape); the rejection sampler rejects the first of those."""
    return next((k for k, token in enumerate(drafts) if token < 0), len(drafts))


def _model_runner(worker):
    """collective_rpc's call on the engine's worker: its model runner (in this process)."""
    return worker.model_runner


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
