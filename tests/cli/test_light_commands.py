"""Commands that load no model code: a dry run of a recipe (every method of compare_all.yaml checked
against its declaration) and ``ensbench list`` import neither torch, transformers nor lm-eval. Each
runs in a fresh interpreter, whose modules are then read (issue 48: a dry run took about 1.9 s, 1.4 s
of it torch's import)."""

import subprocess
import sys
from pathlib import Path

import pytest

from ensemble_bench.tasks.lm_eval_tasks import stock_index

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "lm_eval")
COMMAND = """\
import sys
from ensemble_bench.cli import main as cli
sys.argv = ["ensbench", *sys.argv[1:]]
try:
    cli.main()
    code = 0
except SystemExit as done:
    code = done.code
print("exit", code, "loaded", *[name for name in {heavy!r} if name in sys.modules])
"""


@pytest.fixture(scope="module", autouse=True)
def task_index():
    """lm-eval's task index, built once per lm-eval install (its indexer is lm-eval's code) and then read
    from the cache folder: built here first, as the first command after an install builds it
    (docs/limitations.md), so the commands below read it as every later command does."""
    stock_index()


def loaded_by(*args: str) -> tuple[int, list[str]]:
    """The exit code of ``ensbench ARGS`` in a fresh interpreter, and which of HEAVY it imported."""
    out = subprocess.run([sys.executable, "-c", COMMAND.format(heavy=HEAVY), *args], capture_output=True, text=True,
                         cwd=ROOT, timeout=120).stdout
    words = out.strip().splitlines()[-1].split()
    assert words[0] == "exit" and words[2] == "loaded", out
    return int(words[1]), words[3:]


@pytest.mark.parametrize("recipe", ["demo.yaml", "compare_all.yaml"])
def test_a_dry_run_imports_no_torch(recipe, tmp_path):
    assert loaded_by("run", str(ROOT / "recipes" / "offline" / recipe), "--dry-run", "--output", str(tmp_path)) == (
        0, [])


def test_list_imports_no_torch():
    assert loaded_by("list") == (0, [])


def test_building_a_method_imports_torch():
    """The check can fail: a method's implementation imports torch (as building a row does)."""
    build = COMMAND.format(heavy=HEAVY).replace("    cli.main()", "    from ensemble_bench.methods import get_method\n"
                                                "    get_method('gac')")
    out = subprocess.run([sys.executable, "-c", build], capture_output=True, text=True, cwd=ROOT, timeout=120).stdout
    assert out.split()[:3] == ["exit", "0", "loaded"] and "torch" in out.split()[3:]
