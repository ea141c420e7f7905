"""The files a report command writes where the user says (``--out``): the path expanded as a shell
would (``~``, ``$VAR``), every target checked before the first is written, each written atomically
(``cache.atomic_write_text`` for text, ``write_with`` for a figure).

A folder where a file goes, a file where a folder goes or an unset variable is a user error (exit 2);
a folder that cannot be written is an environment fault (exit 1). Either way nothing is written.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from ensemble_bench.errors import EnvironmentFault, UserError
from ensemble_bench.settings import expand_path


def user_path(path: Path | str, option: str = "--out") -> Path:
    """``path`` expanded as ``settings.expand_path`` reads every user's path."""
    return expand_path(str(path), f"{option} {path}")


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
