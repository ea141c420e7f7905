"""Issue 41, items 5 and 6: the last inputs that reached a traceback or a wrong reason. Each ends in
one line naming the file or the cause, with the documented exit code (1 environment, 2 user error)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def in_deleted_folder(tmp_path, command: list[str]) -> subprocess.CompletedProcess:
    """``command`` run from a working folder deleted before it starts (a shell left in a removed folder)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = f'cd "{gone}" && rmdir "{gone}" && exec "$@"'
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(["sh", "-c", script, "sh", *command], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("entry", ["ensbench", "ensbench-lm-eval"])
def test_a_deleted_working_folder_is_one_line_before_torch_loads(tmp_path, entry):
    """It died in oneMKL ('Intel oneMKL FATAL ERROR: Cannot load libtorch_cpu.so') without saying why."""
    done = in_deleted_folder(tmp_path, [str(Path(sys.executable).with_name(entry)), "--help"])
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: the working folder cannot be found"), done.stderr
    assert "oneMKL" not in done.stdout + done.stderr
