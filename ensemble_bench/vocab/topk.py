"""UniTE's union of top-k tokens and its alignment rules (UniTE Sec. 4.2, Algorithm 1).

Tokens are keyed by bytes. Every stop id of every member shares one key (``STOP``): choosing it
ends the row, whichever marker a member uses. Other special tokens keep their literal text under
a namespace of their own, so they never meet ordinary text with the same spelling.

For one member and one union key w, the member's aligned token and probability follow the
paper's three rules:
1. w is in the member's top-k            -> that token and its probability;
2. w is in its vocabulary, not its top-k -> its token with exactly those bytes;
3. w is not in its vocabulary            -> the first token of its own tokenisation of w.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ensemble_bench.vocab.bytes_view import VocabView

STOP = b"\x00stop"
SPECIAL = b"\x00special:"
RULE_TOPK, RULE_VOCAB, RULE_FIRST_SUBTOKEN, RULE_NONE = 1, 2, 3, 0


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
    _by_key: dict[bytes, int] = field(init=False, repr=False)
    _first_subtoken: dict[bytes, int] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        by_key: dict[bytes, int] = {}
        for token_id, piece in enumerate(self.view.pieces):
            key = self.key(token_id)
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
