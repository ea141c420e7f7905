"""The wheel carries every data file the package reads: pyproject's package-data globs cover each
non-Python file under ensemble_bench/ and each file name the code opens beside a module, and every
glob names a file that exists. Parses pyproject.toml and globs; no wheel build."""

import ast
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ensemble_bench"


def package_data_globs() -> list[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return pyproject["tool"]["setuptools"]["package-data"]["ensemble_bench"]


def covered_files() -> set[Path]:
    return {path for pattern in package_data_globs() for path in PACKAGE.glob(pattern) if path.is_file()}


def data_files_in_tree() -> set[Path]:
    """Every non-Python file under the package (bytecode caches aside)."""
    return {path for path in PACKAGE.rglob("*")
            if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts}


def files_named_beside_modules() -> set[Path]:
    """String literals in the code that name an existing file in the module's own folder or below
    (how ``Path(__file__).parent / "layouts.yaml"`` reads its data); paths outside the package
    (e.g. ``"/etc/ld.so.cache"`` in a sandbox's allow-list) are not the package's data."""
    named = set()
    for module in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and 0 < len(node.value) < 200:
                if "." not in node.value or "\n" in node.value or "\0" in node.value:
                    continue
                candidate = (module.parent / node.value).resolve()  # an absolute string stays itself
                if candidate.is_file() and candidate.suffix != ".py" and candidate.is_relative_to(PACKAGE):
                    named.add(candidate)
    return named


def test_every_glob_matches_an_existing_file():
    for pattern in package_data_globs():
        assert any(PACKAGE.glob(pattern)), f"package-data names {pattern!r}, which matches no file"


def test_every_data_file_is_in_the_wheel():
    missing = (data_files_in_tree() | files_named_beside_modules()) - covered_files()
    assert not missing, f"not in [tool.setuptools.package-data]: {sorted(str(p.relative_to(PACKAGE)) for p in missing)}"


def test_the_code_reads_the_tables_data():
    data_files = {PACKAGE / "report" / "layouts.yaml", PACKAGE / "report" / "paper_numbers.csv"}
    assert data_files <= files_named_beside_modules()


def test_the_task_templates_are_in_the_wheel():
    templates = set((PACKAGE / "tasks" / "templates").glob("*.yaml"))
    assert templates and templates <= covered_files()
