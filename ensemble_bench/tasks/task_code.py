"""The Python a task's YAML makes lm-eval import and run when the task loads, found without importing it.

A ``!function mod.fn`` in a task YAML, or in any file it includes, is resolved by lm-eval 0.4.13
(``lm_eval.tasks._yaml_loader._import_func_in_yml``) as follows, and :func:`task_code` follows it alike:

1. the YAML's path with its links resolved; its folder is where ``mod`` is looked for;
2. ``(folder / mod.replace('.', '/') + '.py').resolve()``: beside it, in a subfolder, or anywhere at all
   when ``mod`` is an absolute path (``!function /abs/evil.fn``); a link is followed to its real file.
   If that file exists, lm-eval loads it;
3. otherwise ``__import__(mod)``: a module on ``sys.path``.

``include:`` chains are followed to any depth (``task_sources.include_chain``: relative to the including
file's real folder, or absolute). Every module found is task code that needs consent, wherever it lies,
unless it is installed code: the Python installation's own library folders, or the lm-eval and
ensemble_bench packages (lm-eval's own tasks import their ``utils.py``).
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os
import site
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ensemble_bench.tasks.task_sources import include_chain


@dataclass(frozen=True)
class TaskCode:
    """One module a task runs: the real file, the YAML naming it, the reference as written, the YAML the
    task starts from (when the reference sits in a file it includes), and the path as named when that is
    a link to elsewhere."""

    module: Path
    task_yaml: Path
    reference: str
    entry: Path
    link: Path | None = None

    def origin(self) -> str:
        """``!function utils.fn in task.yaml`` (or ``in /elsewhere/base.yml, included by task.yaml``)."""
        where = self.task_yaml.name if self.task_yaml == self.entry else \
            f"{self.task_yaml}, included by {self.entry.name}"
        return f"!function {self.reference} in {where}"

    def shown(self) -> str:
        """The module's file, and the link that leads to it."""
        return f"{self.module}" + (f" (through the link {self.link})" if self.link else "")


@functools.cache
def _installed_roots() -> tuple[Path, ...]:
    """The folders of installed code: the Python installation's library folders (standard library,
    site-packages, the user's site-packages) and the lm-eval and ensemble_bench packages."""
    import lm_eval

    import ensemble_bench

    paths = sysconfig.get_paths()
    found = [paths.get(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")]
    found += [*site.getsitepackages(), site.getusersitepackages()]
    found += [Path(lm_eval.__file__).parent, Path(ensemble_bench.__file__).parent]
    return tuple(dict.fromkeys(Path(p).resolve() for p in found if p))


def is_installed(path: Path) -> bool:
    """Whether ``path`` (resolved) is installed code rather than a task's own."""
    return any(path.is_relative_to(root) for root in _installed_roots())


def _module_file(name: str) -> Path | str | None:
    """Where ``import name`` would load from, found without running any module: its file, ``built-in``
    (compiled in, frozen, or a namespace package), or None when nothing of that name can be imported."""
    parts = name.split(".")
    spec, search = None, None
    for k in range(len(parts)):
        qualified = ".".join(parts[:k + 1])
        loaded = sys.modules.get(qualified)
        try:
            spec = loaded.__spec__ if loaded is not None else importlib.util.find_spec(qualified) if k == 0 \
                else importlib.machinery.PathFinder.find_spec(qualified, search)
        except (ImportError, ValueError, AttributeError):
            return None
        if spec is None or (k < len(parts) - 1 and spec.submodule_search_locations is None):
            return None
        search = list(spec.submodule_search_locations or [])
    return Path(spec.origin).resolve() if spec.has_location and spec.origin else "built-in"


def resolve_function(reference: str, task_yaml: Path) -> tuple[Path | str | None, Path | None]:
    """Where ``!function reference`` in ``task_yaml`` (its real path) loads from, as lm-eval resolves it: the
    file (its real path), ``built-in``, or None (nowhere: lm-eval fails the task); and the path as named
    when that is a link."""
    module, _, _ = reference.rpartition(".")
    if not module:
        return None, None
    named = Path(os.path.normpath(task_yaml.parent / f"{module.replace('.', '/')}.py"))
    real = named.resolve()
    if real.exists():
        return real, (named if real != named else None)
    return _module_file(module), None


def task_code(task_yamls: Iterable[Path]) -> tuple[list[TaskCode], list[str]]:
    """The modules outside installed code that the ``!function`` entries of ``task_yamls``, and of every file
    they include, make lm-eval import; and one line per reference to a module found nowhere, or per
    include chain that cannot be followed (a file lm-eval must not open, a chain too long)."""
    code: dict[Path, TaskCode] = {}
    problems = []
    for start in task_yamls:
        entry = start.expanduser().resolve()
        if is_installed(entry):  # lm-eval's own task YAML: it includes and imports installed files only
            continue
        try:
            for found in include_chain(start):
                for reference in found.functions:
                    where, link = resolve_function(reference, found.path)
                    if where is None:
                        problems.append(f"'{found.path}': !function {reference}: no module "
                                        f"{reference.rpartition('.')[0] or reference!r} beside it nor installed")
                    elif isinstance(where, Path) and not is_installed(where):
                        code.setdefault(where, TaskCode(where, found.path, reference, entry, link))
        except ValueError as err:
            problems.append(str(err))
    return sorted(code.values(), key=lambda c: str(c.module)), problems


__all__ = ["TaskCode", "is_installed", "resolve_function", "task_code"]
