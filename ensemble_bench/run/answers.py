"""How the adapter answers one chunk of lm-eval requests of each kind (``ANSWERS``), with what it needs:
lm-eval's context strings as prompts (chat messages behind ``CHAT_MARK``), stop strings, the scoring clock.
The same code answers in one process (run/lm.py) and in each replica (run/replica_server.py).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from ensemble_bench.decoding.method import check_finite
from ensemble_bench.members import Prompt
from ensemble_bench.members.rendered import chat_prompt
from ensemble_bench.methods import GenerationRequest, LoglikelihoodRequest

CHAT_MARK = "\u0000ensbench-chat\u0000"
DEFAULT_MAX_GEN_TOKS = 256
ENSEMBLE, COMBINING = "the ensemble", "combining its members' scores"  # who and when, in NonFiniteScore
log = logging.getLogger(__name__)


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


def _generate(lm, batch: list[tuple]) -> list[str]:
    requests = []
    for context, gen_kwargs in batch:
        gen_kwargs = dict(gen_kwargs or {})
        if gen_kwargs.get("do_sample") or (gen_kwargs.get("temperature") or 0) > 0:
            log.warning("ensbench decodes greedily; ignoring sampling settings %s", gen_kwargs)
        requests.append(GenerationRequest(to_prompt(context), stop_strings(gen_kwargs.get("until")),
                                          int(gen_kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS))))
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
ANSWERS = {"generate_until": _generate, "loglikelihood": _loglikelihood,
           "loglikelihood_rolling": _loglikelihood_rolling}
