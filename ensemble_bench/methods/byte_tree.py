"""Teacher-forced byte-level scoring read in one forward pass per member (methods/byte_level.py).

When a continuation's bytes are forced, each member's canonical re-tokenisation after every byte
(``CanonicalTail.plan``: crop the held ids to ``keep``, append ``ids``) depends on the bytes alone,
never on the model. So every token sequence the byte-by-byte loop would feed a member is known
before any forward pass. They share long prefixes: together they are a trie over the member's
ids after the context. ``ContinuationTree`` builds that trie; ``TreeRead`` reads all its nodes in
one ``Member.read_tree`` call and keeps what the loop takes from each feed:
- the log-probability of every fed id (the trie edge into its node, from its parent's distribution
  or the context's), which extends the trunk log-probabilities P(c_j);
- the next-byte masses of the branch that opens at the end of x after a byte (when no half UTF-8
  character waits): every node's, summed in one batched ``shifted_opening`` per row.
The covering-tree arithmetic then runs byte by byte on these, with no further forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ensemble_bench.vocab.covering import SortedVocab, shifted_opening
from ensemble_bench.vocab.retokenize import CanonicalTail, Plan


@dataclass
class ContinuationTree:
    """One member's re-tokenisation plans of a forced continuation and the trie of what they feed."""

    plans: list[Plan] = field(default_factory=list)      # per forced byte
    tokens: list[int] = field(default_factory=list)     # trie node n: its id...
    parents: list[int] = field(default_factory=list)    # ...and the node before it (-1: the context)
    fed: list[list[int] | None] = field(default_factory=list)  # per fed byte: the nodes of its new ids

    @classmethod
    def of(cls, tail: CanonicalTail, forced: bytes) -> ContinuationTree:
        """Plans for every byte; the trie of the feeds of all bytes but the last (never fed)."""
        tree, held, pending, path = cls(), [], b"", []
        children: dict[tuple[int, int], int] = {}
        for count, byte in enumerate(forced):
            plan = tail.plan(held, pending, bytes([byte]))
            tree.plans.append(plan)
            if count == len(forced) - 1:
                break
            moved = bool(plan.ids) or plan.keep < len(held)
            held, pending, path = held[:plan.keep] + list(plan.ids), plan.pending, path[:plan.keep]
            tree.fed.append([tree._child(children, path, t) for t in plan.ids] if moved else None)
        return tree

    def _child(self, children: dict[tuple[int, int], int], path: list[int], token: int) -> int:
        """The node of ``token`` after ``path`` (added when new); ``path`` grows by it."""
        key = (path[-1] if path else -1, token)
        if key not in children:
            children[key] = len(self.tokens)
            self.tokens.append(token)
            self.parents.append(key[0])
        path.append(children[key])
        return children[key]


@dataclass
class TreeRead:
    """What one row's trie gave one member: the edge log-probability into each node, the nodes
    each fed byte appends (``ContinuationTree.fed``), and per node the branch it opens: its
    probabilities and masses scaled by 1 / p_max (``shifted_opening``) and log p_max."""

    edge: list[float]
    fed: list[list[int] | None]
    probs: torch.Tensor
    mass: torch.Tensor
    top: list[float]


def read_trees(vocab: SortedVocab, stop_ids: Sequence[int], first: torch.Tensor,
               node_logprobs: list[torch.Tensor], trees: Sequence[ContinuationTree]) -> list[TreeRead] | None:
    """Every row's ``TreeRead`` from the context's distribution ``first`` [rows, head] and the
    nodes' (``Member.read_tree``, consumed: the openings are written over them); None when a
    distribution is not finite (the loop then reports it). Every node is opened, in place (most
    open a branch: no copy of the others out)."""
    edges = [edge_logprobs(first[r], nodes, tree) for r, (tree, nodes) in enumerate(zip(trees, node_logprobs))]
    tops = [nodes.amax(dim=1) for nodes in node_logprobs]
    if not bool(torch.isfinite(torch.cat([first.amax(dim=1), *tops])).all()):
        return None
    reads = []
    for tree, edge, nodes in zip(trees, edges, node_logprobs):
        probs, mass, top = shifted_opening(vocab, nodes, stop_ids)
        reads.append(TreeRead(edge, tree.fed, probs, mass, top.tolist()))
    return reads


def edge_logprobs(first: torch.Tensor, nodes: torch.Tensor, tree: ContinuationTree) -> list[float]:
    """log p(node's id | its parent's path) of every node: from the parent node's distribution in
    ``nodes`` [nodes, head], or from the context's ``first`` [head] under the root."""
    parents = torch.tensor(tree.parents, dtype=torch.long, device=first.device)
    tokens = torch.tensor(tree.tokens, dtype=torch.long, device=first.device)
    return torch.where(parents >= 0, nodes[parents.clamp(min=0), tokens], first[tokens]).tolist()
