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

``full`` and the paths built on it (the greedy fallback, ``log_blocks``) are one exponential and one
gather per member straight into the union's layout: each entry takes its lowest id's probability
(a zero column stands in for the entries the member lacks), and the few entries holding several
ids of a member (duplicate byte strings) add the others slot by slot in ascending id order. On a
CPU the rows go in blocks whose working set stays in cache; on a GPU in one block. ``log_blocks``
gives log q block by block on q's device, for a draw (decoding/sampling.py ``draw_blocks``: each row
shaped by its own settings, then drawn by inverse transform sampling with one uniform number from
its own generator).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from ensemble_bench.vocab.fast_topk import block_argmax, block_topk
from ensemble_bench.vocab.union import MemberMap, UnionVocab

BOUND_MARGIN = 1e-4  # relative: a decided row's best candidate beats the bound by more than rounding
CPU_BLOCK_BYTES = 16 << 20  # the full projection's working set per block of rows on a CPU (cache-sized)
# Where only the argmax of q or a draw from it is needed, log-probabilities below this count as it:
# exp() of lower values (float32 underflow, subnormals) is 10-40x slower on a CPU. The argmax and
# its value stay the same bits: the largest weighted sum is at least w_i / V_i for every member
# (times the mass it maps), so it exceeds 2^-24 w_i, and raising one of its addends by at most
# w_i e^-80 (< 2^-115 w_i) rounds back to it; only entries far below the largest can change. A
# draw's distribution moves by less than U x e^-80 in all.
LOG_FLOOR = -80.0
MAX_BOUND_RESTS = 15  # the most ``greedy`` calls that skip the bound after it decided nothing


@dataclass(frozen=True)
class MemberTables:
    """One member's M^i as lookup tables on one device."""

    to_union: torch.Tensor   # [V_i] union entry of each id, -1 for none
    entry_ids: torch.Tensor  # [U, d_i] the member's ids of each entry, ascending, -1 padded
    first_ids: torch.Tensor  # [U] each entry's lowest id; V_i (a zero column) where it has none
    # per slot s >= 1: (the entries holding more than s ids, their (s+1)-th lowest id)
    extra: tuple[tuple[torch.Tensor, torch.Tensor], ...]

    @property
    def width(self) -> int:
        return self.entry_ids.shape[1]

    def to(self, device: torch.device) -> MemberTables:
        return MemberTables(self.to_union.to(device), self.entry_ids.to(device), self.first_ids.to(device),
                            tuple((e.to(device), i.to(device)) for e, i in self.extra))


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
    first_ids = torch.where(entry_ids[:, 0] >= 0, entry_ids[:, 0], vocab_size)
    extra = tuple(((entry_ids[:, s] >= 0).nonzero().flatten(), entry_ids[entry_ids[:, s] >= 0, s])
                  for s in range(1, width))
    return MemberTables(to_union, entry_ids, first_ids, extra)


def project(logprobs: torch.Tensor, tables: MemberTables, out: torch.Tensor | None = None,
            floor: float | None = None) -> torch.Tensor:
    """P_i = p^i M^i [rows, U] on the member's device (into ``out`` if given): the probabilities
    with a zero column appended, gathered into the union's layout; entries holding several ids
    then add the others in ascending id order, as ``_entry_mass`` and a scatter-add do. With a
    ``floor``, log-probabilities below it count as it (see LOG_FLOOR)."""
    rows, size = logprobs.shape
    probs = torch.empty((rows, size + 1), dtype=torch.float32, device=logprobs.device)
    probs[:, size] = 0.0
    if floor is None:
        torch.exp(logprobs, out=probs[:, :size])
    else:
        torch.clamp(logprobs, min=floor, out=probs[:, :size]).exp_()
    projected = torch.index_select(probs, 1, tables.first_ids, out=out)
    for entries, ids in tables.extra:
        projected[:, entries] += probs[:, ids]
    return projected


