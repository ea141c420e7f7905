"""One writer per run, complete rows on resume, the run's paths, read-only state (issue 30).

A second run of a recipe is refused in one line while the first holds the recipe's run lock, and
nothing of the first is lost; a killed holder's lock is taken over; a finished row that lost any of
its per-task files is recomputed; ``output:`` is read the same way by the preflight and the run; a
read-only folder or cache is reported as read-only (exit 1), never as damaged.
"""

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ensemble_bench.errors import EnvironmentFault
from ensemble_bench.run.lock import hold_run_lock
from tests.cli_helpers import one_line, row_files, run_cli, tiny_recipe
from tests.tolerances import HANG_GUARD_S

ROWS = ("bpe", "sp", "gac")

# A process that takes a run lock through the runner's own lock code when its stdin says "go", says so,
# and holds it until its stdin closes. No clock: on a loaded machine it still races only when told to.
HOLDER = textwrap.dedent("""\
    import sys
    from pathlib import Path
    from ensemble_bench.errors import EnvironmentFault
    from ensemble_bench.run.lock import hold_run_lock
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        with hold_run_lock(Path(sys.argv[1])):
            print("holding", flush=True)
            sys.stdin.read()
    except EnvironmentFault as err:
        print(err, file=sys.stderr)
        sys.exit(err.exit_code)
""")


