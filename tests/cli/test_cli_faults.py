"""Issue 30, command line and reports: user-chosen output paths checked before anything is written,
a closed pipe ends quietly, a full disk is one line (no library's log), a model that cannot be loaded
safely is one line, and damaged run folders never reach exit 70."""

import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.cli_helpers import one_line, run_cli, tiny_recipe
from tests.fake_runs import fake_run
from tests.report.test_compare import RECIPE as PAIR_RECIPE
from tests.report.test_compare import write_samples

# each report command with a user-chosen output stem (``{out}``) and what it writes there
OUT_COMMANDS = {
    "table": (["table", "{run}", "--layout", "gac_table3", "--out", "{out}"], [".md", ".tex", ".csv"]),
    "plot": (["plot", "{run}", "--out", "{out}"], [".png", ".svg"]),
    "compare": (["compare", "{run}", "--out", "{out}"], [".md", ".csv"]),
    "select": (["select", "{run}", "--out", "{out}"], [""]),
}


@pytest.fixture
def finished(tmp_path):
    """A finished fake run with samples (compare needs them) and single-model rows (select needs them)."""
    rows = {label: ("gac" if label == "gac" else "single", {"arc_c": (0.5, 10), "nq": (0.25, 4)},
                    {"decode_ms_per_token": 10.0}) for label in ("a", "b", "gac")}
    return write_samples(fake_run(tmp_path / "run", rows, PAIR_RECIPE))


def report_args(command, run, out):
    return [a.format(run=run, out=out) for a in OUT_COMMANDS[command][0]]


# --- 1. user-chosen output paths --------------------------------------------------------------------------------
@pytest.mark.parametrize("command", sorted(OUT_COMMANDS))
def test_an_output_file_that_is_a_folder_is_one_line_and_nothing_is_written(command, finished, tmp_path,
                                                                           monkeypatch, capsys):
    suffixes = OUT_COMMANDS[command][1]
    stem = tmp_path / "out" / "report"
    blocked = stem.with_name(stem.name + suffixes[-1])
    blocked.mkdir(parents=True)
    code, out = run_cli(monkeypatch, capsys, *report_args(command, finished, stem))
    line = one_line(out)
    assert code == 2 and f"{blocked} is a folder" in line, line
    assert sorted(p.name for p in stem.parent.iterdir()) == [blocked.name]  # nothing written, not even a temporary


