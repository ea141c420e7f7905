"""UniTE's union of top-k tokens and its alignment rules (UniTE Sec. 4.2, Algorithm 1).

Tokens are keyed by bytes. Every stop id of every member shares one key (``STOP``): choosing it
ends the row, whichever marker a member uses. Other special tokens keep their literal text under
a namespace of their own, so they never meet ordinary text with the same spelling.

For one member and one union key w, the member's aligned token and probability follow the
paper's three rules:
1. w is in the member's top-k            -> that token and its probability;
2. w is in its vocabulary, not its top-k -> its token with exactly those bytes;
3. w is not in its vocabulary            -> the first token of its own tokenisation of w.

``TopKAligner`` and the functions below it state the rules one key at a time (the reference the
tests check against); ``AlignmentTables`` applies them to every row of a step at once, as tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ensemble_bench.vocab.bytes_view import VocabView

STOP = b"\x00stop"
SPECIAL = b"\x00special:"
RULE_TOPK, RULE_VOCAB, RULE_FIRST_SUBTOKEN, RULE_NONE = 1, 2, 3, 0
BEST_STOP, UNRESOLVED = -2, -3  # table entries: the member's most probable stop id (per row); rule 3 not looked up yet


@dataclass(frozen=True)
class Aligned:
    """One member's token for a union key: its id (-1 if none), probability and the rule used."""

    token: int
    prob: float
    rule: int


@dataclass
class TopKAligner:
    """One member's side of UniTE: its keys for ids, and ids for keys (rules 2 and 3)."""

    view: VocabView
    stop_ids: frozenset[int]
    encode_bytes: Callable[[bytes], list[int]]  # the member's tokenisation of new text (no BOS)
    keys: list[bytes | None] = field(init=False, repr=False)  # the key of every id
    _by_key: dict[bytes, int] = field(init=False, repr=False)
    _first_subtoken: dict[bytes, int] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.keys = [self.key(token_id) for token_id in range(self.view.size)]
        by_key: dict[bytes, int] = {}
        for token_id, key in enumerate(self.keys):
            if key is not None and key != STOP:
                by_key.setdefault(key, token_id)  # the lowest id among ids with the same bytes
        self._by_key = by_key

    def key(self, token_id: int) -> bytes | None:
        """The union key of one of this member's ids (None: padded row without text)."""
        if token_id in self.stop_ids:
            return STOP
        piece = self.view.pieces[token_id]
        if piece is None or piece == b"":
            return None
        return SPECIAL + piece if token_id in self.view.special_ids else piece

    def align(self, key: bytes, probs: Sequence[float], topk: dict[bytes, int]) -> Aligned:
        """Rules 1-3 for one key; ``topk`` maps this member's top-k keys to their ids and
        ``probs`` is its next-token distribution (indexable by id)."""
        best_stop = None
        if key == STOP and key not in topk:  # the member's most probable stop id stands for "stop"
            best_stop = max(sorted(self.stop_ids), key=lambda i: probs[i], default=None)
        token, rule = self.aligned_token(key, topk, best_stop)
        return Aligned(token, float(probs[token]) if token >= 0 else 0.0, rule)

    def aligned_token(self, key: bytes, topk: dict[bytes, int], best_stop: int | None) -> tuple[int, int]:
        """(id, rule) of rules 1-3 for one key, without probabilities (-1: none); ``best_stop``
        is the member's most probable stop id."""
        if key in topk:  # rule 1
            return topk[key], RULE_TOPK
        if key == STOP:
            return (-1, RULE_NONE) if best_stop is None else (best_stop, RULE_VOCAB)
        token = self._by_key.get(key)
        if token is not None:  # rule 2
            return token, RULE_VOCAB
        if key.startswith(SPECIAL):  # a control token this member does not have
            return -1, RULE_NONE
        return self.first_subtoken(key), RULE_FIRST_SUBTOKEN  # rule 3

    def first_subtoken(self, key: bytes) -> int:
        if key not in self._first_subtoken:
            self._first_subtoken[key] = self.encode_bytes(key)[0]
        return self._first_subtoken[key]


def member_topk(aligner: TopKAligner, ids: Sequence[int], probs: Sequence[float]) -> dict[bytes, int]:
    """A member's top-k as key -> id; ids sharing a key keep the more probable one."""
    found: dict[bytes, int] = {}
    for token in ids:
        key = aligner.key(int(token))
        if key is not None and (key not in found or probs[int(token)] > probs[found[key]]):
            found[key] = int(token)
    return found


