"""The files a report command writes where the user says (``--out``): the path expanded as a shell
would (``~``, ``$VAR``), every target checked before the first is written, each written atomically
(``cache.atomic_write_text`` for text, ``write_with`` for a figure).

A folder where a file goes, a file where a folder goes or an unset variable is a user error (exit 2);
a folder that cannot be written is an environment fault (exit 1). Either way nothing is written.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from ensemble_bench.errors import EnvironmentFault, UserError

VARIABLE = re.compile(r"\$(?:\{([^}]*)\}|(\w+))")


def user_path(path: Path | str, option: str = "--out") -> Path:
    """``path`` with a leading ``~`` and every ``$VAR`` / ``${VAR}`` expanded; an unset or empty
    variable, or a ``~user`` of no user, is refused rather than becoming a literal folder name."""
    text = str(path)
    for match in VARIABLE.finditer(text):
        name = match.group(1) if match.group(1) is not None else match.group(2)
        if not os.environ.get(name):
            raise UserError(f"{option} {text}: ${name} is not set (set it, or give the path itself)")
    expanded = os.path.expanduser(os.path.expandvars(text))
    if expanded.startswith("~"):
        raise UserError(f"{option} {text}: no such user's home folder for {expanded.split('/')[0]}")
    return Path(expanded)


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def checked_files(stem: Path, suffixes: Sequence[str], option: str = "--out") -> list[Path]:
    """The files ``<stem><suffix>`` (``""`` for ``stem`` itself), refused together if any one of them
    cannot be written: a folder is there, a file lies on the way, or the folder is not writable."""
    if stem.name in ("", ".", ".."):
        raise UserError(f"{option} {stem}: give a file name, not a folder")
    targets = [stem.with_name(stem.name + suffix) for suffix in suffixes]
    for target in targets:
        if target.is_dir():
            raise UserError(f"{option}: {target} is a folder; give a file name (or another path)")
        existing = _nearest_existing(target.parent.absolute())
        if not existing.is_dir():
            raise UserError(f"{option}: {existing} is not a folder, so {target} cannot be written")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise EnvironmentFault(f"cannot write ({target}): {existing} is not writable: choose another {option}")
    return targets


def write_with(target: Path, save: Callable[[Path], None]) -> None:
    """``save(temporary)`` in the target's folder, then renamed onto ``target`` (e.g. a figure)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    try:
        save(partial)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