@pytest.mark.parametrize("command", sorted(OUT_COMMANDS))
def test_an_output_below_a_file_is_one_line(command, finished, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("keep")
    code, out = run_cli(monkeypatch, capsys, *report_args(command, finished, tmp_path / "file" / "report"))
    assert code == 2 and f"{tmp_path / 'file'} is not a folder" in one_line(out)
    assert (tmp_path / "file").read_text() == "keep"


def test_an_output_with_an_unset_variable_is_refused_and_home_is_expanded(finished, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ENSBENCH_NO_SUCH_FOLDER", raising=False)
    monkeypatch.chdir(tmp_path)
    code, out = run_cli(monkeypatch, capsys, *report_args("table", finished, "$ENSBENCH_NO_SUCH_FOLDER/t"))
    assert code == 2 and "$ENSBENCH_NO_SUCH_FOLDER is not set" in one_line(out)
    assert not list(tmp_path.glob("$*"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SUB", "tables")
    code, out = run_cli(monkeypatch, capsys, *report_args("table", finished, "~/${SUB}/t"))
    assert code == 0, out.err
    assert sorted(p.name for p in (tmp_path / "home" / "tables").iterdir()) == ["t.csv", "t.md", "t.tex"]
    assert not (tmp_path / "~").exists()


# --- 2. a closed pipe ------------------------------------------------------------------------------------------
def test_a_closed_pipe_ends_quietly_with_exit_0():
    """A real pipe whose reader is gone before the first write (as `ensbench list | head -1` once
    head has its line): no message, no "Exception ignored", exit 0."""
    ensbench = Path(sys.executable).with_name("ensbench")
    child = subprocess.Popen([str(ensbench), "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()
    errors = child.stderr.read().decode()
    assert child.wait(timeout=120) == 0 and errors == ""


class FullDiskCursor:
    """A sqlite cursor whose writes fail as on a full disk (what sqlitedict's worker thread sees)."""

    def __init__(self, cursor):
        self.cursor = cursor

    def execute(self, statement, *args):
        if statement.lstrip().upper().startswith(("REPLACE", "INSERT")):
            raise sqlite3.OperationalError("database or disk is full")
        return self.cursor.execute(statement, *args)

    def __iter__(self):
        return iter(self.cursor)

    def __getattr__(self, name):
        return getattr(self.cursor, name)


class FullDiskConnection:
    def __init__(self, connection):
        self.connection = connection

    def cursor(self):
        return FullDiskCursor(self.connection.cursor())

    def __getattr__(self, name):
        return getattr(self.connection, name)


@pytest.mark.usefixtures("offline_data")
def test_a_full_disk_under_the_response_cache_is_one_line_without_its_thread_log(tiny_dirs, tmp_path, monkeypatch,
                                                                                 capsys, caplog):
    import sqlitedict

    connect = sqlite3.connect
    monkeypatch.setattr(sqlitedict.sqlite3, "connect", lambda *a, **k: FullDiskConnection(connect(*a, **k)))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(tiny_recipe(tiny_dirs, tmp_path / "results", limit=1))
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe))
    assert code == 1 and "disk full" in one_line(out)
    assert not [r for r in caplog.records if r.name.startswith("sqlitedict")]  # the CLI's stderr, outside pytest



# --- 4. a model that cannot be loaded safely -----------------------------------------------------------------------
class RunsCode:
    """Unpickling this calls os.getpid (harmless): what a malicious pickle does with something worse."""

    def __reduce__(self):
        return (os.getpid, ())


@pytest.mark.usefixtures("offline_data")
def test_a_model_whose_pickle_the_safe_loader_refuses_is_one_line(tiny_dirs, tmp_path, monkeypatch, capsys):
    import torch

    folder = tmp_path / "pickled"
    shutil.copytree(tiny_dirs[0], folder)
    (folder / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": RunsCode()}, folder / "pytorch_model.bin")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(f"""\
        name: pickled
        members: [{{model: {folder}, name: pickled}}]
        method: single
        tasks: [{{name: piqa, limit: 1}}]
        data: offline
        output: {tmp_path / "results"}
    """))
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe))
    line = one_line(out)
    assert code == 2 and f"{folder / 'pytorch_model.bin'}: torch's safe loader refuses" in line, line
    assert "getpid" in line and "safetensors" in line and "weights_only" not in line and "False" not in line


# --- 5. damaged run folders in the report commands ------------------------------------------------------------------
def _folder_for(path):
    path.unlink()
    path.mkdir()


def _file_for(path):
    shutil.rmtree(path)
    path.write_text("x")


def _unreadable(path):
    """Reading ``path`` is refused (chmod 000 does not stop root, so the refusal is simulated)."""
    read_text = Path.read_text

    def refusing(self, *args, **kwargs):
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)
    return refusing


DAMAGE = {
    "results is a folder": ("a/results_1.json", _folder_for),
    "timing is a folder": ("a/timing.json", _folder_for),
    "recipe is a folder": ("recipe.yaml", _folder_for),
    "samples is a folder": ("a/samples_arc_challenge_2026-01-01T00-00-00.0.jsonl", _folder_for),
    "timing is missing": ("a/timing.json", Path.unlink),
    "a row folder is a file": ("b", _file_for),
    "results is unreadable": ("a/results_1.json", "unreadable"),
    "recipe is unreadable": ("recipe.yaml", "unreadable"),
    "samples are unreadable": ("a/samples_arc_challenge_2026-01-01T00-00-00.0.jsonl", "unreadable"),
    # valid JSON of another shape (issue 47: a list as timing.json was a traceback in table and plot)
    "timing is a list": ("a/timing.json", lambda path: path.write_text("[]")),
    "results is a number": ("a/results_1.json", lambda path: path.write_text("7")),
    "a sample is a list": ("a/samples_arc_challenge_2026-01-01T00-00-00.0.jsonl", lambda path: path.write_text("[]\n")),
}
REPORTS = {
    "table": ["table", "{run}", "--layout", "gac_table3"],
    "plot": ["plot", "{run}", "--out", "{tmp}/plot"],
    "compare": ["compare", "{run}"],
    "regress": ["regress", "{run}", "--baseline", "{run}"],
    "select": ["select", "{run}", "--out", "{tmp}/chosen.yaml"],
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("command", sorted(REPORTS))
def test_a_damaged_run_folder_is_one_line_in_every_report_command(command, damage, finished, tmp_path,
                                                                  monkeypatch, capsys):
    where, harm = DAMAGE[damage]
    target = finished / where
    if harm == "unreadable":
        monkeypatch.setattr(Path, "read_text", _unreadable(target))
    else:
        harm(target)
    args = [a.format(run=finished, tmp=tmp_path) for a in REPORTS[command]]
    code, out = run_cli(monkeypatch, capsys, *args)
    if code == 0:  # the command does not read what was damaged (e.g. table reads no samples)
        assert "Traceback" not in out.err
        return
    line = one_line(out)
    assert code in (1, 2), line


@pytest.mark.parametrize("command", ["table", "plot"])
def test_a_timing_json_that_is_no_object_is_named_as_damaged(command, finished, tmp_path, monkeypatch, capsys):
    """Valid JSON but a list: a traceback (exit 70) in table and plot on bb736f1."""
    (finished / "a" / "timing.json").write_text("[1, 2]")
    code, out = run_cli(monkeypatch, capsys, *[a.format(run=finished, tmp=tmp_path) for a in REPORTS[command]])
    assert code == 1 and one_line(out) == (f"error: {finished / 'a' / 'timing.json'}: damaged or unreadable (valid "
                                           "JSON, but not a JSON object): run its recipe again with --fresh, or "
                                           "leave this run out")


@pytest.mark.parametrize("command", sorted(REPORTS))
@pytest.mark.parametrize("run", ["missing", "a file"])
def test_a_run_argument_that_is_no_run_folder_is_one_line(command, run, tmp_path, monkeypatch, capsys):
    path = tmp_path / "run"
    if run == "a file":
        path.write_text("x")
    code, out = run_cli(monkeypatch, capsys, *[a.format(run=path, tmp=tmp_path) for a in REPORTS[command]])
    assert code == 2 and str(path) in one_line(out)
