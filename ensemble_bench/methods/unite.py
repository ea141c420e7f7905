"""UniTE — "Determine-then-Ensemble: Necessity of Top-k Union for Large Language Model
Ensembling" (arXiv 2410.03777), Algorithm 1.

Each step: every member's top-k tokens; their union V^u by bytes; every member's probability for
every key of V^u by the three alignment rules (vocab/topk.py); a softmax over each member's
aligned set; the average; the lead (the paper's primary) member emits its token for the best key (its own token, or
its first sub-token of the key under rule 3). The other members take the same text.

Scoring a continuation token adds it to V^u for that step (so tokens outside every top-k still
get a probability); its probability is the ensemble's mass on the keys the lead would emit
as that token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from pydantic import Field

from ensemble_bench.decoding.fused import checked_fusion
from ensemble_bench.decoding.method import lead_field, normalised_weights
from ensemble_bench.decoding.sampling import decide, draw_rows
from ensemble_bench.decoding.stats import spread
from ensemble_bench.members.base import Member
from ensemble_bench.methods.core import CoreFusion, CoreParams
from ensemble_bench.methods.token_level import EmitterMethod, EmitterParams, EmitterReport, Step, log_or_floor
from ensemble_bench.vocab.fast_topk import block_topk
from ensemble_bench.vocab.topk import AlignmentTables, TopKAligner, average_rows


class UniteParams(EmitterParams, CoreParams):
    lead: int | str = lead_field(0, "the member that emits (the paper's primary: the best-performing one)",
                                 "primary")
    k: int = Field(default=10, ge=1, le=1000, description="top-k tokens per member (the paper: 10)")
    weights: list[float] | None = Field(default=None, description="per-member weights of the average "
                                        "(null or average: equal)")


@dataclass
class UniteStats:
    union_sizes: int = 0  # summed |V^u| over generation steps and rows (UniTE Table 5)
    union_rows: int = 0

    def per_step(self) -> float | None:
        return self.union_sizes / self.union_rows if self.union_rows else None


@dataclass(frozen=True, kw_only=True)
class UniteReport(EmitterReport):
    weights_resolved: list[float]
    tokens_manipulated_per_step: float | None  # Table 5: the size of the top-k union per step
    core: dict = spread()  # CoRE's counters (methods/core.py) when core: true


class Unite(EmitterMethod):
    name = "unite"
    Params = UniteParams

    def __init__(self, members: Sequence[Member], params: UniteParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        count = len(members)
        self.weights = [1.0 / count] * count if params.weights is None else normalised_weights(params.weights, count)
        self.aligners = [TopKAligner(m.vocab, m.stop_ids, appender.encode_bytes)
                         for m, appender in zip(members, self.appenders)]
        self.tables = AlignmentTables(self.aligners)
        self._stops: dict[tuple[int, str], torch.Tensor] = {}
        self.stats = UniteStats()
        self.core = CoreFusion.of(params, count)

    @classmethod
    def check_members(cls, params: UniteParams, labels: Sequence[str]) -> None:
        super().check_members(params, labels)
        if params.weights is not None:
            normalised_weights(params.weights, len(labels))

    def _step(self, logprobs: list[torch.Tensor], targets: list[int] | None, samplers=()) -> Step:
        """Algorithm 1 for every row at once: each member's top-k and best stop id on its device;
        V^u and rules 1-3 as table lookups on the lead's (vocab/topk.py, AlignmentTables); one
        gather per member of its aligned ids' probabilities; then the average and the choice on
        the host over the [rows, |V^u|] probabilities only (Alg. 1 lines 13-14). A row that samples
        draws its key from the average over the keys the lead can emit (docs/sampling.md)."""
        device = logprobs[self.lead].device
        tops = [block_topk(lp, min(self.params.k, lp.shape[-1])) for lp in logprobs]
        top_ids = [ids.to(device) for _, ids in tops]
        top_probs = [values.exp().float().to(device) for values, _ in tops]
        stops = [best_stop_ids(lp, self._stop_ids(i, lp.device)).to(device) for i, lp in enumerate(logprobs)]
        scored = None if targets is None else torch.tensor(targets, dtype=torch.long, device=device)
        plan = self.tables.plan(top_ids, top_probs, stops, scored, self.lead)  # Alg. 1 lines 4-12
        probs = torch.stack([aligned_probs(lp, ids).cpu().double() for lp, ids in zip(logprobs, plan.ids)])
        averaged = self._average(probs)  # Alg. 1 line 13
        checked_fusion(torch.from_numpy(averaged))  # a NaN or infinite fusion stops the row (decoding/fused.py)
        emitted = plan.ids[self.lead].cpu().numpy()
        if not (emitted >= 0).any(axis=1).all():
            raise ValueError("the lead member has no token for any key of V^u (its top-k has no text)")
        best = np.where(emitted >= 0, averaged, -np.inf).argmax(axis=1)  # Alg. 1 line 14: first key wins ties
        if samplers:  # a row that samples draws a key (among those the lead emits) from the average
            best = decide(samplers, lambda rows: best[rows].tolist(), lambda rows, drawing: draw_rows(
                torch.from_numpy(np.where(emitted[rows] >= 0, averaged[rows], 0.0)).log(), drawing))
        choices = emitted[np.arange(len(best)), best].tolist()
        if targets is None:
            self.stats.union_sizes += int(plan.first[:, :plan.top_width].sum())
            self.stats.union_rows += len(choices)
            return Step(choices, None)
        chosen_mass = np.where(emitted == np.asarray(targets)[:, None], averaged, 0.0)
        return Step(choices, [log_or_floor(mass) for mass in np.add.accumulate(chosen_mass, axis=1)[:, -1].tolist()])

    def _average(self, probs: torch.Tensor) -> np.ndarray:
        """Alg. 1 line 13 [rows, |V^u|]: the weighted average of each member's softmax over its
        aligned set, or CoRE's fusion of those (methods/core.py) with the weights as base weights."""
        if self.core is None:
            return average_rows(probs.numpy(), self.weights)
        mass = probs.sum(dim=-1, keepdim=True)
        shares = torch.where(mass > 0, probs / mass.clamp(min=1e-300), 0.0)
        return self.core.fuse(shares, torch.tensor(self.weights), self.lead).numpy()

    def _stop_ids(self, member: int, device: torch.device) -> torch.Tensor:
        """A member's stop ids, ascending, on ``device`` (made once)."""
        key = (member, str(device))
        if key not in self._stops:
            self._stops[key] = torch.tensor(sorted(self.aligners[member].stop_ids), dtype=torch.long, device=device)
        return self._stops[key]

    def statistics(self) -> UniteReport:
        return UniteReport(**vars(super().statistics()), weights_resolved=self.weights,
                           tokens_manipulated_per_step=self.stats.per_step(),
                           core=self.core.counters() if self.core else {})

    def carried(self) -> dict[str, object]:
        return {**super().carried(), **(self.core.carried() if self.core else {})}


def best_stop_ids(logprobs: torch.Tensor, stop_ids: torch.Tensor) -> torch.Tensor:
    """Each row's most probable stop id (the lowest on ties), -1 without stop ids; ``stop_ids``
    ascending, on the member's device."""
    if not len(stop_ids):
        return torch.full((logprobs.shape[0],), -1, dtype=torch.long, device=logprobs.device)
    return stop_ids.take(logprobs.index_select(1, stop_ids).argmax(dim=-1))


def aligned_probs(logprobs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[rows, columns] the member's probability of each aligned id (0 for -1), on its device."""
    ids = ids.to(logprobs.device)
    return torch.where(ids >= 0, logprobs.gather(1, ids.clamp(min=0)).exp(), 0.0)
