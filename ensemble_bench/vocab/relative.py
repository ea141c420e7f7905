"""DeePEn's relative representations (DeePEn Sec. 3.2-3.4), without dense |V| x |A| matrices.

Anchors A are the tokens every member has (keyed by bytes). The relative representation of a
token v is the cosine similarity of its input embedding to every anchor's, softmax-normalised
over the anchors (Eq. 2, 4):  R^[v] = softmax_a(cos(e_v, e_a)).

The reference implementation stores R^ densely (|V| x |A| float32: 56 GB for Llama-3's 128k
tokens against Qwen2's 110k common anchors). Here rows are computed on demand, in chunks, for
the tokens that carry probability: a distribution's relative representation r = p R^ (Eq. 5's
r_i) only needs the rows of its support, so a member's top-``support`` tokens are used (the
dropped mass bounds the error: every row of R^ sums to 1, so ||r_exact - r||_1 equals the
probability mass left out). ``support=None`` uses every token (exact, slow, memory still
bounded by the chunk size).

Greedy steps first try ``bounded_choice``: the T inverse steps run on intervals, with the rows of
a few head tokens exact and every other row bounded entrywise from its embedding alone
(``RelativeSpace.entry_bounds``); when the interval of one token's final probability lies above
every other's (or their difference of rows says it wins against each head rival), that token is
the dense transform's argmax and no full row is touched. Otherwise (and when scoring) the exact
transform runs.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ensemble_bench.vocab.bytes_view import VocabView

CHUNK_ELEMENTS = 1 << 26  # rows x anchors computed at once (256 MiB of float32)
DECISION_MARGIN = 1e-4  # a bound must clear the runner-up by this much (x (1 + magnitude)): float rounding


def anchor_ids(views: Sequence[VocabView]) -> list[list[int]]:
    """For each member, the ids of the common text tokens (by bytes), in one shared order."""
    keyed = []
    for view in views:
        ids: dict[bytes, int] = {}
        for token_id in view.text_ids():
            ids.setdefault(view.pieces[token_id], token_id)  # lowest id among duplicates
        keyed.append(ids)
    common = sorted(set.intersection(*(set(k) for k in keyed)))
    return [[ids[piece] for piece in common] for ids in keyed]


class RelativeSpace:
    """One member's embeddings seen through the anchors: rows of R^ on demand.

    Recently used rows are kept in a fixed block of ``cache_bytes`` (least recently used rows
    make room), since the same tokens carry the probability step after step.
    """

    def __init__(self, embeddings: torch.Tensor, anchor_index: Sequence[int], cache_bytes: int = 256 << 20):
        norms = torch.cat([torch.linalg.vector_norm(block.float(), dim=-1)  # in blocks: no float copy of E
                           for block in embeddings.split(8192)]).clamp(min=1e-12)
        index = torch.tensor(list(anchor_index), dtype=torch.long, device=embeddings.device)
        self.embeddings = embeddings  # [V, d] the member's input embeddings (any dtype and device)
        self.anchors = (embeddings.index_select(0, index).float() / norms[index, None]).to(embeddings.dtype)
        self.inverse_norms = (1.0 / norms).float()  # [V]
        self.entry_low, self.entry_high = self._entry_bounds(norms)
        capacity = max(1, cache_bytes // (4 * self.size))
        self._store = torch.empty((0, self.size), dtype=torch.float32, device=embeddings.device)
        self._capacity = capacity
        self._slots: OrderedDict[int, int] = OrderedDict()  # token id -> row of _store, oldest first
        self._buffers: dict[str, torch.Tensor] = {}

    @property
    def size(self) -> int:
        return self.anchors.shape[0]

    def _entry_bounds(self, norms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per token v, bounds on every entry of its row R^[v] = softmax_a(c_va) (Eq. 2, 4), from
        its embedding alone ([V] each, float32).

        Cosines lie in [-L, L], L = 1 + rounding slack. Z_v = sum_a exp(c_va) is at least
        A exp(mean_a c_va) (Jensen), at most A (cosh L + mean_a c_va sinh L / L) (exp below its
        chord on [-L, L]); and mean_a c_va = e_v . m / |e_v| with m the mean normalised anchor. So
        R^[v, a] lies in [exp(-L) / Z_high, exp(L) / Z_low].
        """
        slack = 1e-5 if self.anchors.dtype in (torch.float32, torch.float64) else 2.0 ** -6
        limit = 1.0 + slack
        mean_anchor = self.anchors.float().mean(dim=0)
        mean_cosine = torch.cat([block.float() @ mean_anchor for block in self.embeddings.split(8192)])
        mean_cosine = mean_cosine / norms
        count = float(self.anchors.shape[0])
        z_low = count * torch.exp(mean_cosine - slack)
        z_high = count * (math.cosh(limit) + (mean_cosine + slack).clamp(max=limit) * math.sinh(limit) / limit)
        return math.exp(-limit) / z_high * (1 - 1e-5), math.exp(limit) / z_low * (1 + 1e-5)

    def compute_rows(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """R^[ids]: [len(ids), A] float32 (Eq. 2 then Eq. 4), computed now (in place in ``out`` when
        given: the cosines, their scaling and the softmax all in that one block)."""
        ids = ids.to(self.embeddings.device)
        chosen = self.embeddings.index_select(0, ids)
        if out is None:
            cosine = (chosen @ self.anchors.T).float()
            cosine *= self.inverse_norms[ids, None]
            return cosine.softmax(dim=-1)
        if chosen.dtype == torch.float32:
            torch.matmul(chosen, self.anchors.T, out=out)
        else:
            out.copy_(chosen @ self.anchors.T)
        out *= self.inverse_norms[ids, None]
        return torch.softmax(out, dim=-1, out=out)

    def _buffer(self, name: str, count: int) -> torch.Tensor:
        """A reused [count, A] float32 block (grown as needed)."""
        buffer = self._buffers.get(name)
        if buffer is None or buffer.shape[0] < count:
            buffer = self._buffers[name] = torch.empty((count, self.size), dtype=torch.float32,
                                                       device=self.anchors.device)
        return buffer[:count]

    def rows(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """R^[ids], through the cache when they fit in it (into ``out`` when given)."""
        wanted = list(dict.fromkeys(ids.tolist()))
        if len(wanted) > self._capacity:
            return self.compute_rows(ids, out=out)
        self._fill(wanted)
        slots = torch.tensor([self._slots[i] for i in ids.tolist()], dtype=torch.long, device=self._store.device)
        return self._store.index_select(0, slots) if out is None else torch.index_select(self._store, 0, slots, out=out)

    def held_rows(self, ids: torch.Tensor, block: str) -> torch.Tensor:
        """R^[ids] in the reused block named ``block`` (overwritten by the next call with that name):
        no fresh pages per step."""
        return self.rows(ids, out=self._buffer(block, len(ids)))

    def _fill(self, wanted: list[int]) -> None:
        """Compute the cache's missing rows among ``wanted`` (through a reused block) and insert them."""
        missing = [i for i in wanted if i not in self._slots]
        for i in wanted:
            if i in self._slots:
                self._slots.move_to_end(i)  # the oldest rows, not these, make room below
        if missing:
            fresh = self._buffer("fresh", len(missing))
            self._insert(missing, self.compute_rows(torch.tensor(missing, dtype=torch.long), out=fresh))

    def warm(self, ids: torch.Tensor) -> None:
        """Compute the missing rows of ``ids`` in one call, if they fit in the cache."""
        if len(ids) <= self._capacity:
            self._fill(list(dict.fromkeys(ids.tolist())))

    def _insert(self, ids: list[int], rows: torch.Tensor) -> None:
        if self._store.shape[0] == 0:  # allocated once, on first use
            self._store = torch.empty((self._capacity, self.size), dtype=torch.float32, device=self._store.device)
        free = list(range(len(self._slots), min(self._capacity, len(self._slots) + len(ids))))
        recycled = [self._slots.popitem(last=False)[1] for _ in range(len(ids) - len(free))]
        slots = free + recycled
        self._store[torch.tensor(slots, dtype=torch.long, device=self._store.device)] = rows
        self._slots.update(zip(ids, slots))

    def fits(self, count: int) -> bool:
        """Whether ``count`` rows can be held at once (cache and chunk limits)."""
        return count <= self._capacity and count * self.size <= CHUNK_ELEMENTS

    def represent(self, probs: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """r = p[ids] R^[ids] (Eq. 5's r_i, restricted to ``ids``); float32 [A]. Uses ``rows``
        (R^[ids]) when given, else computes them chunk by chunk."""
        if rows is not None:
            return probs.float().to(rows.device) @ rows
        parts = [weights @ self.rows(chunk) for chunk, weights in self._chunks(ids, probs)]
        return torch.stack(parts).sum(dim=0) if len(parts) > 1 else parts[0]

    def pull_back(self, ratio: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """R^[ids] @ ratio: [len(ids)] float32, in chunks (the gradient of Eq. 6, up to sign)."""
        return torch.cat([self.rows(chunk) @ ratio for chunk, _ in self._chunks(ids, None)])

    def _chunks(self, ids: torch.Tensor, probs: torch.Tensor | None):
        step = max(1, CHUNK_ELEMENTS // max(1, self.size))
        for start in range(0, len(ids), step):
            chunk = ids[start:start + step]
            yield chunk, None if probs is None else probs[start:start + step].to(self.anchors.device)


def inverse_transform(probs: torch.Tensor, ids: torch.Tensor, space: RelativeSpace, target: torch.Tensor,
                      eta: float, steps: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 6-7: ``steps`` gradient steps on p (the main model's probabilities of ``ids``) of
    KL(target || p R^), starting from the model's own p; returns the updated p (float32).

    d/dp_v KL(r || p R^) = -sum_a R^[v, a] r_a / (p R^)_a, so each step adds
    eta * R^[ids] @ (r / p R^) to p. ``rows`` (R^[ids]) may be given; without them the rows
    are recomputed chunk by chunk each step (bounded memory).
    """
    p = probs.float().to(space.anchors.device)
    target = target.to(space.anchors.device)
    for _ in range(steps):
        current = space.represent(p, ids, rows)
        ratio = target / current.clamp(min=1e-30)
        p = p + eta * (space.pull_back(ratio, ids) if rows is None else rows @ ratio)
    return p


@dataclass(frozen=True)
class MemberSlice:
    """One member's distribution over its support, for ``bounded_choice``: the ``head`` tokens'
    rows exact, the rest (the tail) bounded entrywise. All batched over rows."""

    head_ids: torch.Tensor     # [B, h] the most probable support tokens, most probable first
    head_probs: torch.Tensor   # [B, h]
    head_rows: torch.Tensor    # [B, h, A] R^[head_ids], float32
    tail_probs: torch.Tensor   # [B, n - h] the rest of the support
    tail_low: torch.Tensor     # [B, n - h] entry bounds of the tail tokens' rows
    tail_high: torch.Tensor    # [B, n - h]


class Scratch:
    """Reused [B, A] buffers: a fresh multi-megabyte tensor per step costs its page faults."""

    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}

    def take(self, name: str, like: torch.Tensor, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        shape = tuple(like.shape) if shape is None else shape
        buffer = self._buffers.get(name)
        if buffer is None or buffer.shape != shape or buffer.device != like.device:
            buffer = self._buffers[name] = torch.empty(shape, dtype=torch.float32, device=like.device)
        return buffer


def bounded_choice(members: Sequence[MemberSlice], weights: Sequence[float], lead: int, eta: float,
                   steps: int, scratch: Scratch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The argmax of Eq. 6-7's p^(T) over the main model's support, where bounds decide it:
    (head index of the winner [B], decided [B] bool).

    Every quantity of the exact transform is replaced by an interval that holds it entrywise.
    - The target r = sum_i alpha_i p_i R^_i (Eq. 5) and the start q = p R^_main take their head
      rows exactly and the tail as [sum p_v low_v, sum p_v high_v] (R^ >= 0).
    - A step reads ratio = r / q in [r_low / q_high, r_high / q_low]. The gradient g_v = R^[v] .
      ratio (Eq. 7) lies in [R^[v] . ratio_low, R^[v] . ratio_high] for a head row at the first
      step, and in [min ratio_low, max ratio_high] otherwise (a row of R^ is a distribution).
    - q then grows by eta sum_v g_v R^[v] >= 0: by the head rows at the first step, by
      g's bounds times the column sums D (head rows exact, tail rows' entry bounds summed) after.
      So after the first step q = q_1 + K D with a scalar K in [eta sum floor, eta sum ceiling],
      and r / q lies in [1 / (max q_1hi / r_low + K_hi max D_hi / r_low),
                         1 / (min q_1lo / r_high + K_lo min D_lo / r_high)]:
      four reductions over the anchors once, then scalars per step.
    After T steps p_v^(T) lies in [p_v + eta sum g_low, p_v + eta sum g_high]. A head token whose
    lower end clears every other upper end (the tail's through its largest p) by DECISION_MARGIN
    is the exact transform's argmax too, whatever its float rounding; a head rival whose interval
    overlaps may still be beaten on the difference of the two rows (``_pairwise_low``).
    """
    scratch = scratch or Scratch()
    own = members[lead]
    rows = own.head_rows
    target_low, target_high = scratch.take("target_low", rows[:, 0]), scratch.take("target_high", rows[:, 0])
    q = scratch.take("q", rows, (rows.shape[0], 2, rows.shape[2]))  # q's low and high ends, side by side
    q_low, q_high = q[:, 0], q[:, 1]
    _weighted_rows(own, 1.0, q_low, first=True)  # the main model's head part, once: in q and in the target
    torch.mul(q_low, weights[lead], out=target_low)
    for index, (weight, member) in enumerate(zip(weights, members)):
        if index != lead:
            _weighted_rows(member, weight, target_low, first=False)
    tail_low = sum(w * (m.tail_probs * m.tail_low).sum(-1, keepdim=True) for w, m in zip(weights, members))
    tail_high = sum(w * (m.tail_probs * m.tail_high).sum(-1, keepdim=True) for w, m in zip(weights, members))
    torch.add(target_low, tail_high, out=target_high)
    target_low += tail_low
    torch.add(q_low, (own.tail_probs * own.tail_high).sum(-1, keepdim=True), out=q_high)
    q_low += (own.tail_probs * own.tail_low).sum(-1, keepdim=True)
    tail_rows_low, tail_rows_high = own.tail_low.sum(-1, keepdim=True), own.tail_high.sum(-1, keepdim=True)
    gained_low = torch.zeros_like(own.head_probs)  # sum over steps of g's bounds, head tokens: [B, h]
    gained_high = torch.zeros_like(own.head_probs)
    tail_gained_high = torch.zeros_like(tail_rows_high)  # the same for any tail token: [B, 1]
    later_floor = torch.zeros_like(tail_rows_high)  # sum over steps 2..T of every ratio entry's floor: [B, 1]
    later_ceiling = torch.zeros_like(tail_rows_high)
    ratio = scratch.take("ratio", rows[:, 0])
    first = None  # the first step's ratio, entrywise: ([B, A], [B, A])
    if steps:  # the first step: the head rows' own gradients, then q grows by eta sum_v g_v R^[v]
        ratios = scratch.take("first", rows, (rows.shape[0], 2, rows.shape[2]))
        floor, ceiling = _first_gradient(target_low, target_high, q, rows, ratios, gained_low, gained_high)
        first = ratios[:, 0], ratios[:, 1]
        tail_gained_high += ceiling
        q.add_(torch.stack([floor * tail_rows_low, ceiling * tail_rows_high], dim=1), alpha=eta)
        q.baddbmm_(torch.stack([gained_low, gained_high], dim=1), rows, alpha=eta)  # both ends in one pass
    if steps > 1:  # q = q_1 + K D afterwards, D the column sums of the support's rows
        start_low = torch.div(q_high, target_low, out=ratio).amax(-1, keepdim=True)   # 1 / floor at K = 0
        start_high = torch.div(q_low, target_high, out=ratio).amin(-1, keepdim=True)  # 1 / ceiling at K = 0
        columns = torch.sum(rows, dim=1, out=q_low)
        slope_low = torch.add(columns, tail_rows_high, out=ratio).div_(target_low).amax(-1, keepdim=True)
        slope_high = torch.add(columns, tail_rows_low, out=ratio).div_(target_high).amin(-1, keepdim=True)
        grown_low = grown_high = 0.0  # K's bounds
        for _ in range(1, steps):
            floor, ceiling = 1.0 / (start_low + grown_high * slope_low), 1.0 / (start_high + grown_low * slope_high)
            gained_low += floor
            gained_high += ceiling
            tail_gained_high += ceiling
            later_floor += floor
            later_ceiling += ceiling
            grown_low, grown_high = grown_low + eta * floor, grown_high + eta * ceiling
    bounds = GainBounds(own.head_probs + eta * gained_low, own.head_probs + eta * gained_high,
                        eta * tail_gained_high[:, 0], first, eta * later_floor, eta * later_ceiling)
    return _decide(own, bounds, eta)


def _first_gradient(target_low: torch.Tensor, target_high: torch.Tensor, q: torch.Tensor, rows: torch.Tensor,
                    ratios: torch.Tensor, gained_low: torch.Tensor, gained_high: torch.Tensor):
    """The first step's ratio entrywise, ``ratios`` = [r_low / q_high, r_high / q_low] ([B, 2, A]),
    and the head rows' gradients R^[head] . ratio added to ``gained_low`` / ``gained_high`` (Eq. 7; one
    batched product reads the head rows once for both ends). Returns the ratio's floor and ceiling
    over the anchors, the tail rows' bounds: [B, 1] each."""
    torch.div(target_low, q[:, 1], out=ratios[:, 0])
    torch.div(target_high, q[:, 0], out=ratios[:, 1])
    gained = torch.bmm(ratios, rows.transpose(1, 2))  # [B, 2, h]
    gained_low += gained[:, 0]
    gained_high += gained[:, 1]
    return ratios[:, 0].amin(-1, keepdim=True), ratios[:, 1].amax(-1, keepdim=True)


def _weighted_rows(member: MemberSlice, weight: float, out: torch.Tensor, first: bool) -> None:
    """out (+)= weight * sum_k head_probs[:, k] head_rows[:, k] (h fused passes, no new [B, A])."""
    probs = member.head_probs * weight
    for k in range(probs.shape[1]):
        if first and k == 0:
            torch.mul(member.head_rows[:, 0], probs[:, :1], out=out)
        else:
            out.addcmul_(member.head_rows[:, k], probs[:, k:k + 1])


@dataclass(frozen=True)
class GainBounds:
    """What ``bounded_choice`` knows of p^(T) (Eq. 7): per head token an interval [B, h], the tail's
    highest gain [B], and for ``_pairwise_low`` the ratio of every step entrywise."""

    low: torch.Tensor
    high: torch.Tensor
    tail_gain: torch.Tensor
    first: tuple[torch.Tensor, torch.Tensor] | None  # the first step's ratio, entrywise bounds [B, A]
    later_floor: torch.Tensor    # eta * sum over steps 2..T of the floor of every ratio entry [B, 1]
    later_ceiling: torch.Tensor  # the same for the ceiling


def _decide(own: MemberSlice, bounds: GainBounds, eta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(winner [B], decided [B]): the head token with the highest lower end, decided where it beats
    every other support token by DECISION_MARGIN. A head rival w is beaten on their intervals, or
    else on their difference (``_pairwise_low``); a tail token on its interval."""
    best_low, winner = bounds.low.max(dim=-1)
    margin = DECISION_MARGIN * (1 + best_low.abs())
    beaten = (best_low - margin)[:, None] > bounds.high
    beaten.scatter_(1, winner[:, None], True)
    if own.tail_probs.shape[1]:
        tail_ok = own.tail_probs.amax(-1) + bounds.tail_gain < best_low - margin
    else:
        tail_ok = torch.ones_like(best_low, dtype=torch.bool)
    pending = (~beaten.all(-1) & tail_ok).nonzero()[:, 0]
    if len(pending):
        beaten[pending] |= _pairwise_low(own, bounds, winner[pending], pending, eta) > margin[pending, None]
    return winner, beaten.all(-1) & tail_ok


def _pairwise_low(own: MemberSlice, bounds: GainBounds, winner: torch.Tensor, rows: torch.Tensor,
                  eta: float) -> torch.Tensor:
    """A lower bound on p_v^(T) - p_w^(T) for the winner v and every head token w: [b, h].

    p_v^(T) - p_w^(T) = p_v - p_w + eta sum_t d . ratio_t with d = R^[v] - R^[w] (Eq. 7). With every
    ratio entry a in [lo_a, hi_a], d . ratio >= sum_a d+_a lo_a - d-_a hi_a: entrywise at the first
    step, with the scalar floor and ceiling of the later ones. The two rows share most of their mass,
    so this is far tighter than the two intervals apart.
    """
    head_rows = own.head_rows[rows]
    difference = head_rows[torch.arange(len(rows)), winner][:, None, :] - head_rows  # [b, h, A]
    probs = own.head_probs[rows]
    low = probs.gather(1, winner[:, None]) - probs
    positive = difference.clamp(min=0)
    negative = difference.neg_().clamp_(min=0)
    if bounds.first is not None:
        floor, ceiling = bounds.first[0][rows, None, :], bounds.first[1][rows, None, :]
        low += eta * ((positive * floor).sum(-1) - (negative * ceiling).sum(-1))
    return low + positive.sum(-1) * bounds.later_floor[rows] - negative.sum(-1) * bounds.later_ceiling[rows]


def kl_divergence(target: torch.Tensor, current: torch.Tensor) -> float:
    """KL(target || current) for two distributions over the anchors (the loss of Eq. 6)."""
    mask = target > 0
    return float((target[mask] * (target[mask].log() - current[mask].clamp(min=1e-30).log())).sum())
