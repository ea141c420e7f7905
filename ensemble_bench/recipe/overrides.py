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
from ensemble_bench.yaml_limits import MAX_RECIPE_BYTES, MAX_YAML_DEPTH, RecipeLimit, RecipeLoader

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
            cut = key if len(key) <= 40 else key[:39] + "…"
            raise UserError(f"{shown}: '{cut}' is not a field path (write it like method.weights or members[0].dtype)")
        parts += [m.group(1) if m.group(1) else int(m.group(2) or m.group(3)) for m in found]
    if isinstance(parts[0], int):
        raise UserError(f"{shown}: a field path starts with a field name, not an index")
    return tuple(parts)


SHOWN_CHARS = 100  # an override quoted in an error line is cut to this many characters


def _quoted(text: str) -> str:
    """``--set TEXT`` as an error line quotes it: on one line, at most SHOWN_CHARS long."""
    shown = f"--set {text}"
    return shown if len(shown) <= SHOWN_CHARS else shown[:SHOWN_CHARS - 1] + "…"


def _yaml_value(value: str, shown: str) -> Any:
    """``value`` read as YAML under the recipe file's limits (size, nesting, aliases written out)."""
    if len(value.encode("utf-8", "surrogatepass")) > MAX_RECIPE_BYTES:
        raise UserError(f"{shown}: the value is larger than {MAX_RECIPE_BYTES} bytes, the most a recipe may have")
    try:
        return yaml.load(value, Loader=RecipeLoader)  # noqa: S506 - a SafeLoader
    except RecipeLimit as err:
        raise UserError(f"{shown}: the value is past the recipe's YAML limits: {err.problem}") from None
    except (yaml.YAMLError, ValueError) as err:
        raise UserError(f"{shown}: the value is not valid YAML ({getattr(err, 'problem', None) or err})") from None


def parse_set(text: str) -> Override:
    """``key=value`` of ``--set``: the value read as YAML (``[2, 1]``, ``0.5``, ``true``, ``org/model``) with the
    recipe file's limits; a field path at most MAX_YAML_DEPTH fields deep."""
    shown = _quoted(text)
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise UserError(f"{shown}: write --set key=value (e.g. --set method.weights=[2,1])")
    path = _path(key.strip(), shown)
    if len(path) > MAX_YAML_DEPTH:
        raise UserError(f"{shown}: the field path is {len(path)} fields deep; a recipe nests at most {MAX_YAML_DEPTH}")
    return Override(path, _yaml_value(value, shown), shown)


def option_overrides(limit: int | None, tasks: str | None, batch_size: int | None,
                     output: str | None, seed: int | None = None) -> list[Override]:
    """The overrides of ``run``'s own options (``--tasks`` is applied by ``apply``: it selects tasks)."""
    found = [Override(("batch_size",), batch_size, f"--batch-size {batch_size}") if batch_size is not None else None,
             Override(("seed",), seed, f"--seed {seed}") if seed is not None else None,
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


SPEC_FIELDS = ("name", "label", "members", "paper_row")  # a method entry's own fields, not parameters


def _method_rows(data: dict, override: Override) -> bool:
    """Whether ``override`` sets ``method.X`` on a recipe that lists its methods (``methods:``)."""
    return (override.kind == "set" and override.path[0] == "method" and "method" not in data
            and isinstance(data.get("methods"), list))


def _takes(name: Any, parameter: Any) -> bool:
    """Whether the method ``name`` has the parameter ``parameter`` (False for an unknown method)."""
    from ensemble_bench.methods import method_spec

    try:
        return isinstance(name, str) and parameter in method_spec(name).Params.model_fields
    except UserError:
        return False


def _set_each_method(data: dict, override: Override) -> dict:
    """``method.X`` on a ``methods:`` recipe: X set on every method row whose method takes X; else a
    UserError of one line naming the row to write instead (``methods[0].X``)."""
    rows = [_as_mapping(entry) for entry in data["methods"]]
    names = [row.get("name") if isinstance(row, dict) else row for row in rows]
    rest = override.path[1:]
    taking = [i for i, row in enumerate(rows) if isinstance(row, dict) and _takes(row.get("name"), rest[0])] \
        if rest and rest[0] not in SPEC_FIELDS else []
    if not taking:
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in rest)
        value = override.shown.partition("=")[2]
        why = f"no method row takes '{rest[0]}'" if rest and rest[0] not in SPEC_FIELDS else "method is one of several"
        raise UserError(f"{override.shown}: this recipe lists its methods under 'methods:' "
                        f"({', '.join(map(str, names))}) and {why}: name the row, e.g. --set methods[0]{field}={value}")
    for i in taking:
        data = _set(data, ("methods", i, *rest), override.value, override.shown)
    return data


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
        elif _method_rows(data, override):
            data = _set_each_method(data, override)
        else:
            data = _set(data, override.path, override.value, override.shown)
    return data


def _blamed(line: str, source: str, overrides: list[Override]) -> str:
    """A recipe error line, naming the override that set the field it is about."""
    field = line.removeprefix(f"{source}: ").split(":", 1)[0]
    for override in reversed(overrides):
        taken = r"tasks\[\d+\]\.limit" if override.kind == "limit" else re.escape(override.field)
        if override.path[0] == "method":  # set on every row of a methods: list that takes it
            taken = r"(method|methods\[\d+\])" + taken[len("method"):]
        if re.fullmatch(rf"{taken}([.\[].*)?", field):
            return f"{source}: {override.shown}: {line.removeprefix(f'{source}: ')}"
    return line


def blame(err: UserError, source: str, overrides: list[Override]) -> UserError:
    """``err`` (from parsing the overridden recipe) with each line naming the override it is about."""
    return several(UserError, [_blamed(line, source, overrides) for line in lines_of(err)])