def union_keys(topks: Sequence[dict[bytes, int]]) -> list[bytes]:
    """V^u: the members' top-k keys, in first-seen order (member 0's first)."""
    seen: dict[bytes, None] = {}
    for topk in topks:
        for key in topk:
            seen.setdefault(key, None)
    return list(seen)


def average_aligned(aligned: Sequence[Sequence[Aligned]], weights: Sequence[float]) -> list[float]:
    """Alg. 1 line 13: softmax over each member's aligned set (its logits restricted to the set,
    i.e. its probabilities renormalised there), then the weighted average over members."""
    total_weight = sum(weights)
    averaged = [0.0] * len(aligned[0])
    for member_aligned, weight in zip(aligned, weights):
        mass = sum(a.prob for a in member_aligned)
        if mass <= 0:
            continue
        for j, a in enumerate(member_aligned):
            averaged[j] += weight * a.prob / mass / total_weight
    return averaged


# ------------------------------------------------------------------ the same rules as tensors
@dataclass(frozen=True)
class UnionPlan:
    """One step's V^u for every row, as columns: the members' top-k ids in their sorted order,
    member after member (then the scored target, if any). A column whose key was seen in an
    earlier column of its row, or that has no key, is not in V^u."""

    ids: list[torch.Tensor]  # per member [rows, columns]: its aligned id for each key of V^u, -1 elsewhere
    first: torch.Tensor      # [rows, columns] the columns in V^u (each key's first column)
    top_width: int           # the columns that hold top-k ids (the rest: the target)


@dataclass(frozen=True)
class _Placed:
    key_of: torch.Tensor   # [sum of vocabulary sizes] the key number of every member's id (-1: none)
    aligned: torch.Tensor  # [members, keys] each member's rule-2/3 id for every key number


