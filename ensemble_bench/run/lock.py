"""One writer per recipe: an operating-system lock on ``<output>/.<recipe>.lock``, held for a whole run.

The lock is ``fcntl.flock`` on the open file: two processes racing for it cannot both win, and the
system releases it when its holder ends, however it ends (SIGKILL included). The file records the
holder's pid, host and start time for the message a refused run prints, nothing more. A record
left behind by a holder that ended without clearing it (killed) is stale: the next run on that host
takes the lock over with one note. The file itself is never deleted or replaced: a new file would
be a second lock beside the one that earlier processes still hold. It lies beside the recipe's
folder, not in it, so that folder holds run folders only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ensemble_bench.errors import EnvironmentFault

RECORD_WAIT_S = 1.0  # how long a refused run waits for the winner's record (written just after it wins)


def _this_holder() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}


def _alive(pid) -> bool:
    """Whether a process with this pid runs on this host (one of another user counts)."""
    if type(pid) is not int or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


def _gone_here(record: dict) -> bool:
    """Whether the recorded holder was a process of this host that has ended."""
    return record.get("host") == socket.gethostname() and not _alive(record.get("pid"))


def _read_record(fd: int) -> dict | None:
    try:
        record = json.loads(os.pread(fd, 4096, 0))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _current_record(fd: int) -> dict | None:
    """The winner's record, as a refused run sees it: written just after the winner got the lock, so
    an empty file, or the record of an ended holder, is waited on for up to RECORD_WAIT_S."""
    deadline = time.monotonic() + RECORD_WAIT_S
    record = _read_record(fd)
    while (record is None or _gone_here(record)) and time.monotonic() < deadline:
        time.sleep(0.05)
        record = _read_record(fd)
    return record


def _describe(record: dict | None) -> str:
    if record is None:
        return "a process that has not recorded itself"
    return f"pid {record.get('pid')} on host {record.get('host')} since {record.get('since')}"


def _write_record(fd: int, record: dict) -> None:
    data = json.dumps(record).encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


def _refusal(path: Path, record: dict | None) -> EnvironmentFault:
    holder = _describe(record)
    if record is not None and _gone_here(record):  # its lock passed to a child process it forked
        holder += " (ended, but a process it started still holds the lock: end that process)"
    return EnvironmentFault(f"another ensbench run of this recipe is running ({holder}; lock {path}): "
                            "wait for it to finish, then run the same command again")


def _take(fd: int, path: Path) -> None:
    """Claim the lock on ``fd`` or raise the one-line refusal; note a stale record taken over."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _refusal(path, _current_record(fd)) from None
    stale = _read_record(fd)
    if stale is not None and stale.get("host") != socket.gethostname():
        raise EnvironmentFault(f"the run lock {path} was last held by {_describe(stale)}, another host, whose "
                               "process this host cannot check: if that run has ended, remove this lock file "
                               "(it holds no results) and run the same command again")
    if stale is not None:
        print(f"note: taking over the stale run lock {path} of {_describe(stale)} (that process has ended)",
              file=sys.stderr, flush=True)
    _write_record(fd, _this_holder())


def lock_path(output: Path, recipe_name: str) -> Path:
    """The run lock of the recipe named ``recipe_name`` whose runs go to ``output``/``recipe_name``."""
    return output / f".{recipe_name}.lock"


@contextmanager
def hold_run_lock(path: Path) -> Iterator[None]:
    """Hold the lock file ``path`` (created, with its folder, if missing) for the ``with`` block, or
    raise EnvironmentFault in one line naming the holder (pid, host, since when), changing nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _take(fd, path)
        try:
            yield
        finally:
            _clear(fd)
    finally:
        os.close(fd)  # releases the lock


def _clear(fd: int) -> None:
    """Empty the record at the end of a run; if the disk refuses, the record left is merely stale."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
