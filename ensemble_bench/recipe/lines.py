"""A recipe's mistakes as one-line errors: pydantic's validation errors as ``<file>: <field>: <what is
allowed>`` lines (of a union's branches, the telling one; an unknown field with the close field names), and
the rule for every name that becomes a file or folder name."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from ensemble_bench.errors import UserError, lines_of
from ensemble_bench.recipe.field_names import close_fields

# every name that becomes a file or folder name (recipe, member, row): no separators, no leading dot
LABEL = r"^[A-Za-z0-9][A-Za-z0-9._=+-]*$"
SAFE_NAME = "letters, digits and . _ = + - (starting with a letter or digit)"


def is_safe_label(label: str) -> bool:
    """Whether ``label`` is safe as one path component inside a run folder."""
    return bool(re.fullmatch(LABEL, label)) and len(label) <= 200


def field_path(loc, prefix: str = "") -> str:
    """A field's location as a recipe writes it: ``('members', 0, 'dtype')`` -> ``members[0].dtype``."""
    path = prefix
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "recipe"


PLAIN_BRANCHES = ("int", "str", "float", "bool", "none")  # pydantic's tags of the plain branches of a union


def _is_branch(part) -> bool:
    """Whether a part of an error's location is pydantic's tag of a union branch or a validator, not a field:
    ``list[float]``, ``literal['auto']``, ``function-after[...]``, or a plain type (``int | str``: 'int', 'str')."""
    return isinstance(part, str) and ("[" in part or part.startswith("function-") or part in PLAIN_BRANCHES)


def _branch_error(error: dict, field: tuple) -> bool:
    """Whether ``error`` is about one branch of the union ``field`` (pydantic tags the branches of
    ``Literal[...] | list[float]`` as 'literal[...]' and 'list[float]')."""
    loc = error["loc"]
    return len(loc) > len(field) and loc[:len(field)] == field and _is_branch(loc[len(field)])


def _wrong_type(error: dict) -> bool:
    return error["type"] == "literal_error" or error["type"].endswith("_type")


def _telling_error(errors: list) -> dict:
    """The error to report: the first; or, when it only says the input is not of one branch of a
    union (``weights: [.nan, 1]`` is not 'average'), the error of a branch that took the input's type;
    when no branch took it (``proposer: true``), one error saying every type the field takes."""
    first = errors[0]
    field = first["loc"][:-1]
    if not (_wrong_type(first) and _branch_error(first, field)):
        return first
    telling = next((e for e in errors if _branch_error(e, field) and not _wrong_type(e)), None)
    if telling is not None:
        return telling
    wanted = dict.fromkeys(e["msg"].removeprefix("Input should be ") for e in errors if _branch_error(e, field))
    return {**first, "msg": "Input should be " + " or ".join(wanted)}


def _shortened(text: str, most: int = 80) -> str:
    """``text`` cut to ``most`` characters (a 1 MiB value stays a readable line)."""
    return text if len(text) <= most else text[:most - 3] + "..."


def _error_line(source: str, error: dict, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """One pydantic error as ``<file>: <field path>: <message> (got <value>)``; an unknown field of
    ``model`` names the close field names (did you mean)."""
    loc = [p for p in error["loc"] if not _is_branch(p)]
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        close = close_fields(model, loc)
        message = "unknown field" + (f" (did you mean {' or '.join(repr(name) for name in close)}?)" if close else "")
    if error["type"] == "string_pattern_mismatch" and loc and loc[-1] in ("name", "label"):
        message = f"not a safe folder name: use {SAFE_NAME}, no path separators"
    given = error.get("input")
    shown = "" if error["type"] in ("missing", "extra_forbidden") or isinstance(given, (dict, list)) else \
        f" (got {_shortened(repr(given))})"
    return f"{source}: {field_path(loc, prefix)}: {message}{shown}"


def _field_of(error: dict) -> tuple:
    """The field an error is about: its location up to the union branch it names, if any."""
    loc = error["loc"]
    return loc[:next((k for k, part in enumerate(loc) if _is_branch(part)), len(loc))]


def failed_fields(err: ValidationError) -> list[tuple]:
    """The fields pydantic's errors are about (their locations, a union branch's tag left out), each once."""
    return list(dict.fromkeys(_field_of(error) for error in err.errors()))


def pydantic_lines(source: str, err: ValidationError, prefix: str = "",
                    model: type[BaseModel] | None = None) -> list[str]:
    """Every mistake pydantic found, one line per field (of a union's branches, the telling one); ``model``:
    the validated model, whose field names an unknown field is matched against."""
    by_field: dict[tuple, list[dict]] = {}
    for error in err.errors():
        by_field.setdefault(_field_of(error), []).append(error)
    lines = [_error_line(source, _telling_error(errors), prefix, model) for errors in by_field.values()]
    return list(dict.fromkeys(lines))


def problems_of(check: Callable[[], Any], prefix: str = "") -> list[str]:
    """The lines of the UserError ``check`` raises, each after ``prefix`` (none when it passes)."""
    try:
        check()
    except UserError as err:
        return [prefix + line for line in lines_of(err)]
    return []
