"""DeePEn — "Ensemble Learning for Heterogeneous Large Language Models with Deep Parallel
Collaboration" (arXiv 2404.12715).

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

Greedy steps are first decided by bounds (vocab/relative.py ``bounded_choice``): only the
``HEAD`` most probable tokens' rows of R^ are read, every other row is bounded from its
embedding; rows left undecided try again with ``WIDE_HEAD`` exact rows; rows neither decides,
and scoring, run the exact transform. The greedy support comes from the top of the log-probs
where that is provably the top of the probabilities, so no step exponentiates the whole vocabulary;
that top-k reads only the vocabulary blocks that can hold it (``candidate_topk``), not a partial sort
of every row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ensemble_bench.decoding.fused import checked_fusion
from ensemble_bench.decoding.sampling import Sampler, draw_rows, rows_of, sampling_rows
from ensemble_bench.decoding.stats import spread
from ensemble_bench.errors import UserError
from ensemble_bench.members.base import EMBEDDINGS, Member, require
from ensemble_bench.methods.deepen_params import DeepenParams, DeepenSpec, resolve_deepen_weights
from ensemble_bench.methods.token_level import EmitterMethod, EmitterReport, Step, log_or_floor
from ensemble_bench.vocab.relative import (
    MemberSlice,
    RelativeSpace,
    Scratch,
    anchor_ids,
    bounded_choice,
    inverse_transform,
)

HEAD = 4  # support tokens per member whose rows of R^ the bounds read exactly
WIDE_HEAD = 16  # the same for the rows the first bounds leave undecided, before the exact transform
SEPARATED = 1e-6  # log-probs this far apart have distinct float32 exps (exp is within 1 ulp, 1.2e-7 relative)
CANDIDATE_BLOCK = 32  # columns per block in candidate_topk
NORMAL_LOG = -87.0  # above log(2^-126): the exp is a normal float32, with its relative rounding


def candidate_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values, indices, complete) of the ``k`` largest entries of each row of ``x`` [rows, size],
    sorted, without a partial sort of whole rows. With t the k-th largest maximum of the blocks of
    CANDIDATE_BLOCK columns, every entry above t lies in the k blocks of largest maxima, which hold
    at least k entries >= t: those entries (and the columns after the last whole block) are gathered,
    padded, into a [rows, most] block whose top-k is taken. Indices may differ from ``torch.topk``'s
    only between equal values; ``complete`` is False in rows holding a NaN (``torch.topk`` ranks it
    first)."""
    rows, size = x.shape
    whole = size // CANDIDATE_BLOCK
    if whole < 4 * k:  # few blocks: the plain top-k is as cheap
        top = x.topk(k, dim=-1)
        return top.values, top.indices, torch.ones(rows, dtype=torch.bool, device=x.device)
    blocks = x[:, :whole * CANDIDATE_BLOCK].reshape(rows, whole, CANDIDATE_BLOCK)
    maxima, chosen = blocks.amax(dim=-1).topk(k, dim=-1, sorted=False)
    threshold = maxima.amin(dim=-1, keepdim=True)  # NaN where a block holds a NaN: nothing is gathered
    values = blocks.gather(1, chosen[:, :, None].expand(-1, -1, CANDIDATE_BLOCK)).flatten(1)
    rest = x[:, whole * CANDIDATE_BLOCK:]
    if rest.shape[1]:
        values = torch.cat([values, rest], dim=1)
    row, place = (values >= threshold).nonzero(as_tuple=True)
    block = place // CANDIDATE_BLOCK  # the gathered entries' columns in x (k means the columns after the blocks)
    column = torch.where(block < k, chosen[row, block.clamp(max=k - 1)] * CANDIDATE_BLOCK + place % CANDIDATE_BLOCK,
                         place + (whole - k) * CANDIDATE_BLOCK)
    counts = torch.bincount(row, minlength=rows)
    slot = torch.arange(len(row), device=x.device) - (counts.cumsum(0) - counts)[row]  # place within its row
    width = max(k, int(counts.max()))
    kept = torch.full((rows, width), float("-inf"), device=x.device)
    kept[row, slot] = values[row, place]
    kept_columns = torch.zeros((rows, width), dtype=torch.long, device=x.device)
    kept_columns[row, slot] = column
    top = kept.topk(k, dim=-1)
    return top.values, kept_columns.gather(1, top.indices), (counts >= k) & ~rest.isnan().any(dim=-1)


@dataclass
class DeepenStats:
    support_rows: int = 0  # rows whose greedy support was read (generation steps x rows)
    support_total: int = 0  # summed support sizes over those rows and members
    bound_rows: int = 0  # rows the interval bounds were tried on
    bound_decided: int = 0  # ... and decided without the exact transform

    def summary(self) -> dict:
        return {"support_rows_per_step": self.support_total / self.support_rows if self.support_rows else None,
                "bound_decided_fraction": self.bound_decided / self.bound_rows if self.bound_rows else None}


