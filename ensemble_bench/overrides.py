"""Command-line overrides of a recipe (``ensbench run R --limit 3 --set method.weights=[2,1]``).

Each override edits the recipe's YAML mapping before it is validated, so an overridden value is
checked exactly like one written in the file; a line about a field an override set names it.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

import yaml

from ensemble_bench.errors import UserError, lines_of, several

_PART = re.compile(r"([A-Za-z_][\w-]*)|\[(\d+)\]|(\d+)")


@dataclass(frozen=True)
class Override:
    """One edit: the field path (``members[0].dtype``), its new value, how the user wrote it, and its
    kind: ``set`` (the value at the path), ``tasks`` (selects tasks), ``limit`` (every task's limit)."""

    path: tuple[str | int, ...]
    value: Any
    shown: str
    kind: str = "set"

    @property
    def field(self) -> str:
        """The path as a recipe error line writes it: ``members[0].dtype``."""
        return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in self.path).lstrip(".")


def _path(key: str, shown: str) -> tuple[str | int, ...]:
    """``method.weights`` -> ('method', 'weights'); ``members[0].dtype`` and ``members.0.dtype`` -> (..., 0, ...)."""
    parts: list[str | int] = []
    for piece in key.split("."):
        found = list(_PART.finditer(piece))
        if not piece or "".join(m.group(0) for m in found) != piece:
            raise UserError(f"{shown}: '{key}' is not a field path (write it like method.weights or members[0].dtype)")
        parts += [m.group(1) if m.group(1) else int(m.group(2) or m.group(3)) for m in found]
    if isinstance(parts[0], int):
        raise UserError(f"{shown}: a field path starts with a field name, not an index")
    return tuple(parts)


def parse_set(text: str) -> Override:
    """``key=value`` of ``--set``: the value read as YAML (``[2, 1]``, ``0.5``, ``true``, ``org/model``)."""
    shown = f"--set {text}"
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise UserError(f"{shown}: write --set key=value (e.g. --set method.weights=[2,1])")
    try:
        parsed = yaml.safe_load(value)
    except (yaml.YAMLError, ValueError) as err:
        raise UserError(f"{shown}: the value is not valid YAML ({getattr(err, 'problem', None) or err})") from None
    return Override(_path(key.strip(), shown), parsed, shown)


def option_overrides(limit: int | None, tasks: str | None, batch_size: int | None,
                     output: str | None) -> list[Override]:
    """The overrides of ``run``'s own options (``--tasks`` is applied by ``apply``: it selects tasks)."""
    found = [Override(("batch_size",), batch_size, f"--batch-size {batch_size}") if batch_size is not None else None,
             Override(("output",), output, f"--output {output}") if output is not None else None,
             Override(("limit",), limit, f"--limit {limit}", "limit") if limit is not None else None,
             Override(("tasks",), [t.strip() for t in tasks.split(",") if t.strip()], f"--tasks {tasks}", "tasks")
             if tasks is not None else None]
    return [o for o in found if o is not None]


def _as_mapping(value: Any) -> Any:
    """A recipe's shorthand ``gac`` for ``{name: gac}`` (methods, tasks), as a mapping to edit."""
    return {"name": value} if isinstance(value, str) else value


SHORTHAND = ("method", "methods", "tasks")  # fields whose entries may be written as a bare name


def _set(node: Any, path: tuple[str | int, ...], value: Any, shown: str, shorthand: bool = False) -> Any:
    """``node`` with the field at ``path`` set to ``value`` (mappings created on the way; ``shorthand``:
    ``node`` may be a method's or task's bare name, edited as ``{name: ...}``)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        if not isinstance(node, list) or not -len(node) <= head < len(node):
            size = f"a list of {len(node)}" if isinstance(node, list) else "not a list"
            raise UserError(f"{shown}: index {head} is out of range ({size} there)")
        return [_set(item, rest, value, shown, shorthand) if k == head % len(node) else item
                for k, item in enumerate(node)]
    node = {} if node is None else _as_mapping(node) if shorthand else node
    if not isinstance(node, dict):
        raise UserError(f"{shown}: '{head}' cannot be set inside a {type(node).__name__}")
    return {**node, head: _set(node.get(head), rest, value, shown, head in SHORTHAND)}


def _select_tasks(data: dict, names: list[str]) -> list[Any]:
    """``--tasks a,b``: the recipe's entries of these benchmarks (their settings kept), in this order;
    a benchmark the recipe lacks is added with its defaults."""
    entries = [_as_mapping(t) for t in data.get("tasks") or [] if isinstance(_as_mapping(t), dict)]
    by_name = {entry.get("name"): entry for entry in entries}
    return [by_name.get(name, {"name": name}) for name in names]


def apply(data: Any, overrides: list[Override]) -> Any:
    """The recipe mapping with every override applied, in order: ``--tasks``, then ``--limit`` (every
    task's limit), then the other options and each ``--set``."""
    if not overrides or not isinstance(data, dict):
        return data
    data = copy.deepcopy(data)
    for override in sorted(overrides, key=lambda o: o.kind != "tasks"):  # stable: --set keeps its order
        if override.kind == "tasks":
            data["tasks"] = _select_tasks(data, override.value)
        elif override.kind == "limit":
            data["tasks"] = [{**_as_mapping(t), "limit": override.value} if isinstance(_as_mapping(t), dict) else t
                             for t in data.get("tasks") or []]
            data.pop("limit", None)
        else:
            data = _set(data, override.path, override.value, override.shown)
    return data


def _blamed(line: str, source: str, overrides: list[Override]) -> str:
    """A recipe error line, naming the override that set the field it is about."""
    field = line.removeprefix(f"{source}: ").split(":", 1)[0]
    for override in reversed(overrides):
        taken = r"tasks\[\d+\]\.limit" if override.kind == "limit" else re.escape(override.field)
        if re.fullmatch(rf"{taken}([.\[].*)?", field):
            return f"{source}: {override.shown}: {line.removeprefix(f'{source}: ')}"
    return line


def blame(err: UserError, source: str, overrides: list[Override]) -> UserError:
    """``err`` (from parsing the overridden recipe) with each line naming the override it is about."""
    return several(UserError, [_blamed(line, source, overrides) for line in lines_of(err)])
