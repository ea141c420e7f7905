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
``ForcedBranches`` then replays the covering tree of every byte of every row in plain Python (the
narrowing is a bisect per live branch), and sums all their next-byte masses in one scatter-add per
member: no forward pass and no tensor call per byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import torch

from ensemble_bench.vocab.append import common_prefix
from ensemble_bench.vocab.covering import END, SortedVocab, shifted_opening
from ensemble_bench.vocab.lookahead import WHOLE, lookahead
from ensemble_bench.vocab.retokenize import CanonicalTail, Plan


@dataclass
class ContinuationTree:
    """One member's re-tokenisation plans of a forced continuation and the trie of what they feed."""

    plans: list[Plan] = field(default_factory=list)      # per forced byte
    tokens: list[int] = field(default_factory=list)     # trie node n: its id...
    parents: list[int] = field(default_factory=list)    # ...and the node before it (-1: the context)
    fed: list[list[int] | None] = field(default_factory=list)  # per fed byte: the nodes of its new ids
    # per fed byte after which a branch opens: its split (vocab/lookahead.py), each other trunk as
    # (first bytes, ids shared with the held ones, its nodes past them)
    looks: dict[int, tuple[frozenset[int], list[tuple[frozenset[int], int, list[int]]]]] = field(default_factory=dict)

    @classmethod
    def of(cls, tail: CanonicalTail, forced: bytes) -> ContinuationTree:
        """Plans for every byte; the trie of the feeds of all bytes but the last (never fed), and
        of the other trunks the branches after whitespace open on."""
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
            if moved and not pending:
                split = lookahead(tail, held, forced[:count + 1])
                if split is not WHOLE:
                    tree.looks[count] = (split.keep, [tree._other(children, path, held, first, trunk)
                                                      for first, trunk in split.others])
        return tree

    def _other(self, children: dict[tuple[int, int], int], path: list[int], held: list[int], first: frozenset[int],
               trunk: tuple[int, ...]) -> tuple[frozenset[int], int, list[int]]:
        shared = common_prefix(held, trunk)
        branch = path[:shared]
        for token in trunk[shared:]:
            self._child(children, branch, token)
        return first, shared, branch[shared:]

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
    """What one row's trie gave one member: the edge log-probability into each node, and per node
    the branch it opens: its probabilities and masses scaled by 1 / p_max (``shifted_opening``)
    and log p_max."""

    edge: list[float]
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
    for edge, nodes in zip(edges, node_logprobs):
        probs, mass, top = shifted_opening(vocab, nodes, stop_ids)
        reads.append(TreeRead(edge, probs, mass, top.tolist()))
    return reads


def edge_logprobs(first: torch.Tensor, nodes: torch.Tensor, tree: ContinuationTree) -> list[float]:
    """log p(node's id | its parent's path) of every node: from the parent node's distribution in
    ``nodes`` [nodes, head], or from the context's ``first`` [head] under the root."""
    parents = torch.tensor(tree.parents, dtype=torch.long, device=first.device)
    tokens = torch.tensor(tree.tokens, dtype=torch.long, device=first.device)
    return torch.where(parents >= 0, nodes[parents.clamp(min=0), tokens], first[tokens]).tolist()


