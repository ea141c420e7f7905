"""Every environment variable ensbench reads, read and checked here.

A bad value is one line naming the variable and what it allows (``UserError``, exit 2). An empty
value counts as unset. Paths have ``~`` and ``$VAR`` expanded; one naming a variable that is not set
is refused rather than becoming a literal ``$VAR`` folder. Nothing here runs at import time.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from ensemble_bench.errors import CACHE_ROOTS, EnvironmentFault, UserError

CACHE = "ENSBENCH_CACHE"                    # where models, data and derived caches are kept
THREADS = "ENSBENCH_THREADS"                # default of `ensbench run --threads`
BBH_DIR = "ENSBENCH_BBH_DIR"                # a folder of BIG-Bench-Hard <task>.json files
YES = ("1", "true", "yes", "on")  # how the Hugging Face libraries read a switch that is on
HUB_OFFLINE = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")        # the Hugging Face libraries' own switches
DEFAULT_CACHE = Path("~/.cache/ensbench")
_VARIABLE = re.compile(r"\$(?:\{([^}]*)\}|(\w+))")  # $NAME or ${NAME}, as os.path.expandvars reads them


def raw(name: str) -> str | None:
    """The variable's value without surrounding blanks; None when unset or empty."""
    value = os.environ.get(name, "").strip()
    return value or None


def expand_path(text: str, what: str) -> Path:
    """``text`` with a leading ``~`` and every ``$VAR`` / ``${VAR}`` expanded: the one reading of a
    user's path (the ENSBENCH_* folders, a recipe's ``output:``, ``--out``). An unset or empty
    variable, or the ``~name`` of no user, is refused in one line (``what`` says where the path
    came from) rather than becoming a literal folder name."""
    for match in _VARIABLE.finditer(text):
        name = match.group(1) if match.group(1) is not None else match.group(2)
        if not os.environ.get(name):
            raise UserError(f"{what}: ${name} is not set: set it or write the path out")
    expanded = os.path.expanduser(os.path.expandvars(text))
    if expanded.startswith("~"):
        raise UserError(f"{what}: no home folder for '{expanded.split('/')[0]}': write the path out")
    if problem := unnameable(expanded):
        raise UserError(f"{what}: {problem}")
    return Path(expanded)


def unnameable(path: str) -> str | None:
    """Why ``path`` cannot name a file here: a character the file system encoding of this locale lacks
    (``LC_ALL=C`` with ``PYTHONUTF8=0`` is ASCII), or None. A name read from the command line or the
    environment always can (its undecodable bytes are kept as surrogates)."""
    try:
        os.fsencode(path)
    except UnicodeEncodeError:
        return (f"this locale's file name encoding ({sys.getfilesystemencoding()}) cannot write this path: "
                "use a UTF-8 locale (LC_ALL=C.UTF-8, or PYTHONUTF8=1) or an ASCII path")
    return None


def threads() -> int:
    """``$ENSBENCH_THREADS``: torch CPU threads, 0 (the default) leaves torch's own choice."""
    value = raw(THREADS)
    if value is None:
        return 0
    if not value.isdecimal():
        raise UserError(f"{THREADS}={value!r}: must be a non-negative integer (0 or unset: torch's default)")
    return int(value)


def hub_offline() -> str | None:
    """The first of HF_DATASETS_OFFLINE / HF_HUB_OFFLINE that is switched on, or None. Read leniently
    (an unknown value counts as off), as the Hugging Face libraries read them."""
    return next((name for name in HUB_OFFLINE if (raw(name) or "").lower() in YES), None)


def hub_models_offline() -> bool:
    """Whether HF_HUB_OFFLINE is switched on (models then load only from the local hub cache); read
    leniently, as huggingface_hub reads it."""
    return (raw(HUB_OFFLINE[1]) or "").lower() in YES


def bbh_dir() -> Path | None:
    """``$ENSBENCH_BBH_DIR`` expanded, None when unset; UserError when it is set but not a folder."""
    value = raw(BBH_DIR)
    if value is None:
        return None
    folder = expand_path(value, f"{BBH_DIR}={value}")
    if not folder.is_dir():
        raise UserError(f"{BBH_DIR}={value}: not a folder (it must hold BIG-Bench-Hard <task>.json files)")
    return folder


def cache_root() -> Path:
    """``$ENSBENCH_CACHE`` (default ``~/.cache/ensbench``), expanded and created if missing.

    UserError when the variable names a file (or a path through one); EnvironmentFault when the
    folder cannot be created for another reason (read-only disk, no permission)."""
    value = raw(CACHE)
    root = expand_path(value, f"{CACHE}={value}") if value else DEFAULT_CACHE.expanduser()
    shown = f"{CACHE}={value}" if value else f"the cache folder {root} (set {CACHE} to use another)"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UserError(f"{shown}: is a file, or a path through a file: {CACHE} must name a folder") from None
    except OSError as err:
        raise EnvironmentFault(f"{shown}: cannot create it ({err.strerror or err}): "
                               f"set {CACHE} to a writable folder") from None
    CACHE_ROOTS.add(Path(os.path.abspath(root)))  # a full disk in it is named as the cache's (errors.disk_full_line)
    return root


def check_environment() -> None:
    """Read every variable once, so that a bad value stops a command before anything is loaded
    (ENSBENCH_THREADS is read only as the default of ``--threads``: an explicit option overrides it)."""
    cache_root()
    bbh_dir()
