"""DeePEn — "Ensemble Learning for Heterogeneous Large Language Models with Deep Parallel
Collaboration" (shared/papers/003_*.txt).

Set-up (Sec. 3.2): anchors are the tokens every member has (by bytes); each member's relative
representation R^ = row-softmax of cosine similarities of its input embeddings to the anchors'
(Eq. 2, 4), computed on demand (vocab/relative.py).
Each step: every member's distribution goes to the relative space, r_i = p_i R^_i, restricted
to its ``support`` most probable tokens (exact with ``support: null``); the weighted average
r = sum_i alpha_i r_i (Eq. 5) with Avg or Adapt weights (Sec. 3.5); then ``steps`` gradient steps
of KL(r || p R^_main) on the main model's probabilities of its ``support`` tokens, from its own
(Eq. 6-7, learning rate ``eta``); the main model emits the argmax.

Scoring a continuation token adds it to the main model's search set; its probability is its
share of the updated (clamped at 0) probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import Field, model_validator

from ensemble_bench.errors import UserError
from ensemble_bench.members.base import Member
from ensemble_bench.methods.base import normalised_weights
from ensemble_bench.methods.token_level import EmitterMethod, EmitterParams, Step, log_or_floor
from ensemble_bench.vocab.relative import RelativeSpace, anchor_ids, inverse_transform


class DeepenParams(EmitterParams):
    main: int | str = 0   # the member that emits (the paper: the best on the dev set)
    weights: Literal["average", "adapt"] | list[float] = "average"  # Avg, Adapt (Sec. 3.5) or explicit
    scores: list[float] | None = None  # dev-set accuracy per member, for Adapt
    chance: float = Field(default=0.0, ge=0.0, lt=1.0)  # epsilon of Adapt: 0 free-form, 1/K for K choices
    eta: float = Field(default=0.15, gt=0.0)  # relative ensemble learning rate (Eq. 7)
    steps: int = Field(default=5, ge=0, le=100)  # relative ensemble learning steps T
    support: int | None = Field(default=256, ge=1)  # top tokens per member carried; null = every token

    @model_validator(mode="after")
    def _consistent(self):
        if self.weights == "adapt" and self.scores is None:
            raise ValueError("weights 'adapt' needs 'scores' (dev-set accuracy per member)")
        return self


def resolve_deepen_weights(params: DeepenParams, count: int) -> list[float]:
    """alpha_i: 1/N (Avg), (s_i - eps) / sum_j (s_j - eps) (Adapt), or explicit values."""
    if params.weights == "average":
        return [1.0 / count] * count
    if params.weights == "adapt":
        scores = params.scores or []
        if len(scores) != count:
            raise UserError(f"method.scores: expected {count} values (one per member), got {len(scores)}")
        above = [s - params.chance for s in scores]
        if any(a < 0 for a in above) or sum(above) <= 0:
            raise UserError(f"method.scores: every score must be >= chance ({params.chance}) with some above it")
        return normalised_weights(above, count)
    return normalised_weights(params.weights, count)


class Deepen(EmitterMethod):
    name = "deepen"
    Params = DeepenParams
    emitter_field = "main"

    def __init__(self, members: Sequence[Member], params: DeepenParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        self.weights = resolve_deepen_weights(params, len(members))
        anchors = anchor_ids([m.vocab for m in members])
        if not anchors[0]:
            raise UserError("deepen: the members share no tokens, so there are no anchors")
        self.spaces = [RelativeSpace(m.input_embeddings(), ids) for m, ids in zip(members, anchors)]
        self.valid = [self._valid_ids(m) for m in members]
        self.support_rows = 0
        self.support_total = 0

    @classmethod
    def check_members(cls, params: DeepenParams, labels: Sequence[str]) -> None:
        super().check_members(params, labels)
        resolve_deepen_weights(params, len(labels))

    @staticmethod
    def _valid_ids(member: Member) -> torch.Tensor:
        """Ids with text or a stop meaning (padded head rows and placeholders carry nothing)."""
        ids = set(member.vocab.text_ids()) | set(member.stop_ids)
        mask = torch.zeros(member.vocab.size, dtype=torch.bool)
        mask[sorted(ids)] = True
        return mask

    def _support(self, index: int, probs: torch.Tensor) -> torch.Tensor:
        """The member's most probable valid ids (all valid ids when ``support`` is null)."""
        valid = self.valid[index]
        if valid.device != probs.device:  # the member's log-probs stay on its device
            valid = self.valid[index] = valid.to(probs.device)
        if self.params.support is None or self.params.support >= int(valid.sum()):
            return valid.nonzero().flatten()
        masked = probs.masked_fill(~valid, -1.0)
        return masked.topk(self.params.support).indices

    def _step(self, logprobs: list[torch.Tensor], targets: list[int] | None) -> Step:
        probs = [lp.exp() for lp in logprobs]
        choices, scored = [], []
        rows = probs[0].shape[0]
        supports_by_row = [[self._support(i, p[row]) for i, p in enumerate(probs)] for row in range(rows)]
        for index, space in enumerate(self.spaces):  # one matmul for the rows missing from the cache
            space.warm(torch.cat([supports[index] for supports in supports_by_row]).unique())
        main_space = self.spaces[self.emitter]
        for row, supports in enumerate(supports_by_row):
            held = [space.rows(ids) if space.fits(len(ids) + 1) else None for space, ids in zip(self.spaces, supports)]
            relative = [space.represent(p[row][ids], ids, rows)  # r_i = p_i R^_i (Sec. 3.3)
                        for space, p, ids, rows in zip(self.spaces, probs, supports, held)]
            target = sum(w * r for w, r in zip(self.weights, relative))  # Eq. 5
            search, search_rows = supports[self.emitter], held[self.emitter]
            if targets is not None and not bool((search == targets[row]).any()):
                extra = torch.tensor([targets[row]], device=search.device)
                search = torch.cat([search, extra])
                search_rows = None if search_rows is None else torch.cat([search_rows, main_space.rows(extra)])
            updated = inverse_transform(probs[self.emitter][row][search], search, main_space,  # Eq. 6-7
                                        target, self.params.eta, self.params.steps, search_rows)
            updated = updated.to(search.device)
            choices.append(int(search[int(updated.argmax())]))
            if targets is None:
                self.support_rows += 1
                self.support_total += sum(len(s) for s in supports)
            else:
                kept = updated.clamp(min=0)
                share = float(kept[search == targets[row]].sum() / kept.sum()) if kept.sum() > 0 else 0.0
                scored.append(log_or_floor(share))
        return Step(choices, scored if targets is not None else None)

    def info(self) -> dict:
        return {**super().info(), "weights_resolved": self.weights, "anchors": self.spaces[0].size,
                "tokens_manipulated_per_step": self.spaces[0].size,
                "support_rows_per_step": self.support_total / self.support_rows if self.support_rows else None}
