"""``single``: one member alone, greedy. The baseline every ensemble is compared with, and the
reference for parity with lm-eval's own HFLM."""

from __future__ import annotations

from collections.abc import Sequence

from ensemble_bench.members import Member, Score
from ensemble_bench.methods.base import (Generation, GenerationRequest, LoglikelihoodRequest, Method,
                                         fit_prompt)
from ensemble_bench.methods.stopping import StopRule, cut_at_until


class Single(Method):
    name = "single"
    max_members = 1

    @property
    def member(self) -> Member:
        return self.members[0]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        prompts = [self.member.render(r.prompt) for r in requests]
        return self._in_batches(requests, [len(p) for p in prompts], lambda batch: self._generate_batch(
            [prompts[i] for i in batch], [requests[i] for i in batch]))

    def _generate_batch(self, prompts, requests) -> list[Generation]:
        member = self.member
        rules = [StopRule(r.until, r.max_new_tokens, member.stop_ids) for r in requests]
        rows = [fit_prompt(member, p, r.max_new_tokens) for p, r in zip(prompts, requests)]
        tokens: list[list[int]] = [[] for _ in requests]
        finish: list[str | None] = [None] * len(requests)
        live = list(range(len(requests)))  # request index of each batch row
        self.timing.start_batch()
        logprobs = member.prefill(rows)
        first = True
        while live:
            picks = logprobs.argmax(dim=-1).tolist()
            for row, i in enumerate(live):
                token = picks[row]
                if token not in member.stop_ids:
                    tokens[i].append(token)
                finish[i] = rules[i].finish(token, member.decode(tokens[i]), len(tokens[i]))
            self.timing.tokens_generated += len(live)
            self.timing.first_token() if first else self.timing.step()
            first = False
            still = [row for row, i in enumerate(live) if finish[i] is None]
            if len(still) < len(live):
                member.keep(still)
                live = [live[row] for row in still]
            if live:
                logprobs = member.extend([[tokens[i][-1]] for i in live])
        return [Generation(cut_at_until(member.decode(t), r.until), len(t), f)
                for t, r, f in zip(tokens, requests, finish)]

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Score]:
        member = self.member
        pairs = [member.encode_pair(member.render_text(r.prompt), r.continuation) for r in requests]
        return member.score(pairs, batch_size=self.batch_size)

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        totals = []
        for text in texts:
            scores = self.member.score(self.member.rolling_pairs(text), batch_size=self.batch_size)
            totals.append(sum(s.logprob for s in scores))
        return totals
