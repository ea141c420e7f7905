"""Hostile model-written programs: they fail to do harm, and the harness scores them as failed.

Each hostile program exits 0 only when its attack worked, so ``run_program`` returning False means
"reported as failed"; the test then checks from outside that no harm was done. Guarantees that need
namespaces are skipped, with the reason, where this machine cannot create them (docs/code_execution.md).
"""

import secrets
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from ensemble_bench.errors import UserError
from ensemble_bench.tasks import code_exec, isolation
from ensemble_bench.tasks.code_exec import check_isolation, run_in, run_program
from ensemble_bench.tasks.isolation import Sandbox, detect
from tests.tolerances import HANG_GUARD_S

LEVEL = detect().level
LINGER_S = 2 * HANG_GUARD_S  # how long the hostile programs' children sleep: they outlive any wait of the tests
needs_network = pytest.mark.skipif(LEVEL == "none", reason=f"no network namespace here: {detect().missing}")
needs_filesystem = pytest.mark.skipif(LEVEL != "network+filesystem",
                                      reason=f"no filesystem view here: {detect().missing}")


@pytest.fixture
def markers(tmp_path):
    """A secret file in a temp folder outside the program's, one in the user's home, and the project's."""
    secret = secrets.token_hex(8)
    outside = tmp_path / "secret.txt"
    outside.write_text(secret)
    home = Path.home() / f".ensbench-isolation-test-{secret}"
    home.write_text(secret)
    project = Path(code_exec.__file__).resolve().parents[2] / "pyproject.toml"
    yield secret, [outside, home, project]
    home.unlink(missing_ok=True)


def test_the_level_is_detected_and_said_in_one_line():
    box = detect()
    assert box.level in isolation.LEVELS
    line = box.describe()
    assert "\n" not in line and line.startswith(f"code execution isolation: {box.level}")
    assert run_program("import sys\nassert sys.flags.isolated\n")  # plain programs still run


@needs_filesystem
def test_cannot_read_files_outside_its_folder(markers):
    secret, paths = markers
    for path in paths:
        assert not run_program(f"print(open({str(path)!r}).read())\n"), path
    assert not run_program(f"import os\nassert os.listdir({str(Path.home())!r})\n")
    assert run_program("open('mine.txt', 'w').write('x')\nassert open('mine.txt').read() == 'x'\n")


@needs_filesystem
def test_a_home_or_project_inside_a_bound_tree_is_still_hidden():
    box = detect()
    hiding = Sandbox(box.level, box.python, "", ("/usr/share",))  # as if the home were /usr/share
    assert run_program("import os\nassert os.listdir('/usr/share')\n", sandbox=box)
    assert not run_program("import os\nassert os.listdir('/usr/share')\n", sandbox=hiding)
    assert run_program("import os\nassert os.listdir('/usr/bin')\n", sandbox=hiding)


@needs_filesystem
def test_cannot_write_outside_its_folder(tmp_path):
    home = Path.home() / f".ensbench-written-{secrets.token_hex(4)}"
    targets = [tmp_path / "written.txt", home, Path("/usr/ensbench-x")]
    for target in targets:
        assert not run_program(f"open({str(target)!r}, 'w').write('harm')\n"), target
        assert not target.exists(), target
    assert run_program("open('/tmp/scratch', 'w').write('private /tmp is fine')\n")


@needs_network
def test_cannot_reach_a_local_listener():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'harm')\n"
        assert not run_program(program)
        server.settimeout(0.5)  # a connection made during the run would wait in the backlog
        with pytest.raises(socket.timeout):
            server.accept()


@needs_network
def test_a_fork_bomb_is_capped_and_killed():
    program = ("import os, time\n"
               "for _ in range(10000):\n"
               "    if os.fork() == 0:\n"
               f"        time.sleep({LINGER_S})\n"
               "        os._exit(0)\n")
    # fork fails at the process cap and the program raises (all 10000 forked, it would exit 0); the guard
    # only ends a hang, so a failure here is the cap's, not a timeout's
    assert not run_program(program, timeout_s=HANG_GUARD_S)
    assert _no_sleepers_left()


@needs_network
def test_a_child_does_not_outlive_the_program():
    with tempfile.TemporaryDirectory(prefix="ensbench-test-") as name:  # reachable by the sandbox's user
        _child_is_killed(Path(name))