@dataclass
class BoundCounts:
    """Rows ``greedy`` chose, and those the bound decided (no full projection)."""

    rows_total: int = 0
    rows_decided: int = 0


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
        self.bound = BoundCounts()
        self._bound_misses = 0  # consecutive calls where the bound decided no row
        self._bound_rests = 0   # calls left that skip the bound

    def _tables(self, index: int, device: torch.device) -> MemberTables:
        key = (index, str(device))
        if key not in self._placed:
            self._placed[key] = self._cpu[index].to(device)
        return self._placed[key]

    def full(self, logprobs: Sequence[torch.Tensor]) -> torch.Tensor:
        """q over every union entry [rows, U], on the first member's device (Eq. 3)."""
        mixed = torch.empty((logprobs[0].shape[0], self.union.size), dtype=torch.float32, device=logprobs[0].device)
        for rows in self._blocks(logprobs):
            self._mix([lp[rows] for lp in logprobs], mixed[rows])
        return mixed

    def projections(self, logprobs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Every member's P_i over the union [N, rows, U], unweighted, on the first member's device
        (what a fusion of its own, such as CoRE's, reads)."""
        device = logprobs[0].device
        return torch.stack([project(lp, self._tables(index, lp.device), floor=LOG_FLOOR).to(device)
                            for index, lp in enumerate(logprobs)])

    def log_blocks(self, logprobs: Sequence[torch.Tensor]) -> Iterator[tuple[slice, torch.Tensor]]:
        """log q (Eq. 3) of every row, a block of rows at a time (``_blocks``; log-probabilities floored as
        the argmax path floors them): (the block's rows, their [rows, U] log q), what a draw reads."""
        for rows in self._blocks(logprobs):
            yield rows, self._mix([lp[rows] for lp in logprobs], floor=LOG_FLOOR).log_()

    def _argmax_full(self, logprobs: Sequence[torch.Tensor]) -> torch.Tensor:
        """argmax_u q(u) per row through the full projection (ties: the lowest union index)."""
        return torch.cat([block_argmax(self._mix([lp[rows] for lp in logprobs], floor=LOG_FLOOR))
                          for rows in self._blocks(logprobs)])

    def _mix(self, logprobs: Sequence[torch.Tensor], out: torch.Tensor | None = None,
             floor: float | None = None) -> torch.Tensor:
        """(w_1 P_1 + w_2 P_2 + ...) / sum_i w_i, each product rounded before it is added (Eq. 3)."""
        device = logprobs[0].device
        for index, (lp, weight) in enumerate(zip(logprobs, self.weights)):
            projected = project(lp, self._tables(index, lp.device), out if index == 0 else None, floor)
            if weight != 1.0:  # 1 x P is P exactly
                projected.mul_(weight)
            if index == 0:
                out = projected
            else:
                out.add_(projected.to(device))
        return out.div_(self.weights.sum())

    def _blocks(self, logprobs: Sequence[torch.Tensor]) -> list[slice]:
        """Row blocks for the full projection: all rows at once on a GPU; on a CPU as many as keep
        one block's tensors (log-probs, probabilities, projections) within CPU_BLOCK_BYTES."""
        rows = logprobs[0].shape[0]
        if any(lp.device.type != "cpu" for lp in logprobs):
            step = max(rows, 1)
        else:
            row_bytes = 4 * sum(2 * lp.shape[1] + 2 * self.union.size for lp in logprobs)
            step = max(1, CPU_BLOCK_BYTES // row_bytes)
        return [slice(start, start + step) for start in range(0, rows, step)]

    def greedy(self, logprobs: Sequence[torch.Tensor]) -> list[int]:
        """argmax_u q(u) per row, exactly (see the module docstring). After calls where the bound
        decided no row, the next calls skip it (1, 3, 7, then 15 calls): flat distributions go straight
        to the full projection, which gives the same entries."""
        rows = logprobs[0].shape[0]
        if self._bound_rests:
            self._bound_rests -= 1
            chosen, undecided = self._argmax_full(logprobs), rows
        else:
            chosen, undecided = self._bounded(logprobs)
            self._bound_misses = self._bound_misses + 1 if undecided == rows else 0
            self._bound_rests = min((1 << self._bound_misses) - 1, MAX_BOUND_RESTS)
        self.bound.rows_total += rows
        self.bound.rows_decided += rows - undecided
        return chosen.tolist()

    def _bounded(self, logprobs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, int]:
        """The argmax of every row (the bound's where it decides, the full projection's elsewhere)
        and how many rows the bound left undecided."""
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
        undecided = (~(best > bound * (1 + BOUND_MARGIN))).nonzero().flatten()
        if len(undecided) == len(chosen):
            return self._argmax_full(logprobs), len(chosen)
        if len(undecided):
            rest = self._argmax_full([lp.index_select(0, undecided.to(lp.device)) for lp in logprobs])
            chosen = chosen.index_copy(0, undecided, rest)
        return chosen, len(undecided)

    @staticmethod
    def _entry_mass(logprobs: torch.Tensor, tables: MemberTables, entries: torch.Tensor) -> torch.Tensor:
        """P_i(u) for each row's candidate entries [rows, C]: the member's ids of each entry,
        added in ascending id order from zero, as the full scatter-add adds them."""
        ids = tables.entry_ids[entries]  # [rows, C, d_i]
        probs = logprobs.gather(1, ids.clamp(min=0).flatten(1)).view(ids.shape).float().exp()
        mass = torch.zeros(entries.shape, dtype=torch.float32, device=logprobs.device)
        for slot in range(tables.width):
            mass = mass + torch.where(ids[..., slot] >= 0, probs[..., slot], 0.0)
        return mass
