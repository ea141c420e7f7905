"""A package of one's own, written for a test into a temporary folder on ``sys.path`` (the one-file
extension tests: a method, tests/methods/test_one_file_method.py; a backend,
tests/members/test_one_file_backend.py), and forgotten afterwards."""

import sys
from pathlib import Path


def write_package(root: Path, monkeypatch, name: str, modules: dict[str, str]) -> None:
    """The package ``name`` under ``root`` with these modules (module name -> source), importable."""
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    for module, source in modules.items():
        (package / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(root))


def forget_package(name: str, modules) -> None:
    """Drop the package and its modules from ``sys.modules``."""
    for module in (*(f"{name}.{m}" for m in modules), name):
        sys.modules.pop(module, None)