class AlignmentTables:
    """Rules 1-3 for every row of a step at once (the rules of ``TopKAligner.aligned_token``).

    The members' ids share one index space (member i's id t is ``offsets[i] + t``) and every key
    of any member has a number. Built once: the key number of every id, and for each member its
    rule-2 id for every key number (``BEST_STOP`` for the stop key, -1 for a control token it
    lacks). Rule 3 entries start ``UNRESOLVED`` and are tokenised on first use, as the per-key
    reference does (tokenising every missing key up front would take seconds). Tables are copied
    to each device once.
    """

    def __init__(self, aligners: Sequence[TopKAligner]):
        self.aligners = list(aligners)
        numbers: dict[bytes, int] = {}
        key_of = [-1 if key is None else numbers.setdefault(key, len(numbers))
                  for aligner in self.aligners for key in aligner.keys]
        self.keys = list(numbers)
        self._control_numbers = [n for n, key in enumerate(self.keys) if key[:1] == b"\x00" and
                                 (key == STOP or key.startswith(SPECIAL))]
        sizes = [aligner.view.size for aligner in self.aligners]
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.no_key = len(key_of)  # an index whose key number is -1 (pads short top-k lists)
        self._cpu = _Placed(torch.tensor(key_of + [-1], dtype=torch.long),
                            torch.tensor([self._rule2(a) for a in self.aligners], dtype=torch.long))
        self._placed: dict[str, _Placed] = {"cpu": self._cpu}
        self._lower: dict[tuple[int, str], torch.Tensor] = {}

    def _rule2(self, aligner: TopKAligner) -> list[int]:
        """A member's id for every key number without its top-k: rule 2, BEST_STOP for the stop
        key, -1 for a control token it lacks, UNRESOLVED for rule 3 (``aligned_token``'s order)."""
        entries = [aligner._by_key.get(key, UNRESOLVED) for key in self.keys]
        for number in self._control_numbers:
            if entries[number] == UNRESOLVED:
                entries[number] = BEST_STOP if self.keys[number] == STOP else -1
        return entries

    def _on(self, device: torch.device) -> _Placed:
        if str(device) not in self._placed:
            self._placed[str(device)] = _Placed(self._cpu.key_of.to(device), self._cpu.aligned.to(device))
        return self._placed[str(device)]

    def _earlier(self, width: int, device: torch.device) -> torch.Tensor:
        """[width, width]: True where column c' comes before column c (at [c, c'])."""
        key = (width, str(device))
        if key not in self._lower:
            self._lower[key] = torch.ones((width, width), dtype=torch.bool, device=device).tril(-1)
        return self._lower[key]

    def plan(self, top_ids: Sequence[torch.Tensor], top_probs: Sequence[torch.Tensor],
             best_stops: Sequence[torch.Tensor], targets: torch.Tensor | None = None,
             target_member: int = 0) -> UnionPlan:
        """V^u and every member's aligned id for each of its keys, for all rows (Alg. 1 lines 4-12).

        ``top_ids`` / ``top_probs``: each member's top-k [rows, k_i], sorted as ``block_topk``
        gives them; ``best_stops``: each member's most probable stop id per row (-1: none);
        ``targets``: ids of ``target_member`` to add to V^u (scoring). All on one device."""
        device = top_ids[0].device
        placed = self._on(device)
        width = max(top.shape[1] for top in top_ids)  # a vocabulary smaller than k: padded, keyless
        columns = [padded(ids + offset, width, self.no_key) for ids, offset in zip(top_ids, self.offsets)]
        if targets is not None:
            columns.append(targets[:, None] + self.offsets[target_member])
        keys = placed.key_of.take(torch.cat(columns, dim=1))  # [rows, columns]
        same = keys[:, :, None] == keys[:, None, :]
        first = (keys >= 0) & ~(same & self._earlier(keys.shape[1], device)).any(dim=-1)
        members = len(top_ids)
        match = same[:, :, :members * width].unflatten(2, (members, width))  # column's key == member's j-th top key
        tops = torch.cat([padded(top, width, 0) for top in top_ids], dim=1)
        probs = torch.cat([padded(p, width, 0.0) for p in top_probs], dim=1).unflatten(1, (members, width))
        rule1 = topk_choice(match, tops.unflatten(1, (members, width)), probs).permute(2, 0, 1)  # [members, rows, cols]
        rule23 = placed.aligned.index_select(1, keys.clamp(min=0).flatten()).unflatten(1, keys.shape)
        rule23 = torch.where(rule23 == BEST_STOP, torch.stack(best_stops)[:, :, None], rule23)
        ids = torch.where(first, torch.where(rule1 >= 0, rule1, rule23), -1)
        return UnionPlan(list(self._resolve_rule3(ids, keys).unbind(0)), first, members * width)

    def _resolve_rule3(self, ids: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Rule 3 for the keys met for the first time: tokenise them, fill the tables and ``ids``
        [members, rows, columns]."""
        pending = ids == UNRESOLVED
        if not bool(pending.any()):
            return ids
        for member, member_pending in enumerate(pending):
            numbers = keys[member_pending].unique().tolist()
            if not numbers:
                continue
            tokens = [self.aligners[member].first_subtoken(self.keys[n]) for n in numbers]
            for placed in self._placed.values():
                placed.aligned[member, torch.tensor(numbers, device=placed.aligned.device)] = \
                    torch.tensor(tokens, dtype=torch.long, device=placed.aligned.device)
        return torch.where(pending, self._on(keys.device).aligned[:, keys.clamp(min=0)], ids)


def padded(columns: torch.Tensor, width: int, value: int | float) -> torch.Tensor:
    """[rows, width]: ``columns`` with ``value`` appended on the right."""
    if columns.shape[1] == width:
        return columns
    return torch.nn.functional.pad(columns, (0, width - columns.shape[1]), value=value)


def topk_choice(match: torch.Tensor, top: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Rule 1 [rows, columns, members]: each member's top-k id for each column's key, -1 if
    none. Ids sharing a key keep the most probable, the first in top-k order on ties
    (``member_topk``'s strict ">"): argmax returns the first of equal maxima. ``match`` [rows,
    columns, members, k]: the column's key is the key of the member's j-th top id; ``top`` /
    ``probs`` [rows, members, k] (probabilities >= 0)."""
    position = torch.where(match, probs[:, None], -1.0).argmax(dim=-1, keepdim=True)
    chosen = top[:, None].expand(-1, match.shape[1], -1, -1).gather(3, position).squeeze(3)
    return torch.where(match.any(dim=-1), chosen, -1)


def average_rows(probs: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """``average_aligned`` for every row at once: ``probs`` [members, rows, columns] (float64, 0
    outside V^u) -> [rows, columns]. The same float operations in the same order as the
    reference (sequential sums, left to right; a member without mass adds nothing), so the
    argmax and its ties are the same."""
    mass = np.add.accumulate(probs, axis=2)[:, :, -1:]  # sequential, as Python's sum
    has_mass = mass > 0
    weight = np.asarray(weights, dtype=np.float64)[:, None, None]
    shares = np.where(has_mass, weight * probs / np.where(has_mass, mass, 1.0) / sum(weights), 0.0)
    averaged = shares[0]
    for share in shares[1:]:
        averaged = averaged + share
    return averaged