@dataclass
class ForcedBranches:
    """One member's covering tree at every byte of every row, flattened: live branch b belongs to
    step ``group[b]`` (a row's byte), has trunk log-probability ``logp[b]``, opened on ``source[b]``
    (the row's context: -1, else a trie node) and covers sorted tokens [lo, hi) at ``depth``."""

    group: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    row: list[int] = field(default_factory=list)
    source: list[int] = field(default_factory=list)
    lo: list[int] = field(default_factory=list)
    hi: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    allowed: list[tuple[frozenset[int], bool] | None] = field(default_factory=list)  # first bytes, keeps the end

    def walk(self, vocab: SortedVocab, row: int, forced: bytes, tree: ContinuationTree, read: TreeRead,
             first_group: int) -> None:
        """The byte loop's branches for one row (methods/covering_decoder.py's ``_grow`` and
        ``_take``): at each byte the live ones are recorded, then narrowed by it; the fed ids extend
        the trunk log-probabilities and, with no byte pending, a branch opens on the last fed node
        (split after whitespace, ``_look_ahead``)."""
        live, cum = [(0.0, -1, 0, vocab.size, 0, None)], [0.0]
        for k in range(len(forced)):
            for logp, source, lo, hi, depth, allowed in live:
                self._add(first_group + k, logp, row, source, lo, hi, depth, allowed)
            if k == len(forced) - 1:
                break
            live = [(logp, source, *narrowed, depth + 1, None) for logp, source, lo, hi, depth, allowed in live
                    if allowed is None or forced[k] in allowed[0]
                    if (narrowed := vocab.narrow(lo, hi, forced[k - depth:k + 1]))[0] < narrowed[1]]
            nodes, plan = tree.fed[k], tree.plans[k]
            if nodes is not None:
                cum = cum[:plan.keep + 1] + list(accumulate((read.edge[n] for n in nodes), initial=cum[plan.keep]))[1:]
                if not plan.pending:
                    live.extend(self._opened(vocab, tree.looks.get(k), cum, nodes[-1], read))

    @staticmethod
    def _opened(vocab: SortedVocab, look, cum: list[float], node: int, read: TreeRead) -> list[tuple]:
        """The branches that open at the end of x: one on the held trunk, or its split after whitespace."""
        if look is None:
            return [(cum[-1] + read.top[node], node, 0, vocab.size, 0, None)]
        keep, others = look
        opened = [(cum[-1] + read.top[node], node, 0, vocab.size, 0, (keep, True))]
        for first, shared, nodes in others:
            logp = cum[shared] + sum(read.edge[n] for n in nodes) + read.top[nodes[-1]]
            opened.append((logp, nodes[-1], 0, vocab.size, 0, (first, False)))
        return opened

    def _add(self, group: int, logp: float, row: int, source: int, lo: int, hi: int, depth: int, allowed) -> None:
        for name, value in zip(("group", "logp", "row", "source", "lo", "hi", "depth", "allowed"),
                               (group, logp, row, source, lo, hi, depth, allowed)):
            getattr(self, name).append(value)

    def masses(self, vocab: SortedVocab, roots: tuple[torch.Tensor, torch.Tensor],
               reads: Sequence[TreeRead]) -> torch.Tensor:
        """[branches, 257] every branch's next-byte masses (``next_byte_masses``): the opened ones
        (depth 0) as summed when opened, the narrowed ones in one scatter-add over all their ranges."""
        root_probs, root_mass = roots
        device = root_mass.device
        order, columns, _ = vocab._on(device)
        masses = torch.zeros((len(self.group), END + 1), dtype=root_mass.dtype, device=device)
        sources = [root_probs, *(read.probs for read in reads)]
        opened_mass = [root_mass, *(read.mass for read in reads)]
        for key, (probs, mass) in enumerate(zip(sources, opened_mass)):
            self._fill(masses, key, probs, mass, order, columns)
        for b, allowed in enumerate(self.allowed):
            if allowed is not None:
                first, keeps_end = allowed
                keep = torch.zeros(END + 1, dtype=masses.dtype, device=device)
                keep[sorted(first)] = 1.0
                keep[END] = float(keeps_end)
                masses[b] *= keep
        return masses

    def _fill(self, masses: torch.Tensor, key: int, probs: torch.Tensor, mass: torch.Tensor,
              order: torch.Tensor, columns: torch.Tensor) -> None:
        """The branches opened on one tensor of ``probs`` (key 0: the contexts' rows, else row
        key - 1's trie nodes): opened masses copied, narrowed ranges summed by their next byte."""
        mine = [b for b in range(len(self.group)) if (self.source[b] < 0) == (key == 0)
                and (key == 0 or self.row[b] == key - 1)]
        at = [self.row[b] if key == 0 else self.source[b] for b in mine]
        opened = [k for k, b in enumerate(mine) if self.depth[b] == 0]
        if opened:
            index = torch.tensor([mine[k] for k in opened], device=masses.device)
            masses.index_copy_(0, index, mass[torch.tensor([at[k] for k in opened], device=masses.device)])
        narrowed = [k for k, b in enumerate(mine) if self.depth[b] > 0]
        if not narrowed:
            return
        chosen = [mine[k] for k in narrowed]
        small = torch.tensor([[self.lo[b], self.hi[b] - self.lo[b], at[k], self.depth[b], b]
                              for k, b in zip(narrowed, chosen)], dtype=torch.long, device=masses.device)
        lo, width, row, depth, branch = small.unbind(1)
        owner = torch.repeat_interleave(torch.arange(len(chosen), device=masses.device), width)
        sorted_at = torch.arange(owner.numel(), device=masses.device) + (lo - (width.cumsum(0) - width))[owner]
        values = probs.view(-1).index_select(0, (row * probs.shape[1])[owner] + order.index_select(0, sorted_at))
        bins = columns.view(-1).index_select(0, (depth * columns.shape[1])[owner] + sorted_at)
        masses.view(-1).index_add_(0, (branch * (END + 1))[owner] + bins, values)
        masses[[mine[k] for k in narrowed], END] = 0.0  # the pieces equal to x[j:]: no stop past depth 0
