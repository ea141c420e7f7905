"""EVA — "Bridging the Gap between Different Vocabularies for LLM Ensemble" (Xu, Lu and Zhang,
NAACL 2024, arXiv 2404.09492; code xydaytoy/EVA).

The lead is the paper's pivot model: by default the member with the largest vocabulary, as the
paper chooses it. Sec. 3.1: a map from each auxiliary member's vocabulary to the lead's, learned
from the tokens they share (vocab/eva_map.py; built once per pair and cached, vocab/eva_cache.py).
Sec. 3.2, each step: every member's distribution keeps its top-k tokens (softmax over them); the
auxiliary ones are projected into the lead's vocabulary (p M); the faithfulness filter leaves out a
member whose top token is in no other member's top-n; the rest are averaged, and the lead emits
the best token of the average. The other members take its bytes (token_level.py).

The step is two methods that a plug-in (CoRE) may wrap: ``project`` (each member's probabilities in
the lead's space) and ``fuse`` (filter and average).

Where the authors' code and the paper's text part, the code's rule is taken and said so in
docs/fidelity.md (the CSLS score without its source term, the top-k truncation); the code's
hard-coded special ids 0-2 (Llama-2's) are replaced by the members' own stop ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ensemble_bench.cache import cache_dir
from ensemble_bench.decoding.fused import checked_fusion
from ensemble_bench.decoding.sampling import decide_on
from ensemble_bench.decoding.stats import spread
from ensemble_bench.errors import UserError
from ensemble_bench.members.base import EMBEDDINGS, Member, require
from ensemble_bench.members.loading import Stage, tell_load
from ensemble_bench.methods.core import CoreFusion
from ensemble_bench.methods.eva_params import EvaParams, EvaSpec
from ensemble_bench.methods.token_level import EmitterMethod, EmitterReport, Step
from ensemble_bench.vocab.eva_cache import cached_projection
from ensemble_bench.vocab.eva_map import AlignParams, VocabProjection


def alignment(params: EvaParams) -> AlignParams:
    """The noise-reduction settings of the vocabulary map (vocab/eva_map.py) a recipe gives."""
    return AlignParams(params.top_t, params.threshold, params.variance, params.neighborhood, params.overlap)


@dataclass
class EvaStats:
    steps: int = 0
    filtered: int = 0          # member-steps left out by the filter
    all_kept_fallback: int = 0  # steps where the filter would have left no member

    def summary(self, members: int) -> dict:
        return {"eva_steps": self.steps, "eva_filtered_fraction": (
            self.filtered / (self.steps * members) if self.steps else None),
                "eva_no_faithful_member_steps": self.all_kept_fallback}


@dataclass(frozen=True)
class EvaReport(EmitterReport):
    eva_map_pairs: dict = field(default_factory=dict)    # member -> pairs of its map into the lead's vocabulary
    eva_seed_tokens: dict = field(default_factory=dict)  # member -> shared tokens the map was learned from
    filtering: dict = spread()                           # EvaStats.summary(): steps and members filtered out
    core: dict = spread()                                # CoRE's counters (methods/core.py) when core: true


class Eva(EvaSpec, EmitterMethod):

    def __init__(self, members: Sequence[Member], params: EvaParams, batch_size: int = 1):
        if params.lead is None:  # the paper's pivot: "the model with the largest vocabulary"
            sizes = [len(m.vocab.text_ids()) for m in members]
            params = params.model_copy(update={"lead": sizes.index(max(sizes))})
        super().__init__(members, params, batch_size)
        require(members, EMBEDDINGS, "eva (its vocabulary map)")
        self.projections: dict[int, VocabProjection] = {
            index: self._projection(index) for index in range(len(members)) if index != self.lead}
        self.stats = EvaStats()
        self.core = CoreFusion.of(params, len(members))

    def _projection(self, index: int) -> VocabProjection:
        """The map from member ``index`` into the lead's vocabulary: cached, or learned (first use), saying
        its stage and progress to the load listeners (the run's progress display)."""
        aux, lead = self.members[index], self.members[self.lead]
        learning = f"learning EVA's map {aux.name} -> {lead.name} (first use; cached after)"
        try:
            return cached_projection(aux.vocab, lead.vocab, sorted(aux.stop_ids), sorted(lead.stop_ids),
                                     aux.output_embeddings(), lead.output_embeddings(), alignment(self.params),
                                     cache_dir() / "eva", lambda stage, done: tell_load(
                                         aux.name, Stage(f"{learning}, {stage}", done)))
        except ValueError as err:
            raise UserError(f"eva: members '{aux.name}' and '{lead.name}': {err}") from None

    # --- the step, in two parts a plug-in may wrap ----------------------------------------------
    def project(self, logprobs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each member's top-k probabilities in the lead's vocabulary [rows, V_lead] (Sec. 3.2: the
        lead's own, the others' projected p M), on the lead's device, in float32."""
        device = logprobs[self.lead].device
        out = []
        for index, lp in enumerate(logprobs):
            probs = top_k_probs(lp.to(device).float(), self.params.top_k)
            out.append(probs if index == self.lead else self.projections[index].project(probs))
        return out

    def faithful_members(self, projected: list[torch.Tensor]) -> torch.Tensor:
        """[members, rows] the faithfulness filter keeps (Sec. 3.2); a row where it keeps none keeps
        all; counted for the statistics with CoRE or without."""
        kept = faithful(projected, self.params.n)
        none_kept = ~kept.any(dim=0)
        kept[:, none_kept] = True
        self.stats.steps += kept.shape[1]
        self.stats.filtered += int((~kept).sum())
        self.stats.all_kept_fallback += int(none_kept.sum())
        return kept

    def fuse(self, projected: list[torch.Tensor]) -> torch.Tensor:
        """The faithfulness filter, then the average of the members kept [rows, V_lead] (Sec. 3.2).
        Summed auxiliary members first and the lead last, as the authors' code does."""
        order = [i for i in range(len(projected)) if i != self.lead] + [self.lead]
        kept = self.faithful_members(projected)
        share = 1.0 / kept.sum(dim=0).to(torch.float32)
        fused = torch.zeros_like(projected[self.lead])
        for index in order:
            fused += torch.where(kept[index, :, None], share[:, None] * projected[index], 0.0)
        return fused

    def core_fuse(self, projected: list[torch.Tensor]) -> torch.Tensor:
        """CoRE (methods/core.py) on the projected members: the faithfulness filter's members as its base
        weights (a filtered member weighs 0), the lead unfiltered."""
        kept = self.faithful_members(projected)
        return self.core.fuse(torch.stack(projected), kept.T.float(), self.lead).float()

    def _step(self, logprobs: list[torch.Tensor], targets: list[int] | None, samplers=()) -> Step:
        projected = self.project(logprobs)
        fused = checked_fusion(self.fuse(projected) if self.core is None else self.core_fuse(projected))
        # the first of equal values, as torch.argmax in the authors' code; a row that samples draws from fused
        choices = decide_on(fused, samplers or [None] * len(fused), lambda kept: kept.argmax(dim=-1).tolist(),
                            probabilities=True)
        return Step(choices, None if targets is None else self.score(logprobs, targets))

    def score(self, logprobs: list[torch.Tensor], targets: list[int]) -> list[float]:
        """log P(target) per row when scoring a continuation: the target's share of the members' whole
        distributions averaged in the lead's vocabulary (the lead's own, the others' through the map, p M),
        in float64 and log space. Neither the paper nor the authors' code scores a continuation (they
        generate); the step's top-k cut and faithfulness filter would give a target outside every kept
        member's top-k probability 0, which ranks nothing, so they choose the greedy token only
        (``Step.choices``). The lead's own term keeps every score finite."""
        device = logprobs[self.lead].device
        rows = torch.arange(len(targets), device=device)
        wanted = torch.tensor(targets, device=device)
        shares, totals = [], []
        for index, lp in enumerate(logprobs):
            lp = lp.to(device).double()
            if index == self.lead:
                shares.append(lp[rows, wanted])
                totals.append(torch.ones(len(targets), dtype=torch.float64, device=device))
            else:
                projected = self.projections[index].project(lp.exp())
                shares.append(projected[rows, wanted].log())
                totals.append(projected.sum(dim=-1))
        return (torch.logsumexp(torch.stack(shares), dim=0) - torch.stack(totals).sum(dim=0).log()).tolist()

    def statistics(self) -> EvaReport:
        return EvaReport(**vars(super().statistics()),
                         eva_map_pairs={self.members[i].name: len(p.src) for i, p in self.projections.items()},
                         eva_seed_tokens={self.members[i].name: p.seeds for i, p in self.projections.items()},
                         filtering=self.stats.summary(len(self.members)),
                         core=self.core.counters() if self.core else {})

    def carried(self) -> dict[str, object]:
        return {**super().carried(), **(self.core.carried() if self.core else {})}


def top_k_probs(logprobs: torch.Tensor, k: int) -> torch.Tensor:
    """Softmax over each row's top-k values (ties with the k-th kept, as the authors' filter does)."""
    k = min(k, logprobs.shape[-1])
    kth = logprobs.topk(k, dim=-1).values[:, -1:]
    return torch.softmax(torch.where(logprobs >= kth, logprobs, -torch.inf), dim=-1)


def faithful(projected: list[torch.Tensor], n: int | None) -> torch.Tensor:
    """[members, rows] whether a member's top token is in the top-n of some other member (Sec. 3.2);
    all True without a filter or with one member."""
    count, rows = len(projected), projected[0].shape[0]
    if n is None or count < 2:
        return torch.ones((count, rows), dtype=torch.bool, device=projected[0].device)
    tops = [p.argmax(dim=-1) for p in projected]
    best = [p.topk(min(n, p.shape[-1]), dim=-1).indices for p in projected]
    return torch.stack([torch.stack([(best[o] == tops[m][:, None]).any(dim=-1) for o in range(count) if o != m])
                        .any(dim=0) for m in range(count)])
