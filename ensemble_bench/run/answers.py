"""How the adapter answers one chunk of lm-eval requests of each kind (``ANSWERS``), with what it needs:
lm-eval's context strings as prompts (chat messages behind ``CHAT_MARK``), stop strings, the scoring clock;
and what progress counts (``tally``) and how a NaN score names its request (``located``).
The same code answers in one process (run/lm.py) and in each replica (run/replica_server.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from ensemble_bench.decoding.method import NonFiniteScore, check_finite
from ensemble_bench.decoding.sampling import RequestSampling
from ensemble_bench.members import Prompt
from ensemble_bench.members.rendered import chat_prompt
from ensemble_bench.methods import GenerationRequest, LoglikelihoodRequest

CHAT_MARK = "\u0000ensbench-chat\u0000"
DEFAULT_MAX_GEN_TOKS = 256
GENERATE = "generate_until"
ENSEMBLE, COMBINING = "the ensemble", "combining its members' scores"  # who and when, in NonFiniteScore


def to_prompt(context: str) -> Prompt:
    """An lm-eval context string -> Prompt (chat messages if it came from apply_chat_template)."""
    if context.startswith(CHAT_MARK):
        return chat_prompt(json.loads(context[len(CHAT_MARK):])["messages"])
    return Prompt(text=context)


def stop_strings(until) -> tuple[str, ...]:
    if until is None:
        return ()
    return (until,) if isinstance(until, str) else tuple(until)


@dataclass
class ScoringClock:
    """Time the method spends scoring continuations (multiple choice), per request and per token of
    the continuations (the first member's tokens), for the row's timing.json."""

    seconds: float = 0.0
    requests: int = 0
    tokens: int = 0

    def summary(self) -> dict:
        if not self.requests:
            return {}
        return {"loglikelihood_ms_per_request": 1000 * self.seconds / self.requests,
                "loglikelihood_ms_per_token": 1000 * self.seconds / self.tokens if self.tokens else None,
                "requests_scored": self.requests, "tokens_scored": self.tokens}


def _generate(lm, batch: list[tuple[tuple, RequestSampling | None]]) -> list[str]:
    """Each request is lm-eval's arguments (context, gen_kwargs) and what it draws with (None: greedy,
    else its own generator's seed: the same sample wherever it is drawn)."""
    requests = []
    for (context, gen_kwargs), drawn in batch:
        gen_kwargs = dict(gen_kwargs or {})
        requests.append(GenerationRequest(to_prompt(context), stop_strings(gen_kwargs.get("until")),
                                          int(gen_kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS)), drawn))
    return [g.text for g in lm.method.generate(requests)]


def _loglikelihood(lm, batch: list[tuple]) -> list[tuple[float, bool]]:
    requests = [LoglikelihoodRequest(to_prompt(context), continuation) for context, continuation in batch]
    started = time.perf_counter()
    scores = lm.method.loglikelihood(requests)
    lm.scoring.seconds += time.perf_counter() - started
    lm.scoring.requests += len(requests)
    lm.scoring.tokens += sum(len(lm.method.members[0].encode(r.continuation, add_special_tokens=False))
                             for r in requests)
    check_finite([s.logprob for s in scores], ENSEMBLE, COMBINING, [r.prompt for r in requests],
                 [r.continuation for r in requests])
    return [(s.logprob, s.is_greedy) for s in scores]


def _loglikelihood_rolling(lm, batch: list[tuple]) -> list[float]:
    texts = [args[0] for args in batch]
    totals = lm.method.loglikelihood_rolling(texts)
    check_finite(totals, ENSEMBLE, COMBINING, [Prompt(text=t) for t in texts], [None] * len(texts))
    return totals


# lm-eval's request kinds -> how the method answers a chunk of their arguments
ANSWERS = {GENERATE: _generate, "loglikelihood": _loglikelihood,
           "loglikelihood_rolling": _loglikelihood_rolling}


def tally(requests, indices) -> dict[str, int]:
    """The benchmark examples among ``requests[indices]`` per task (``""`` for requests without one),
    in the order the tasks come: what a progress report counts."""
    seen: dict[str, set] = {}
    for i in indices:
        task = getattr(requests[i], "task_name", None) or ""
        seen.setdefault(task, set()).add(getattr(requests[i], "doc_id", i))
    return {task: len(docs) for task, docs in seen.items()}


def located(err: NonFiniteScore, requests, chunk: list[int]) -> NonFiniteScore:
    """The fault naming lm-eval's request (its position, task and document) when its prompt and
    continuation single one out of the chunk, else as raised."""
    def matches(i: int) -> bool:
        args = requests[i].args
        same_continuation = err.continuation is None or (len(args) > 1 and args[1] == err.continuation)
        return err.prompt is not None and to_prompt(args[0]) == err.prompt and same_continuation

    found = [i for i in chunk if matches(i)] or (chunk if len(chunk) == 1 else [])
    if not found:
        return err
    request = requests[found[0]]
    task = getattr(request, "task_name", None)
    document = f" ({task}, document {request.doc_id})" if task is not None else ""
    return err.with_(where=f" {found[0] + 1} of {len(requests)}{document}")
