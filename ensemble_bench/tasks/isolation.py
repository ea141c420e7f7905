"""Isolating model-written programs with what Linux offers without root (see docs/code_execution.md).

Three levels, the strongest that works here chosen at run time by trying it once (``detect``):

- ``network+filesystem``: ``unshare`` (util-linux) puts the program in new user, network, mount and
  PID namespaces. A shell script inside builds a root of its own on a tmpfs: the system directories
  (/usr, /bin, /lib ...) and the interpreter's installation bound read-only, the program's folder as
  /work (the only writable place besides a small private /tmp), /dev/null and friends, a fresh /proc;
  it pivots into that root, detaches the old one (so there is no way back), drops every capability
  and caps the number of processes. No network interfaces but a loopback that is down.
- ``network``: new user, network and PID namespaces only (the filesystem is the user's).
- ``none``: a plain subprocess (resource limits, timeout and process-group kill only).

Every level keeps the resource limits of ``code_exec`` and its timeout. In the namespace levels the
program is PID 1 of its own PID namespace: when it exits or is killed, the kernel kills every process
it left behind. When the run is root, the sandbox runs as ``nobody`` (65534), so that the process cap
holds (the kernel does not count processes of root) and nothing is reachable through root's rights.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

LEVELS = ("none", "network", "network+filesystem")
MAX_PROCESSES = 64  # per sandbox (namespace levels only)
NOBODY = 65534
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache",
                "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime")
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
PROBE_TIMEOUT_S = 20.0

# Runs inside the new namespaces as the namespace's root: $1 the new root (an empty folder), $2 the
# program's folder, $3 the process cap, then paths to bind read-only, "--", paths to hide (tmpfs over
# them where a bound tree contains them), "--", the command. Any failure exits non-zero (set -e).
SETUP_SCRIPT = r"""
set -eu
r=$1; w=$2; n=$3; shift 3
mount -t tmpfs -o size=4m,mode=755,nosuid,nodev ensbench "$r"
ro() { mount -o remount,bind,ro,nosuid,nodev "$1" 2>/dev/null || mount -o remount,bind,ro,nosuid,nodev,noexec "$1"; }
while [ "$1" != "--" ]; do
  p=$1; shift
  if [ -L "$p" ]; then mkdir -p "$r$(dirname "$p")"; ln -s "$(readlink "$p")" "$r$p"
  elif [ -d "$p" ]; then mkdir -p "$r$p"; mount --rbind "$p" "$r$p"; ro "$r$p"
  elif [ -e "$p" ]; then mkdir -p "$r$(dirname "$p")"; : > "$r$p"; mount --bind "$p" "$r$p"; ro "$r$p"
  fi
done
shift
while [ "$1" != "--" ]; do
  if [ -d "$r$1" ]; then mount -t tmpfs -o size=4k,mode=000,ro ensbench "$r$1"; fi
  shift
done
shift
mkdir -p "$r/tmp" "$r/work" "$r/dev" "$r/proc" "$r/.old"
mount -t tmpfs -o size=64m,nosuid,nodev ensbench "$r/tmp"
mount --bind "$w" "$r/work"
for d in null zero full random urandom; do : > "$r/dev/$d"; mount --bind "/dev/$d" "$r/dev/$d"; done
mount -t proc -o nosuid,nodev,noexec proc "$r/proc" 2>/dev/null || true
cd "$r"
pivot_root . .old
umount -l /.old
mount -o remount,bind,ro,nosuid,nodev /
cd /work
exec /usr/bin/env -i PATH=/usr/bin:/bin setpriv --bounding-set=-all --inh-caps=-all --no-new-privs \
  prlimit --nproc="$n:$n" -- "$@"
