"""Token-level ensembles in which one member emits: UniTE's primary model, DeePEn's main model.

Each step every member gives its next-token distribution; the method's ``_step`` turns them into
a choice among the emitting member's own token ids. The emitter appends its token; every other
member takes the same bytes (methods/feeding.py). KV caches stay warm throughout. The text is the
emitter's own decode, so a member ensembled with itself renders exactly as alone.

Log-likelihood of a continuation (multiple-choice tasks) uses the same step, teacher-forced: the
continuation is tokenised by the emitter, and each of its tokens is scored by the ensemble's
probability of emitting it (``Step.target_logprobs``) while every member reads the continuation.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from pydantic import Field

from ensemble_bench.members import Member, Prompt, Score
from ensemble_bench.methods.base import (Generation, GenerationRequest, LoglikelihoodRequest, Method,
                                         MethodParams, fit_prompt, resolve_member)
from ensemble_bench.methods.concurrent import each
from ensemble_bench.methods.feeding import give_text, text_appender
from ensemble_bench.methods.stopping import StopRule, cut_at_until


class EmitterParams(MethodParams):
    window: int = Field(default=4, ge=0, le=64)  # look-behind tokens when re-tokenising new text


@dataclass(frozen=True)
class Step:
    """The outcome of one ensemble step for every live row."""

    choices: list[int]                    # the emitter's token id chosen per row
    target_logprobs: list[float] | None   # log P(target) per row when scoring, else None


def log_or_floor(value: float) -> float:
    return math.log(value) if value > 0 else -1e30


class EmitterMethod(Method):
    """Base of UniTE and DeePEn: subclasses implement ``_step`` and name their emitter."""

    min_members = 2
    emitter_field: str = "primary"

    def __init__(self, members: Sequence[Member], params: EmitterParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        self.emitter = resolve_member(getattr(params, self.emitter_field), [m.name for m in members],
                                      self.emitter_field)
        self.appenders = [text_appender(m, params.window) for m in members]

    @classmethod
    def check_members(cls, params: EmitterParams, labels: Sequence[str]) -> None:
        resolve_member(getattr(params, cls.emitter_field), labels, cls.emitter_field)

    @abstractmethod
    def _step(self, logprobs: list[torch.Tensor], targets: list[int] | None) -> Step:
        """Combine the members' log-probs [rows, V_i]; choose (and score ``targets``) per row."""

    # --- generation -----------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return self._generate_per_member(requests, self._generate_batch)

    def _generate_batch(self, prompts: list[list[list[int]]], requests: list[GenerationRequest]) -> list[Generation]:
        emitter = self.members[self.emitter]
        rules = [StopRule(r.until, r.max_new_tokens, emitter.stop_ids) for r in requests]
        tokens: list[list[int]] = [[] for _ in requests]
        finish: list[str | None] = [None] * len(requests)
        live = list(range(len(requests)))
        self.timing.start_batch()
        logprobs = self._prefill_all(prompts, requests)
        first = True
        while live:
            choices = self._step(logprobs, None).choices
            for k, i in enumerate(live):
                if choices[k] not in emitter.stop_ids:
                    tokens[i].append(choices[k])
                finish[i] = rules[i].finish(choices[k], emitter.decode(tokens[i]), len(tokens[i]))
            self.timing.tokens_generated += len(live)
            self.timing.first_token() if first else self.timing.step()
            first = False
            still = [k for k, i in enumerate(live) if finish[i] is None]
            logprobs, live = self._keep_rows(still, logprobs, live)
            if live:
                logprobs = self._feed([tokens[i][-1] for i in live])
        return [Generation(cut_at_until(emitter.decode(t), r.until), len(t), f)
                for t, r, f in zip(tokens, requests, finish)]

    def _feed(self, tokens: list[int]) -> list[torch.Tensor]:
        """The emitter appends its tokens; every other member takes their bytes."""
        pieces = self.members[self.emitter].vocab.pieces
        return each(self.members, lambda member, index: member.extend([[t] for t in tokens]) if index == self.emitter
                    else give_text(member, self.appenders[index], [[pieces[t] or b""] for t in tokens]),
                    range(len(self.members)))

    # --- scoring --------------------------------------------------------------------------------
    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Score]:
        pairs = [[m.encode_pair(m.render_text(r.prompt), r.continuation) for r in requests] for m in self.members]
        continuations = [cont for _, cont in pairs[self.emitter]]
        contexts = [[ctx for ctx, _ in member_pairs] for member_pairs in pairs]
        lengths = [len(contexts[self.emitter][i]) + len(continuations[i]) for i in range(len(requests))]
        return self._in_batches(requests, lengths, lambda batch: self._score_batch(
            [[c[i] for i in batch] for c in contexts], [continuations[i] for i in batch]))

    def _score_batch(self, contexts: list[list[list[int]]], continuations: list[list[int]]) -> list[Score]:
        totals = [0.0] * len(continuations)
        greedy = [True] * len(continuations)
        live = [i for i, c in enumerate(continuations) if c]
        if not live:
            return [Score(0.0, True) for _ in continuations]
        logprobs = each(self.members, lambda m, member_contexts: m.prefill(
            [fit_prompt(m, member_contexts[i], len(continuations[i])) for i in live]), contexts)
        position = 0
        while live:
            targets = [continuations[i][position] for i in live]
            step = self._step(logprobs, targets)
            for k, i in enumerate(live):
                totals[i] += step.target_logprobs[k]
                greedy[i] = greedy[i] and step.choices[k] == targets[k]
            position += 1
            still = [k for k, i in enumerate(live) if position < len(continuations[i])]
            logprobs, live = self._keep_rows(still, logprobs, live)
            if live:
                logprobs = self._feed([targets[k] for k in still])
        return [Score(t, g) for t, g in zip(totals, greedy)]

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        """Perplexity tasks: the whole text as one continuation of an empty context."""
        return [s.logprob for s in self.loglikelihood([LoglikelihoodRequest(Prompt(text=""), t) for t in texts])]

    def info(self) -> dict:
        return {**super().info(), "emitter_index": self.emitter}
