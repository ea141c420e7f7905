"""The limits of every YAML document ensbench reads: a recipe file, a ``--set`` value, a task file of an
include_path folder. A YAML document can be small as written and huge when read (an alias names a
mapping, which names another: a "billion laughs"; or thousands of levels of nesting).
:class:`GuardedLoader` refuses nesting deeper than MAX_YAML_DEPTH and more than MAX_YAML_NODES values
with every alias written out (:func:`check_expanded_size`, linear time), with a :class:`RecipeLimit`
that names the line; :class:`RecipeLoader` also refuses a key given twice in one mapping."""

from __future__ import annotations

import yaml

MAX_RECIPE_BYTES = 1 << 20  # 1 MiB; recipes are a few KiB
MAX_YAML_DEPTH = 32  # nesting of mappings and lists; a recipe needs about 5, lm-eval's tasks about 6
MAX_YAML_NODES = 100_000  # values of the document with every alias expanded (a "billion laughs" has 10**9)
MERGE_TAG = "tag:yaml.org,2002:merge"


class RecipeLimit(yaml.MarkedYAMLError):
    """A document past one of GuardedLoader's limits."""


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def check_expanded_size(root: yaml.Node) -> None:
    """RecipeLimit if the document, every alias written out, has more than MAX_YAML_NODES values, or
    if a mapping or list contains itself. Linear in the nodes as written (each counted once)."""
    sizes: dict[int, int] = {}  # id(node) -> values below it, itself included, aliases expanded
    open_nodes: set[int] = set()  # the nodes on the path from the root to the node being visited
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            open_nodes.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[id(node)] > MAX_YAML_NODES:
                raise RecipeLimit(None, None, f"more than {MAX_YAML_NODES} values with every alias written out "
                                  "(a recipe has a few hundred)", node.start_mark)
        elif id(node) in open_nodes:
            raise RecipeLimit(None, None, "an alias names a mapping or list that contains it: a recipe cannot "
                              "be recursive", node.start_mark)
        elif id(node) not in sizes:
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node))


class GuardedLoader(yaml.SafeLoader):
    """A SafeLoader that refuses nesting deeper than MAX_YAML_DEPTH and aliases past check_expanded_size."""

    depth = 0

    def compose_node(self, parent, index):
        if self.depth >= MAX_YAML_DEPTH:
            raise RecipeLimit(None, None, f"nested deeper than {MAX_YAML_DEPTH} mappings and lists",
                              self.peek_event().start_mark)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            check_expanded_size(node)
        return node


class RecipeLoader(GuardedLoader):
    """YAML of a recipe or a ``--set`` value: GuardedLoader's limits, and no key given twice in one
    mapping (plain YAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:  # `<<: *defaults`: keys given beside it override the merged ones
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key '{key}'", key_node.start_mark)
            seen.add(key if isinstance(key, (str, int, float, bool)) else id(key_node))
        return super().construct_mapping(node, deep)
