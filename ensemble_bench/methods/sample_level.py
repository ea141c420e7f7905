"""Sample-level ensembles: every member answers alone (batched, as ``single``: greedy, or drawing from
its own distribution when the request samples), then one member's answer is chosen per request.
Members run one after another; latency is accounted as the sum of the members' decode time over their
mean number of steps (so ms/token is about the sum of the members' ms/token).

Multiple-choice requests (log-likelihood) are decided per question: the requests sharing one
prompt are the question's choices, each member picks its most likely choice, and the method
chooses among those picks. The chosen choice gets log-prob 0 and is the only greedy one; the
others get log(share of picks) (or -1e30 without picks), so both acc and acc_norm follow the
choice.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

from ensemble_bench.decoding.method import (
    Generation,
    GenerationRequest,
    LoglikelihoodRequest,
    Method,
    MethodParams,
    Timing,
    lead_field,
    resolve_member,
)
from ensemble_bench.decoding.stats import MethodStats, RunStats
from ensemble_bench.members.base import Member, Score
from ensemble_bench.methods.single import Single

NO_SHARE = -1e30


class SampleLevelParams(MethodParams):
    lead: int | str = lead_field(0, "whose answer wins ties (the paper's main model)", "main")


@dataclass
class SampleStats:
    scoring_seconds: float = 0.0  # a scorer's time choosing among the answers (rerank), counted as decode time


@dataclass(frozen=True, kw_only=True)
class SampleReport(MethodStats):
    lead_index: int  # the member whose answer wins ties


class SampleLevel(Method):
    min_members = 2
    samples = True  # each member samples its own answer (``own_draws``)
    lead_param = "lead"
    choice_scoring = "each member picks its most likely option and the most picked wins (ties: the lead's)"

    def __init__(self, members: Sequence[Member], params: SampleLevelParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        self.lead = resolve_member(params.lead, [m.name for m in members], params.lead_spelling)
        self.singles = [Single([m], MethodParams(), batch_size) for m in members]
        self.stats = SampleStats()

    @classmethod
    def check_members(cls, params: SampleLevelParams, labels: Sequence[str]) -> None:
        resolve_member(params.lead, labels, params.lead_spelling)

    @abstractmethod
    def _choose(self, texts: list[str], request: GenerationRequest) -> int:
        """Index of the member whose answer is kept."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Every member's answer (a request that samples: each member draws with a generator of its own),
        then the method's choice among them."""
        candidates = [single.generate([own_draws(r, k) for r in requests]) for k, single in enumerate(self.singles)]
        return [candidates[self._choose([c[i].text for c in candidates], r)][i] for i, r in enumerate(requests)]

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Score]:
        scores = [single.loglikelihood(requests) for single in self.singles]
        questions: dict = defaultdict(list)
        for i, request in enumerate(requests):
            questions[request.prompt].append(i)
        results: list[Score | None] = [None] * len(requests)
        for choices in questions.values():
            picks = [max(choices, key=lambda i, s=s: s[i].logprob) for s in scores]  # first wins ties
            winner = choose_by_vote(picks, self.lead)
            for i in choices:
                share = picks.count(i) / (len(picks) + 1)
                results[i] = Score(0.0, True) if i == winner else Score(math.log(share) if share else NO_SHARE, False)
        return results

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        return self.singles[self.lead].loglikelihood_rolling(texts)

    def carried(self) -> dict[str, object]:
        """The members' timings, of which the row's is made (``run_stats``), the scorer's time and the cuts."""
        return {"stats": self.stats, "truncations": self.counted_truncations(),
                **{f"timing{k}": single.timing for k, single in enumerate(self.singles)}}

    def run_stats(self) -> RunStats:
        self.timing = combined_timing([s.timing for s in self.singles], self.stats.scoring_seconds)
        return super().run_stats()

    def statistics(self) -> SampleReport:
        return SampleReport(lead_index=self.lead)


def own_draws(request: GenerationRequest, member: int) -> GenerationRequest:
    """The request as member ``member`` answers it: a request that samples draws from a generator of that
    member's own (its key salted), so that two members never share their uniform numbers."""
    if request.sampling is None:
        return request
    return replace(request, sampling=replace(request.sampling, key=f"{request.sampling.key}/member {member}"))


def choose_by_vote(keys: Sequence[Hashable], lead: int) -> Hashable:
    """The most frequent key; among tied keys the lead member's, else the first member's."""
    counts = {key: keys.count(key) for key in keys}
    top = max(counts.values())
    if counts[keys[lead]] == top:
        return keys[lead]
    return next(key for key in keys if counts[key] == top)


def combined_timing(timings: Sequence[Timing], choosing_seconds: float = 0.0) -> Timing:
    """Members run in turn: times add up (and the time choosing among their answers); steps are the members' mean."""
    total = Timing()
    total.first_token_seconds = sum(t.first_token_seconds for t in timings)
    total.decode_seconds = sum(t.decode_seconds for t in timings) + choosing_seconds
    total.decode_steps = round(sum(t.decode_steps for t in timings) / len(timings))
    total.batches = max(t.batches for t in timings)
    total.tokens_generated = sum(t.tokens_generated for t in timings)
    return total
