"""GaC's weighted average over the union vocabulary (GaC Eq. 3, weights as in Sec. 4.3), as
batched tensor operations on the members' own devices.

    q(u) = sum_i w_i * P_i(u) / sum_i w_i,   P_i(u) = sum of p_i(t) over the ids t of member i
                                             that map to union entry u (duplicates add)

``full`` computes q over every union entry. ``greedy`` finds argmax_u q(u) exactly without it
most of the time: only entries holding one of some member's top-k ids (the candidates) can beat
the bound

    B = sum_i w_i * d_i * p_i^(k) / sum_i w_i

on every other entry, where p_i^(k) is member i's k-th largest probability and d_i the most ids
of member i that share one entry. A row whose best candidate exceeds B is decided; the other
rows fall back to ``full``. The candidates' q is computed with the same float operations in the
same order as ``full``, so both paths choose the same entry (ties: the lowest union index).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ensemble_bench.vocab.fast_topk import block_topk
from ensemble_bench.vocab.union import MemberMap, UnionVocab

BOUND_MARGIN = 1e-4  # relative: a decided row's best candidate beats the bound by more than rounding


@dataclass(frozen=True)
class MemberTables:
    """One member's M^i as lookup tables on one device."""

    src_ids: torch.Tensor    # [n] ids that map somewhere (for the full scatter-add)
    union_ids: torch.Tensor  # [n] their union entries
    to_union: torch.Tensor   # [V_i] union entry of each id, -1 for none
    entry_ids: torch.Tensor  # [U, d_i] the member's ids of each entry, ascending, -1 padded

    @property
    def width(self) -> int:
        return self.entry_ids.shape[1]


def member_tables(mapping: MemberMap, vocab_size: int, union_size: int) -> MemberTables:
    to_union = torch.full((vocab_size,), -1, dtype=torch.long)
    to_union[mapping.src_ids] = mapping.union_ids
    order = torch.argsort(mapping.union_ids * vocab_size + mapping.src_ids)  # by entry, then id
    entries, ids = mapping.union_ids[order], mapping.src_ids[order]
    counts = torch.bincount(entries, minlength=union_size)
    width = max(1, int(counts.max())) if len(entries) else 1
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(entries)) - starts[entries]  # rank of each id inside its entry
    entry_ids = torch.full((union_size, width), -1, dtype=torch.long)
    entry_ids[entries, slot] = ids
    return MemberTables(mapping.src_ids, mapping.union_ids, to_union, entry_ids)


class UnionMixture:
    """Eq. 3 for a fixed set of members and weights; tables are copied to each device once."""

    def __init__(self, union: UnionVocab, weights: Sequence[float], vocab_sizes: Sequence[int], top_k: int = 8):
        if top_k < 2:
            raise ValueError("the bound needs top_k >= 2")
        self.union = union
        self.weights = torch.tensor(list(weights), dtype=torch.float32)
        self.top_k = top_k
        self._cpu = [member_tables(m, v, union.size) for m, v in zip(union.maps, vocab_sizes)]
        self._placed: dict[tuple[int, str], MemberTables] = {}
        self.rows_decided = 0  # rows whose argmax the bound decided (no full projection)
        self.rows_total = 0

    def _tables(self, index: int, device: torch.device) -> MemberTables:
        key = (index, str(device))
        if key not in self._placed:
            cpu = self._cpu[index]
            self._placed[key] = MemberTables(*(t.to(device) for t in (cpu.src_ids, cpu.union_ids, cpu.to_union,
                                                                       cpu.entry_ids)))
        return self._placed[key]

    def full(self, logprobs: Sequence[torch.Tensor]) -> torch.Tensor:
        """q over every union entry [rows, U], on the first member's device (Eq. 3)."""
        device = logprobs[0].device
        mixed = torch.zeros((logprobs[0].shape[0], self.union.size), dtype=torch.float32, device=device)
        for index, (lp, weight) in enumerate(zip(logprobs, self.weights)):
            tables = self._tables(index, lp.device)
            projected = torch.zeros((lp.shape[0], self.union.size), dtype=torch.float32, device=lp.device)
            projected.index_add_(1, tables.union_ids, lp.exp()[:, tables.src_ids])  # p^i M^i
            mixed += weight * projected.to(device)
        mixed /= self.weights.sum()
        return mixed

    def greedy(self, logprobs: Sequence[torch.Tensor]) -> list[int]:
        """argmax_u q(u) per row, exactly (see the module docstring)."""
        device = logprobs[0].device
        tops = [block_topk(lp, min(self.top_k, lp.shape[-1])) for lp in logprobs]
        candidates = torch.cat([self._tables(i, lp.device).to_union[top_ids].to(device)
                                for i, (lp, (_, top_ids)) in enumerate(zip(logprobs, tops))], dim=1)
        entries = candidates.clamp(min=0)
        mixed = torch.zeros(candidates.shape, dtype=torch.float32, device=device)
        bound = torch.zeros(candidates.shape[0], dtype=torch.float32, device=device)
        for index, (lp, (top_values, _), weight) in enumerate(zip(logprobs, tops, self.weights)):
            tables = self._tables(index, lp.device)
            mixed += weight * self._entry_mass(lp, tables, entries.to(lp.device)).to(device)
            bound += weight * tables.width * top_values[:, -1].exp().to(device)
        mixed /= self.weights.sum()
        bound /= self.weights.sum()
        mixed = mixed.masked_fill(candidates < 0, -1.0)
        best = mixed.max(dim=1).values
        chosen = torch.where(mixed == best[:, None], entries, self.union.size).min(dim=1).values
        decided = best > bound * (1 + BOUND_MARGIN)
        undecided = (~decided).nonzero().flatten()
        if len(undecided):
            rest = self.full([lp.index_select(0, undecided.to(lp.device)) for lp in logprobs]).argmax(dim=-1)
            chosen = chosen.index_copy(0, undecided, rest)
        self.rows_total += len(chosen)
        self.rows_decided += len(chosen) - len(undecided)
        return chosen.tolist()

    @staticmethod
    def _entry_mass(logprobs: torch.Tensor, tables: MemberTables, entries: torch.Tensor) -> torch.Tensor:
        """P_i(u) for each row's candidate entries [rows, C]: the member's ids of each entry,
        added in ascending id order from zero, as the full scatter-add adds them."""
        ids = tables.entry_ids[entries]  # [rows, C, d_i]
        probs = logprobs.gather(1, ids.clamp(min=0).flatten(1)).view(ids.shape).exp()
        mass = torch.zeros(entries.shape, dtype=torch.float32, device=logprobs.device)
        for slot in range(tables.width):
            mass = mass + torch.where(ids[..., slot] >= 0, probs[..., slot], 0.0)
        return mass
