"""Limits on every YAML document ensbench parses: recipes, ``--set`` values and task files.

A YAML document can be small as written and huge when read: an alias names a mapping, which names
another ("billion laughs"), or nests thousands of levels deep. :class:`GuardedLoader` refuses a
document nested deeper than MAX_YAML_DEPTH or holding more than MAX_YAML_NODES values with every
alias written out (:func:`check_expanded_size`, linear in the nodes as written), with a
:class:`YamlLimit` that names the line.
"""

from __future__ import annotations

import yaml

MAX_YAML_DEPTH = 32  # nesting of mappings and lists; a recipe needs about 5, lm-eval's tasks about 6
MAX_YAML_NODES = 100_000  # values of the document with every alias expanded (a "billion laughs" has 10**9)


class YamlLimit(yaml.MarkedYAMLError):
    """A document past one of GuardedLoader's limits."""


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def check_expanded_size(root: yaml.Node, limit: int = MAX_YAML_NODES) -> None:
    """YamlLimit if the document, every alias written out, has more than ``limit`` values, or if a
    mapping or list contains itself. Linear in the nodes as written (each counted once)."""
    sizes: dict[int, int] = {}  # id(node) -> values below it, itself included, aliases expanded
    open_nodes: set[int] = set()  # the nodes on the path from the root to the node being visited
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            open_nodes.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[id(node)] > limit:
                raise YamlLimit(None, None, f"more than {limit} values with every alias written out "
                                "(a recipe has a few hundred)", node.start_mark)
        elif id(node) in open_nodes:
            raise YamlLimit(None, None, "an alias names a mapping or list that contains it: the document "
                            "cannot be recursive", node.start_mark)
        elif id(node) not in sizes:
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node))


class GuardedLoader(yaml.SafeLoader):
    """A SafeLoader that refuses nesting deeper than MAX_YAML_DEPTH and aliases past check_expanded_size."""

    depth = 0
    node_limit = MAX_YAML_NODES

    def compose_node(self, parent, index):
        if self.depth >= MAX_YAML_DEPTH:
            raise YamlLimit(None, None, f"nested deeper than {MAX_YAML_DEPTH} mappings and lists",
                            self.peek_event().start_mark)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            check_expanded_size(node, self.node_limit)
        return node