def _child_is_killed(folder: Path) -> None:
    program = ("import os, time\n"
               "if os.fork() == 0:\n"
               "    os.setsid()\n"
               f"    time.sleep({LINGER_S})\n"
               "    open('late.txt', 'w').write('harm')\n"
               "    os._exit(0)\n")
    # the program itself did nothing wrong; had the harness waited for the child, it would end at the guard
    assert run_in(str(folder), program, timeout_s=HANG_GUARD_S)
    assert _no_sleepers_left()  # the child was killed with the program
    assert not list(folder.rglob("late.txt"))


def test_memory_and_time_limits_hold_at_every_level():
    assert not run_program("x = bytearray(4 << 30)\n", memory_mb=256)
    assert not run_program(f"import time\ntime.sleep({LINGER_S})\n", timeout_s=1.0)  # else it exits 0
    child = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import time; time.sleep({LINGER_S})'])\n"
    assert not run_program(child, timeout_s=1.0)  # its child is killed with it
    assert _no_sleepers_left()


def _no_sleepers_left() -> bool:
    """Whether every process running a program (or sleeping LINGER_S in one) is gone: they are killed
    with the program, which takes a moment; one that was not would outlive the guard."""
    deadline = time.monotonic() + HANG_GUARD_S
    while _sleepers():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _sleepers() -> int:
    done = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True)
    return sum("program.py" in line or f"time.sleep({LINGER_S})" in line for line in done.stdout.splitlines()
               if "pytest" not in line)


# ------------------------------------------------------------------ detection and the refusal
def test_without_isolation_the_run_refuses_unless_allowed(monkeypatch):
    monkeypatch.setattr(code_exec, "detect", lambda: Sandbox(missing="no unshare command (util-linux)"))
    lines = []
    with pytest.raises(UserError, match="allow_unisolated_execution: true") as err:
        check_isolation(False, say=lines.append)
    assert "\n" not in str(err.value)
    assert lines == ["code execution isolation: none (no unshare command (util-linux))"]
    assert check_isolation(True, say=lines.append) == "none"
    with pytest.raises(RuntimeError, match="allow_unisolated_execution"):
        code_exec.score_candidates("assert True", ["pass"], consent=code_exec.Consent(run_code=True))


def test_detection_falls_back_without_unshare(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    box = isolation.detect.__wrapped__()
    assert box.level == "none" and "unshare" in box.missing
    assert run_program("assert 1 + 1 == 2\n", sandbox=box) and not run_program("assert False\n", sandbox=box)


@needs_network
def test_detection_falls_back_to_network_only_when_mounts_fail(monkeypatch):
    monkeypatch.setattr(isolation, "SETUP_SCRIPT", "echo 'mount: permission denied' >&2; exit 32")
    box = isolation.detect.__wrapped__()
    assert box.level == "network" and "permission denied" in box.missing
    assert run_program("open('ok', 'w').write('x')\n", sandbox=box)
    assert not run_program("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\n", sandbox=box)


# ------------------------------------------------------------------ through `ensbench run`
def _recipe(tmp_path, model, extra=""):
    path = tmp_path / "code.yaml"
    path.write_text(f"name: code-run\nmembers:\n  - model: {model}\n    name: bpe\nmethod: single\n"
                    f"tasks:\n  - name: mbpp\n    limit: 1\ndata: offline\nallow_code_execution: true\n"
                    f"output: {tmp_path / 'results'}\n{extra}")
    return path


def _ensbench(monkeypatch, *args):
    import sys

    from ensemble_bench.cli.main import main

    monkeypatch.setattr(sys, "argv", ["ensbench", *args])
    try:
        main()
    except SystemExit as exit_info:
        return exit_info.code
    return 0


def test_a_run_says_and_records_the_isolation(tiny_dirs, tmp_path, monkeypatch, capsys):
    import json

    assert _ensbench(monkeypatch, "run", str(_recipe(tmp_path, tiny_dirs[0]))) == 0
    out = capsys.readouterr().out
    assert out.count("code execution isolation: ") == 1 and detect().describe() in out
    [results] = (tmp_path / "results" / "code-run").glob("*/bpe/results_*.json")
    assert json.loads(results.read_text())["config"]["code_execution_isolation"] == LEVEL


def test_a_run_without_isolation_refuses_in_one_line(tiny_dirs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(code_exec, "detect", lambda: Sandbox(missing="no unshare command (util-linux)"))
    assert _ensbench(monkeypatch, "run", str(_recipe(tmp_path, tiny_dirs[0]))) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    assert [line for line in captured.err.splitlines() if "allow_unisolated_execution" in line]
    assert not (tmp_path / "results").exists()  # refused before anything was written