def holder(path) -> subprocess.Popen:
    """A started holder, ready: write "go" to its stdin to make it take the lock."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], text=True, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline() == "ready\n"
    return process


def go(processes) -> None:
    for process in processes:
        process.stdin.write("go\n")
        process.stdin.flush()


# --- the lock ---------------------------------------------------------------------------------------------
def test_a_second_holder_is_refused_in_one_line_and_changes_nothing(tmp_path):
    lock = tmp_path / "out" / ".recipe.lock"
    with hold_run_lock(lock):
        record = lock.read_text()
        assert json.loads(record)["pid"] == os.getpid()
        with pytest.raises(EnvironmentFault) as refused, hold_run_lock(lock):
            pytest.fail("a second holder got the lock")
        message = str(refused.value)
        assert f"pid {os.getpid()} on host {socket.gethostname()} since " in message and "\n" not in message
        assert lock.read_text() == record
    with hold_run_lock(lock):  # released at the end of the block
        pass


def test_racing_processes_never_both_hold_the_lock(tmp_path):
    """Ten races of two processes told to go together (each through the runner's lock code): exactly one
    holds the lock, the other is refused in one line naming it."""
    races = [[holder(tmp_path / f"race{n}.lock") for _ in range(2)] for n in range(10)]
    go([p for pair in races for p in pair])
    for pair in races:
        # a winner says "holding" and holds until its stdin closes; a loser ends (end of file) once refused
        first = [p.stdout.readline() for p in pair]
        outcomes = [(p, line + out, err) for p, line, (out, err) in
                    zip(pair, first, (p.communicate(timeout=HANG_GUARD_S) for p in pair))]
        winners = [p for p, out, _ in outcomes if p.returncode == 0 and out == "holding\n"]
        [(loser, _, refusal)] = [(p, out, err) for p, out, err in outcomes if p not in winners]
        assert len(winners) == 1 and loser.returncode == 1 and refusal.count("\n") == 1, outcomes
        assert f"another ensbench run of this recipe is running (pid {winners[0].pid} on host " in refusal


def test_the_lock_of_a_killed_holder_is_taken_over_with_one_note(tmp_path, capfd):
    lock = tmp_path / ".recipe.lock"
    process = holder(lock)
    go([process])
    assert process.stdout.readline() == "holding\n"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert json.loads(lock.read_text())["pid"] == process.pid  # the record it could not clear
    with hold_run_lock(lock):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    err = capfd.readouterr().err
    assert f"taking over the stale run lock {lock} of pid {process.pid} on host" in err and err.count("\n") == 1


@pytest.mark.slow
@pytest.mark.usefixtures("offline_data")
def test_two_runs_of_one_recipe_started_together_lose_nothing(tiny_dirs, tmp_path):
    """Two tries of two real `ensbench run` of a tiny recipe started together (one such run takes
    about 25 s on two busy cores; the ten races above exercise the lock itself)."""
    for attempt in range(2):
        folder = tmp_path / f"try{attempt}"
        folder.mkdir()
        recipe = folder / "recipe.yaml"
        recipe.write_text(tiny_recipe(tiny_dirs, folder / "results", limit=2))
        command = [sys.executable, "-m", "ensemble_bench.cli", "run", str(recipe)]
        logs = [folder / f"stderr{n}" for n in range(2)]
        runs = [subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log.open("w")) for log in logs]
        finished = []
        while len(finished) < 2:
            finished += [p for p in runs if p not in finished and p.poll() is not None]
            time.sleep(0.05)
        loser, winner = finished  # the loser refuses at once, long before the winner is done
        errors = {p: log.read_text() for p, log in zip(runs, logs)}
        assert (winner.returncode, loser.returncode) == (0, 1), errors
        line = one_line(SimpleNamespace(err=errors[loser], out=""))
        assert f"another ensbench run of this recipe is running (pid {winner.pid} on host" in line
        [run_dir] = (folder / "results" / "tiny-faults").iterdir()
        assert (run_dir / "summary.md").exists()
        for row in ROWS:
            files = row_files(run_dir / row)
            assert set(files) == {"piqa", "results"} and len(files["piqa"]) == 2
            assert json.loads((run_dir / row / "timing.json").read_text())["label"] == row


def test_new_run_folders_are_unique_within_one_second(tmp_path, monkeypatch):
    from ensemble_bench.recipe import load_recipe
    from ensemble_bench.run.runs import run_dir_of

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(tiny_recipe(["smollm2-135m", "qwen2.5-0.5b"], tmp_path / "results"))
    monkeypatch.setattr("ensemble_bench.run.runs.time.strftime", lambda _: "20260101-000000")
    names = []
    for _ in range(3):
        run_dir, resumed = run_dir_of(load_recipe(recipe), tmp_path / "results", fresh=True)
        assert not resumed and run_dir.name not in names
        run_dir.mkdir(parents=True)
        names.append(run_dir.name)
    assert names == sorted(names) and names[1] == names[0] + "-02"


# --- resume checks every file of a row --------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.usefixtures("offline_data")
def test_a_row_that_lost_one_of_its_per_task_samples_files_is_recomputed(tiny_dirs, tmp_path, monkeypatch):
    from ensemble_bench.recipe import load_recipe
    from ensemble_bench.report.summary import write_summary
    from ensemble_bench.run.runner import run_recipe
    from ensemble_bench.run.setup import run_setup

    monkeypatch.chdir(tmp_path)
    recipe_path = tmp_path / "recipe.yaml"
    two_tasks = "- {name: piqa, limit: 2}\n  - {name: arc_c, limit: 2}"
    recipe_path.write_text(tiny_recipe(tiny_dirs, tmp_path / "results", limit=2)
                           .replace("- {name: piqa, limit: 2}", two_tasks))
    recipe = load_recipe(recipe_path)
    run_dir = run_recipe(run_setup(recipe), write_summary)
    first = {row: row_files(run_dir / row) for row in ROWS}
    assert all(set(files) == {"piqa", "arc", "results"} for files in first.values())

    (run_dir / "summary.md").unlink()
    [lost] = (run_dir / "bpe").glob("samples_arc*.jsonl")  # the row still has its piqa samples
    lost.unlink()
    [short] = (run_dir / "sp").glob("samples_piqa_*.jsonl")  # one example fewer, every line still parses
    short.write_text("".join(short.read_text().splitlines(keepends=True)[:-1]))
    events = []
    on_row = lambda row, state: events.append((row.label, state))  # noqa: E731
    assert run_recipe(run_setup(recipe), write_summary, on_row=on_row) == run_dir
    assert ("bpe", f"damaged ({lost.name} is missing): recomputed from the response cache") in events
    results_name = short.name.replace('samples_piqa', 'results')[:-1]
    assert ("sp", f"damaged ({short.name} does not hold the examples {results_name}"
                  " records): recomputed from the response cache") in events
    assert ("gac", "kept from the interrupted run") in events
    assert {row: row_files(run_dir / row) for row in ROWS} == first and (run_dir / "summary.md").exists()
    computed = [json.loads((run_dir / row / "timing.json").read_text())["requests_computed"] for row in ("bpe", "sp")]
    assert computed == [0, 0]


# --- paths ------------------------------------------------------------------------------------------------
@pytest.mark.usefixtures("offline_data")
def test_output_with_a_tilde_is_the_home_folder_in_the_preflight_and_the_run(tiny_dirs, tmp_path, monkeypatch, capsys):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    recipe = work / "recipe.yaml"
    recipe.write_text(tiny_recipe(tiny_dirs, "~/x", limit=1))
    (home / "x").write_text("a file")  # the preflight must look at $HOME/x too
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe), "--dry-run")
    assert code == 1 and f"output: '{home / 'x'}' is a file" in one_line(out)
    (home / "x").unlink()
    assert run_cli(monkeypatch, capsys, "run", str(recipe))[0] == 0
    assert list((home / "x" / "tiny-faults").glob("*/summary.md"))
    assert not list(tmp_path.rglob("~*")) and sorted(p.name for p in work.iterdir()) == ["recipe.yaml"]


def test_output_naming_an_unset_variable_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ENSBENCH_TEST_UNSET", raising=False)
    monkeypatch.setenv("ENSBENCH_TEST_SET", str(tmp_path / "set"))
    recipe = tmp_path / "recipe.yaml"
    for output in ("$ENSBENCH_TEST_UNSET/x", "${ENSBENCH_TEST_UNSET}", "$ENSBENCH_TEST_SET/${ENSBENCH_TEST_UNSET}"):
        recipe.write_text(tiny_recipe(["smollm2-135m", "qwen2.5-0.5b"], output))
        for extra in (["--dry-run"], []):
            code, out = run_cli(monkeypatch, capsys, "run", str(recipe), *extra)
            assert code == 2 and "$ENSBENCH_TEST_UNSET is not set" in one_line(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.yaml"]
    recipe.write_text(tiny_recipe(["smollm2-135m", "qwen2.5-0.5b"], "$ENSBENCH_TEST_SET/x"))
    assert run_cli(monkeypatch, capsys, "run", str(recipe), "--dry-run")[0] == 0


# --- read-only state --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished_tiny_run(tiny_dirs, tmp_path_factory, offline_data):
    """The output folder of one finished tiny run (copied by each test that changes it)."""
    from ensemble_bench.recipe import load_recipe
    from ensemble_bench.report.summary import write_summary
    from ensemble_bench.run.runner import run_recipe
    from ensemble_bench.run.setup import run_setup

    folder = tmp_path_factory.mktemp("finished")
    recipe = folder / "recipe.yaml"
    recipe.write_text(tiny_recipe(tiny_dirs, folder / "results", limit=2))
    run_recipe(run_setup(load_recipe(recipe)), write_summary)
    return folder / "results"


def unfinished_copy(finished, tmp_path, tiny_dirs):
    """A copy of the finished run with its summary and its gac row gone (gac is still to compute)."""
    shutil.copytree(finished, tmp_path / "results")
    [run_dir] = (tmp_path / "results" / "tiny-faults").iterdir()
    (run_dir / "summary.md").unlink()
    shutil.rmtree(run_dir / "gac")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(tiny_recipe(tiny_dirs, tmp_path / "results", limit=2))
    return recipe, run_dir


def make_read_only(path, monkeypatch):
    """Take write permission from ``path``; as root (who writes through modes) also answer os.access
    as a read-only mount would."""
    path.chmod(0o555 if path.is_dir() else 0o444)
    if os.geteuid() == 0:
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: (False if mode & os.W_OK and str(p) == str(path)
                                                                 else real_access(p, mode, **kw)))


def snapshot(run_dir):
    """Every file of a run but recipe.yaml (rewritten as run: here its output: names the copy)."""
    return {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != "recipe.yaml"}


@pytest.mark.parametrize("where", ["run folder", "cache folder", "cache file"])
def test_a_read_only_run_folder_or_cache_is_read_only_not_damaged(where, finished_tiny_run, tiny_dirs, tmp_path,
                                                                  monkeypatch, capsys):
    recipe, run_dir = unfinished_copy(finished_tiny_run, tmp_path, tiny_dirs)
    cache = run_dir / "cache"
    targets = {"run folder": run_dir, "cache folder": cache, "cache file": cache / "gac_rank0.db"}
    target = targets[where]
    before = snapshot(run_dir)
    make_read_only(target, monkeypatch)
    try:
        code, out = run_cli(monkeypatch, capsys, "run", str(recipe))
    finally:
        target.chmod(0o755)
    line = one_line(out)
    assert code == 1 and f"cannot write {target}: it is read-only" in line, line
    assert not any(word in line for word in ("damaged", "remove", "delete"))
    assert snapshot(run_dir) == before


def test_sqlite_cannot_write_mid_run_is_read_only_not_damaged(finished_tiny_run, tiny_dirs, tmp_path, monkeypatch,
                                                               capsys):
    """What sqlite says while lm-eval writes a cache in a folder that became read-only mid-run."""
    recipe, run_dir = unfinished_copy(finished_tiny_run, tmp_path, tiny_dirs)
    (run_dir / "cache" / "gac_rank0.db").unlink()  # gac's answers are computed again, and written

    def refused(*_):
        raise sqlite3.OperationalError("attempt to write a readonly database")
    monkeypatch.setattr("sqlitedict.SqliteDict.__setitem__", refused)
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe))
    line = one_line(out)
    assert code == 1 and "cannot write a response cache database of the run" in line and "read-only" in line, line
    assert not any(word in line for word in ("damaged", "remove", "delete"))
    assert all((run_dir / row / "timing.json").exists() for row in ("bpe", "sp"))


@pytest.mark.parametrize("error,damaged", [
    (sqlite3.OperationalError("attempt to write a readonly database"), False),
    (sqlite3.OperationalError("unable to open database file"), False),
    (sqlite3.DatabaseError("file is not a database"), True),
    (sqlite3.DatabaseError("database disk image is malformed"), True),
])
def test_only_sqlites_own_verdict_calls_a_cache_damaged(error, damaged, monkeypatch, capsys):
    from ensemble_bench.cli import main as cli

    def app(**_):
        raise RuntimeError("lm-eval could not cache an answer") from error
    monkeypatch.setattr(cli, "app", app)
    code, out = run_cli(monkeypatch, capsys, "list")
    line = one_line(out)
    assert code == 1 and ("is damaged" in line and "remove" in line) == damaged, line
    assert damaged or ("read-only" in line and "cannot write" in line)


def test_a_broken_pipe_is_not_taken_for_the_network():
    from ensemble_bench.errors import environment_fault

    assert environment_fault(BrokenPipeError(32, "Broken pipe")) is None
    assert "network unavailable" in str(environment_fault(ConnectionResetError(104, "reset")))


def test_a_cache_folder_that_cannot_be_written_is_found_by_the_dry_run(tmp_path, monkeypatch, capsys):
    """A read-only $ENSBENCH_CACHE failed only once the first model or dataset was fetched."""
    import errno
    import tempfile

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("ENSBENCH_CACHE", str(cache))
    real = tempfile.TemporaryFile

    def read_only_cache(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == cache:
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only_cache)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(tiny_recipe(["smollm2-135m", "qwen2.5-0.5b"], str(tmp_path / "out")))
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe), "--dry-run")
    line = one_line(out)
    assert code == 1 and "ENSBENCH_CACHE: cannot write in" in line and "Read-only file system" in line
