"""UniTE — "Determine-then-Ensemble: Necessity of Top-k Union for Large Language Model
Ensembling" (shared/papers/001_*.txt), Algorithm 1.

Each step: every member's top-k tokens; their union V^u by bytes; every member's probability for
every key of V^u by the three alignment rules (vocab/topk.py); a softmax over each member's
aligned set; the average; the primary member emits its token for the best key (its own token, or
its first sub-token of the key under rule 3). The other members take the same text.

Scoring a continuation token adds it to V^u for that step (so tokens outside every top-k still
get a probability); its probability is the ensemble's mass on the keys the primary would emit
as that token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import Field

from ensemble_bench.members.base import Member
from ensemble_bench.methods.base import normalised_weights
from ensemble_bench.methods.token_level import EmitterMethod, EmitterParams, Step, log_or_floor
from ensemble_bench.vocab.fast_topk import block_topk
from ensemble_bench.vocab.topk import Aligned, TopKAligner, average_aligned, member_topk, union_keys


class UniteParams(EmitterParams):
    primary: int | str = 0      # the member that emits (the paper: the best-performing one)
    k: int = Field(default=10, ge=1, le=1000)  # top-k per member (the paper: 10)
    weights: Literal["average"] | list[float] = "average"


class Unite(EmitterMethod):
    name = "unite"
    Params = UniteParams

    def __init__(self, members: Sequence[Member], params: UniteParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        count = len(members)
        self.weights = [1.0 / count] * count if params.weights == "average" else normalised_weights(params.weights, count)
        self.aligners = [TopKAligner(m.vocab, m.stop_ids, appender.encode_bytes)
                         for m, appender in zip(members, self.appenders)]
        self.union_sizes = 0  # summed |V^u| over generation steps and rows (UniTE Table 5)
        self.union_rows = 0

    @classmethod
    def check_members(cls, params: UniteParams, labels: Sequence[str]) -> None:
        super().check_members(params, labels)
        if params.weights != "average":
            normalised_weights(params.weights, len(labels))

    def _step(self, logprobs: list[torch.Tensor], targets: list[int] | None) -> Step:
        """Algorithm 1 for every row: top-k and stop ids in batched tensor ops on each member's
        device; keys and rules per row on the host; then one gather per member of the aligned ids'
        probabilities."""
        tops = [block_topk(lp, min(self.params.k, lp.shape[-1])) for lp in logprobs]
        top_ids = [ids.tolist() for _, ids in tops]
        top_probs = [values.exp().tolist() for values, _ in tops]
        best_stops = [best_stop_ids(lp, aligner.stop_ids) for lp, aligner in zip(logprobs, self.aligners)]
        plans = []  # per row: the union keys V^u and, per member, (id, rule) of each key
        for row in range(len(top_ids[0])):
            topks = [member_topk(a, ids[row], dict(zip(ids[row], probs[row])))
                     for a, ids, probs in zip(self.aligners, top_ids, top_probs)]
            keys = union_keys(topks)
            if targets is None:
                self.union_sizes += len(keys)
                self.union_rows += 1
            else:
                target_key = self.aligners[self.emitter].key(targets[row])
                if target_key is not None and target_key not in keys:
                    keys.append(target_key)
            plans.append((keys, [[a.aligned_token(key, topk, stops[row]) for key in keys]  # rules 1-3
                                 for a, topk, stops in zip(self.aligners, topks, best_stops)]))
        probs = [token_probs(lp, [tokens[index] for _, tokens in plans]) for index, lp in enumerate(logprobs)]
        choices, scored = [], []
        for row, (keys, tokens) in enumerate(plans):
            aligned = [[Aligned(token, prob, rule) for (token, rule), prob in zip(member_tokens, member_probs[row])]
                       for member_tokens, member_probs in zip(tokens, probs)]
            averaged = average_aligned(aligned, self.weights)  # Alg. 1 line 13
            emitted = aligned[self.emitter]
            choices.append(self._best(emitted, averaged))  # Alg. 1 line 14
            if targets is not None:
                mass = sum(v for a, v in zip(emitted, averaged) if a.token == targets[row])
                scored.append(log_or_floor(mass))
        return Step(choices, scored if targets is not None else None)

    @staticmethod
    def _best(emitted: list[Aligned], averaged: list[float]) -> int:
        """The primary's token for the most probable key it can emit (first key wins ties)."""
        best = max((j for j, a in enumerate(emitted) if a.token >= 0), key=lambda j: averaged[j])
        return emitted[best].token

    def info(self) -> dict:
        return {**super().info(), "weights_resolved": self.weights,
                "tokens_manipulated_per_step": self.union_sizes / self.union_rows if self.union_rows else None}


def best_stop_ids(logprobs: torch.Tensor, stop_ids: frozenset[int]) -> list[int | None]:
    """Each row's most probable stop id (the lowest on ties), or None without stop ids."""
    if not stop_ids:
        return [None] * logprobs.shape[0]
    ordered = sorted(stop_ids)
    best = logprobs[:, torch.tensor(ordered, device=logprobs.device)].argmax(dim=-1).tolist()
    return [ordered[k] for k in best]


def token_probs(logprobs: torch.Tensor, tokens: list[list[tuple[int, int]]]) -> list[list[float]]:
    """Per row, the probability of each (id, rule) in ``tokens[row]`` (0 for id -1): one gather."""
    rows = [row for row, row_tokens in enumerate(tokens) for token, _ in row_tokens if token >= 0]
    ids = [token for row_tokens in tokens for token, _ in row_tokens if token >= 0]
    index = torch.tensor([rows, ids], dtype=torch.long, device=logprobs.device)
    flat = iter(logprobs[index[0], index[1]].exp().tolist())
    return [[next(flat) if token >= 0 else 0.0 for token, _ in row_tokens] for row_tokens in tokens]