@dataclass(frozen=True, kw_only=True)
class DeepenReport(EmitterReport):
    weights_resolved: list[float]
    anchors: int                      # the relative space's size (the common tokens)
    tokens_manipulated_per_step: int  # the anchors, every step
    steps: dict = spread()            # DeepenStats.summary(): the inverse transform's steps and bounds


class Deepen(DeepenSpec, EmitterMethod):

    def __init__(self, members: Sequence[Member], params: DeepenParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        self.weights = resolve_deepen_weights(params, len(members))
        require(members, EMBEDDINGS, "deepen (its relative representations)")
        anchors = anchor_ids([m.vocab for m in members])
        if not anchors[0]:
            raise UserError("deepen: the members share no tokens, so there are no anchors")
        self.spaces = [RelativeSpace(m.input_embeddings(), ids) for m, ids in zip(members, anchors)]
        self.valid = [self._valid_ids(m) for m in members]
        self.scratch = Scratch()
        self.invalid_biases: dict[int, torch.Tensor] = {}
        self.stats = DeepenStats()

    @staticmethod
    def _valid_ids(member: Member) -> torch.Tensor:
        """Ids with text or a stop meaning (padded head rows and placeholders carry nothing)."""
        ids = set(member.vocab.text_ids()) | set(member.stop_ids)
        mask = torch.zeros(member.vocab.size, dtype=torch.bool)
        mask[sorted(ids)] = True
        return mask

    def _support_size(self, index: int, device: torch.device) -> tuple[torch.Tensor, int, int]:
        """(the valid-id mask on ``device``, how many ids are valid, how many the support holds)."""
        valid = self.valid[index]
        if valid.device != device:  # the member's log-probs stay on its device
            valid = self.valid[index] = valid.to(device)
        count = int(valid.sum())
        return valid, count, count if self.params.support is None else min(self.params.support, count)

    def _supports(self, index: int, probs: torch.Tensor) -> torch.Tensor:
        """Per row, the member's ``support`` most probable valid ids (every valid id when
        ``support`` is null), most probable first: [B, n]."""
        valid, _, size = self._support_size(index, probs.device)
        return probs.masked_fill(~valid, -1.0).topk(size, dim=-1).indices

    def _invalid_bias(self, index: int, valid: torch.Tensor) -> torch.Tensor:
        """[V]: 0 at valid ids, -inf elsewhere (added into a reused buffer: a masked copy of the
        log-probs would take fresh pages every step)."""
        bias = self.invalid_biases.get(index)
        if bias is None or bias.device != valid.device:
            bias = self.invalid_biases[index] = torch.zeros(valid.shape, device=valid.device).masked_fill_(
                ~valid, float("-inf"))
        return bias

    def _supports_from_logprobs(self, index: int, logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``_supports`` of exp(logprobs) and those probabilities ([B, n] each), without the exp of
        the whole vocabulary: the top of the log-probs, where it is provably the top of the
        probabilities (every kept exp a normal float and every neighbour SEPARATED: the order and
        the set are then unique). Other rows (ties, subnormal probabilities) take the exp of the row."""
        valid, count, size = self._support_size(index, logprobs.device)
        if logprobs.dtype != torch.float32:
            probs = logprobs.exp()
            ids = self._supports(index, probs)
            return ids, probs.gather(1, ids)
        masked = self.scratch.take(f"masked{index}", logprobs)
        torch.add(logprobs, self._invalid_bias(index, valid), out=masked)
        values, ids, complete = candidate_topk(masked, min(size + 1, count))
        unique = ((values[:, :-1] - values[:, 1:]) > SEPARATED).all(-1) & (values[:, size - 1] > NORMAL_LOG)
        unique &= complete
        ids, probs = ids[:, :size].contiguous(), values[:, :size].exp()
        tied = (~unique).nonzero()[:, 0]
        if len(tied):
            row_probs = logprobs[tied].exp()
            ids[tied] = self._supports(index, row_probs)
            probs[tied] = row_probs.gather(1, ids[tied])
        return ids, probs

    def _slice(self, index: int, probs: torch.Tensor, ids: torch.Tensor, head_size: int) -> MemberSlice:
        """The member's support ``ids`` with their ``probs`` ([B, n] each) split for ``bounded_choice``:
        head rows exact, tail bounded."""
        space = self.spaces[index]
        device = space.anchors.device
        head, tail = ids[:, :head_size].to(device), ids[:, head_size:].to(device)
        rows = space.held_rows(head.flatten(), f"head{head_size}").view(*head.shape, space.size)
        probs = probs.float().to(device)  # aligned with ids
        return MemberSlice(head, probs[:, :head_size], rows, probs[:, head_size:],
                           space.entry_low[tail], space.entry_high[tail])

    def _bounded(self, probs: list[torch.Tensor], supports: list[torch.Tensor]) -> list[int | None]:
        """The rows the bounds decide: the emitted id, else None. Rows the ``HEAD`` exact rows leave
        undecided try again with ``WIDE_HEAD`` (a tighter interval on the support's tail)."""
        chosen, decided = self._bounded_tier(probs, supports, HEAD)
        undecided = (~decided).nonzero()[:, 0]
        if len(undecided) and supports[self.lead].shape[1] > HEAD:
            wide = [s.index_select(0, undecided.to(s.device)) for s in supports]
            wide_chosen, wide_decided = self._bounded_tier([p[undecided.to(p.device)] for p in probs], wide,
                                                           WIDE_HEAD)
            chosen[undecided], decided[undecided] = wide_chosen, wide_decided
        self.stats.bound_rows += len(chosen)
        self.stats.bound_decided += int(decided.sum())
        return [c if d else None for c, d in zip(chosen.tolist(), decided.tolist())]

    def _bounded_tier(self, probs: list[torch.Tensor], supports: list[torch.Tensor], head_size: int):
        """``bounded_choice`` with ``head_size`` exact rows per member: (chosen id [B], decided [B])."""
        slices = [self._slice(i, p, ids, head_size) for i, (p, ids) in enumerate(zip(probs, supports))]
        winner, decided = bounded_choice(slices, self.weights, self.lead, self.params.eta, self.params.steps,
                                         self.scratch)
        return slices[self.lead].head_ids.gather(1, winner[:, None])[:, 0], decided

    def _step(self, logprobs: list[torch.Tensor], targets: list[int] | None, samplers=()) -> Step:
        count = logprobs[0].shape[0]
        choices: list[int | None] = [None] * count
        if targets is None:  # the bounds decide greedy rows; a row that samples needs the exact transform
            supports, support_probs = zip(*(self._supports_from_logprobs(i, lp) for i, lp in enumerate(logprobs)))
            greedy = sorted(set(range(count)) - set(sampling_rows(samplers)))
            if greedy:
                bounded = self._bounded([rows_of(p, greedy) for p in support_probs],
                                        [rows_of(s, greedy) for s in supports])
                for row, choice in zip(greedy, bounded):
                    choices[row] = choice
        rows = [row for row, choice in enumerate(choices) if choice is None]
        if targets is None:  # the undecided rows only (a copy of those rows, on their device)
            probs, supports = [lp[rows].exp() for lp in logprobs], [s[rows] for s in supports]
        else:
            probs = [lp.exp() for lp in logprobs]
            supports = [self._supports(i, p) for i, p in enumerate(probs)]
        drawing = [samplers[row] if samplers else None for row in rows]
        scored = []
        for row, (choice, share) in zip(rows, self._exact(probs, supports, targets, rows, drawing)):
            choices[row] = choice
            scored.append(share)
        if targets is None:
            self.stats.support_rows += len(choices)
            self.stats.support_total += len(choices) * sum(s.shape[1] for s in supports)
        return Step(choices, scored if targets is not None else None)

    def _exact(self, probs: list[torch.Tensor], supports: list[torch.Tensor], targets: list[int] | None,
               rows: list[int], samplers: list[Sampler | None]):
        """The dense transform on each row's support: (choice, log share of the target or None); ``rows``:
        the step's row of each (a NaN or infinite result stops the row: decoding/fused.py). A row that
        samples draws its token from the updated probabilities clamped at 0 (the shares scoring reads);
        the argmax when none is positive."""
        if not len(supports[0]):
            return
        for index, space in enumerate(self.spaces):  # one matmul for the rows missing from the cache
            space.warm(supports[index].flatten().unique())
        lead_space = self.spaces[self.lead]
        for row in range(len(supports[0])):
            ids_by_member = [s[row] for s in supports]
            held = [space.held_rows(ids, "support") if space.fits(len(ids) + 1) else None
                    for space, ids in zip(self.spaces, ids_by_member)]
            relative = [space.represent(p[row][ids], ids, rows)  # r_i = p_i R^_i (Sec. 3.3)
                        for space, p, ids, rows in zip(self.spaces, probs, ids_by_member, held)]
            target = sum(w * r for w, r in zip(self.weights, relative))  # Eq. 5
            search, search_rows = ids_by_member[self.lead], held[self.lead]
            if targets is not None and not bool((search == targets[row]).any()):
                extra = torch.tensor([targets[row]], device=search.device)
                search = torch.cat([search, extra])
                search_rows = None if search_rows is None else torch.cat([search_rows, lead_space.rows(extra)])
            updated = inverse_transform(probs[self.lead][row][search], search, lead_space,  # Eq. 6-7
                                        target, self.params.eta, self.params.steps, search_rows)
            updated = checked_fusion(updated.to(search.device)[None], [rows[row]])[0]
            kept = updated.clamp(min=0)
            drawn = samplers[row] is not None and not samplers[row].params.greedy and bool(kept.sum() > 0)
            choice = int(search[draw_rows(kept.log()[None], [samplers[row]])[0] if drawn else int(updated.argmax())])
            if targets is None:
                yield choice, None
            else:
                share = float(kept[search == targets[row]].sum() / kept.sum()) if kept.sum() > 0 else 0.0
                yield choice, log_or_floor(share)

    def statistics(self) -> DeepenReport:
        return DeepenReport(**vars(super().statistics()), weights_resolved=self.weights, anchors=self.spaces[0].size,
                            tokens_manipulated_per_step=self.spaces[0].size, steps=self.stats.summary())
