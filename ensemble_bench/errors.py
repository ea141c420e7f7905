"""Expected faults: one clear line, a meaningful exit code, no traceback (see cli/main.py).

Exit codes: 0 done; 1 a regression (``ensbench regress``) or an environment fault; 2 a user error;
70 a bug in ensbench (the traceback is printed); 130 interrupted.
"""

import errno
import os
import sqlite3
from pathlib import Path


class UserError(Exception):
    """A mistake in the user's input (recipe, model name, data); printed as one line."""

    exit_code = 2


class EnvironmentFault(Exception):
    """The machine or stored state, not the input: disk full, read-only or missing folder, no network,
    no such device, a damaged file of an earlier run. One line saying what to do; exit code 1."""

    exit_code = 1


def several(kind: type[Exception], lines: list[str]) -> Exception:
    """One fault made of several lines (every mistake of a recipe at once, like torchtune's
    ConfigError): ``str`` joins them; the command line prints each as its own ``error:`` line."""
    fault = kind("\n".join(lines))
    fault.lines = tuple(lines)
    return fault


def lines_of(fault: Exception) -> tuple[str, ...]:
    """The lines to print for ``fault``: those of ``several``, or its message as one line."""
    return getattr(fault, "lines", None) or (str(fault),)


NETWORK_CLASSES = {"ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout", "gaierror", "OfflineModeIsEnabled",
                   "LocalEntryNotFoundError"}
DISK_FULL = "disk full{where}: free space on that disk (or set output: to another disk) and run the same command again"
CACHE_DISK_FULL = ("disk full{where}: free space on the disk of ENSBENCH_CACHE (or set ENSBENCH_CACHE to a folder on "
                   "another disk) and run the same command again")
NOT_WRITABLE = ("cannot write{where}: {why} (read-only, or not writable by this user): make it writable, or set "
                "output: (results) or ENSBENCH_CACHE (models and data) to a writable folder")
# sqlite's own verdicts that a file is not a sound database: the only ones that call a cache damaged
DAMAGED_SQLITE = ("file is not a database", "database disk image is malformed")
# A row's response cache is CACHE/<row>CACHE_DB_SUFFIX in its run folder (lm-eval appends _rank<n>.db to the name it
# is given): defined here, below every other module, so that run/folder.py's cache_db and DAMAGED_CACHE read one name.
CACHE = "cache"
CACHE_DB_SUFFIX = "_rank0.db"
DAMAGED_CACHE = ("a response cache database of the run is damaged ({why}): remove the run's "
                 f"{CACHE}/<row>{CACHE_DB_SUFFIX} (its answers are recomputed) and run the same command again")
READ_ONLY_SQLITE = ("readonly database", "unable to open database file")
CACHE_NOT_WRITABLE = ("cannot write a response cache database of the run ({why}): its file or folder is read-only "
                      "or not writable by this user: make the run folder writable and run the same command again")
CACHE_UNUSABLE = ("a response cache database of the run could not be used ({why}): check its disk and that no other "
                  "program holds it, then run the same command again")

def causes(err: BaseException) -> list[BaseException]:
    """``err`` and the exceptions it was raised from or while handling (at most ten)."""
    chain = [err]
    while len(chain) < 10 and (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None and nxt not in chain:
        chain.append(nxt)
    return chain


def _fault_of(err: BaseException) -> EnvironmentFault | None:
    where = f" ({err.filename})" if isinstance(err, OSError) and err.filename else ""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if isinstance(err, OSError) and err.errno == errno.ENAMETOOLONG:
        name = str(err.filename or "")
        shown = f" ({name[:60]}...)" if len(name) > 60 else f" ({name})" if name else ""
        return EnvironmentFault(f"a file name is too long for the file system{shown}: use a shorter name or path")
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT) or "database or disk is full" in text:
        return EnvironmentFault(disk_full_line(where, getattr(err, "filename", None)))
    if isinstance(err, OSError) and err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return EnvironmentFault(NOT_WRITABLE.format(where=where, why=err.strerror or text))
    if isinstance(err, sqlite3.DatabaseError) and (message := _sqlite_message(err, text)):
        return EnvironmentFault(message.format(why=text))
    # a broken pipe is a ConnectionError to Python, not the network (stdout's is handled by cli/main.py)
    if not isinstance(err, BrokenPipeError) and NETWORK_CLASSES & {cls.__name__ for cls in type(err).__mro__}:
        return EnvironmentFault(f"network unavailable ({text}): check the connection, or use data: offline "
                                "and local or packaged models")
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return EnvironmentFault("out of memory: lower batch_size, or use fewer, smaller or quantized members")
    return None


CACHE_ROOTS: set[Path] = set()  # the ENSBENCH_CACHE folders read so far (settings.cache_root adds each)


def disk_full_line(where: str, path) -> str:
    """The line for a full disk: the cache's (ENSBENCH_CACHE) when ``path`` is in it, else the output's."""
    try:
        found = Path(os.path.abspath(path)) if path is not None else None
    except (TypeError, ValueError):
        found = None
    in_cache = found is not None and any(found.is_relative_to(root) for root in CACHE_ROOTS)
    return (CACHE_DISK_FULL if in_cache else DISK_FULL).format(where=where)


def _sqlite_message(err: sqlite3.DatabaseError, text: str) -> str | None:
    """Damaged only when sqlite itself found the file unsound; read-only is never called damaged; a
    misuse of the sqlite API (not an OperationalError) is a bug."""
    if any(verdict in text for verdict in DAMAGED_SQLITE):
        return DAMAGED_CACHE
    if any(sign in text for sign in READ_ONLY_SQLITE):
        return CACHE_NOT_WRITABLE
    return CACHE_UNUSABLE if isinstance(err, sqlite3.OperationalError) else None


def environment_fault(err: BaseException) -> EnvironmentFault | None:
    """The expected environment fault (disk full, read-only folder, damaged cache, no network, out of
    memory) behind an exception a library raised, or None: then it is a bug."""
    return next((fault for cause in causes(err) if (fault := _fault_of(cause)) is not None), None)


def working_folder_fault() -> EnvironmentFault | None:
    """The fault of a working folder that no longer exists (deleted while a shell was in it), or None.
    Checked before torch loads: its oneMKL dies there with a line that does not say why."""
    try:
        os.getcwd()
    except OSError as err:
        return EnvironmentFault(f"the working folder cannot be found ({err.strerror or err}; deleted while this "
                                "shell was in it?): cd to an existing folder and run the same command again")
    return None