"""


@dataclass(frozen=True)
class Sandbox:
    """How programs run here: the isolation level, the interpreter, and why not more."""

    level: str = "none"
    python: str = sys.executable
    missing: str = ""  # why the next level up is not available ("" at the top)
    hidden: tuple[str, ...] = field(default=())  # folders kept out of the filesystem view

    def command(self, folder: str, argv: list[str]) -> list[str]:
        """The command that runs ``argv`` (interpreter first) in ``folder`` at this level."""
        if self.level == "none":
            return argv
        drop = _drop_root()
        if self.level == "network":
            return [*drop, "unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child",
                    "prlimit", f"--nproc={MAX_PROCESSES}:{MAX_PROCESSES}", "--", *argv]
        root, work = os.path.join(folder, "root"), os.path.join(folder, "work")
        prefix = _prefix(self.python)
        binds = [*SYSTEM_PATHS, *([] if _under(prefix, SYSTEM_PATHS) else [prefix])]
        hide = [h for h in self.hidden if _under(h, binds)]
        return [*drop, "unshare", "--user", "--map-root-user", "--net", "--mount", "--pid", "--fork",
                "--kill-child", "/bin/sh", "-c", SETUP_SCRIPT, "ensbench-sandbox", root, work, str(MAX_PROCESSES),
                *binds, "--", *hide, "--", *argv]

    def workdir(self, folder: str) -> str:
        """Where the program's files go on this side (its working directory inside)."""
        return os.path.join(folder, "work") if self.level == "network+filesystem" else folder

    def prepare(self, folder: str) -> None:
        """Make ``folder`` usable by the sandbox's user (``nobody`` when the run is root)."""
        if self.level == "network+filesystem":
            for sub in ("root", "work"):
                os.makedirs(os.path.join(folder, sub), exist_ok=True)
        if self.level != "none" and _drop_root():
            for top, _, files in os.walk(folder):
                for path in (top, *(os.path.join(top, name) for name in files)):
                    os.chown(path, NOBODY, NOBODY)

    def describe(self) -> str:
        """One line for the start of a run."""
        if self.level == "network+filesystem":
            return f"code execution isolation: {self.level} (no network, no home or project folder; {self.python})"
        return f"code execution isolation: {self.level} ({self.missing})"


def _drop_root() -> list[str]:
    """As root: run the sandbox as nobody (setpriv), so the process cap holds."""
    if os.geteuid() == 0 and shutil.which("setpriv"):
        return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    return []


def _under(path: str, trees) -> bool:
    """Whether ``path`` is one of ``trees`` or inside one."""
    return any(path == tree or path.startswith(tree.rstrip("/") + "/") for tree in trees)


def _prefix(python: str) -> str:
    """The installation folder of an interpreter (bound read-only into the view)."""
    return str(Path(python).resolve().parent.parent)


def _hidden() -> tuple[str, ...]:
    """Home and project folders (and the current one): never in the view, even under a bound tree."""
    import ensemble_bench

    project = Path(ensemble_bench.__file__).resolve().parent.parent
    paths = {str(Path.home().resolve()), str(project), str(Path.cwd().resolve())}
    return tuple(sorted(p for p in paths if p != "/"))


def _interpreters() -> list[str]:
    """Candidate interpreters for the filesystem view: this run's base Python, then the system's."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    found = [str(Path(base).resolve())] + [str(Path(p).resolve()) for p in SYSTEM_PYTHONS if os.path.exists(p)]
    return list(dict.fromkeys(found))


def _works(box: Sandbox) -> str:
    """'' when ``box`` runs a trivial program that can write its own folder; else the error's last line."""
    with tempfile.TemporaryDirectory(prefix="ensbench-probe-") as folder:
        box.prepare(folder)
        argv = [box.python, "-I", "-c", "open('probe', 'w').write('ok')"]
        try:
            done = subprocess.run(box.command(folder, argv), cwd=box.workdir(folder), capture_output=True,
                                  text=True, timeout=PROBE_TIMEOUT_S, env={"PATH": os.environ.get("PATH", "")})
        except (OSError, subprocess.TimeoutExpired) as err:
            return str(err)
        if done.returncode == 0 and os.path.exists(os.path.join(box.workdir(folder), "probe")):
            return ""
        lines = (done.stderr or done.stdout).strip().splitlines()
        return lines[-1] if lines else f"exit status {done.returncode}"


@functools.lru_cache(maxsize=1)
def detect() -> Sandbox:
    """The strongest isolation that works on this machine (tried once per process)."""
    if not sys.platform.startswith("linux"):
        return Sandbox(missing=f"no Linux namespaces on {sys.platform}")
    if not shutil.which("unshare"):
        return Sandbox(missing="no unshare command (util-linux)")
    hidden, why = _hidden(), {}
    for level in ("network+filesystem", "network"):
        for python in _interpreters():
            box = Sandbox(level, python, "", hidden)
            failed = _works(box)
            if not failed:
                missing = f"no filesystem view: {why['network+filesystem']}" if level == "network" else ""
                return Sandbox(level, python, missing, hidden)
            why.setdefault(level, failed)  # the first interpreter's (this run's own Python) reason
    return Sandbox(missing=f"unshare cannot create user and network namespaces here: {why['network']}")
