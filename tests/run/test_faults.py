"""Fault injection: hostile recipes, damaged run state, environment faults, interrupts (issue 16).

Every fault ends in one line and a meaningful exit code (2 user error, 1 environment fault or
damaged state, 130 interrupted, 70 a bug with its traceback); nothing is written or deleted outside
the output folder; a resumed run gives the same files as an uninterrupted one.
"""

import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from functools import partial

import click
import pytest
import typer

from ensemble_bench.cli import faults as cli_faults
from ensemble_bench.cli import main as cli
from ensemble_bench.errors import EnvironmentFault, UserError
from tests.cli_helpers import ONE_MEMBER, dry_run, one_line, raising, row_files, run_cli, tiny_recipe
from tests.fake_runs import BASE_RECIPE, ROWS, fake_run


# --- 1. hostile names never become paths -------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../../victim", "org/smol", "..", ".hidden", "a\\b", "x" * 201])
def test_a_member_name_that_is_not_a_safe_folder_name_is_refused(name, tmp_path, monkeypatch, capsys):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    recipe = tmp_path / "deep" / "er" / "recipe.yaml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text(ONE_MEMBER.format(name=json.dumps(name), output=tmp_path / "results"))
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe))
    assert code == 2 and "members[0].name" in one_line(out)
    assert (victim / "keep.txt").read_text() == "precious" and not (tmp_path / "results").exists()


def test_a_label_taken_from_the_model_path_must_be_safe_too(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "my model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(ONE_MEMBER.format(name="x", output=tmp_path).replace("model: smollm2-135m", f"model: {folder}")
                      .replace("    name: x\n", ""))
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe), "--dry-run")
    assert code == 2 and "label 'my model', not a safe folder name: set 'name'" in one_line(out)


def test_a_sweep_value_that_would_make_a_path_is_refused(tmp_path, monkeypatch, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent("""\
        name: sweep
        members: [{model: smollm2-135m, name: a}, {model: qwen2.5-0.5b, name: b}]
        method: voting
        sweep: {answer: ['(\\d+)/../../x']}
        tasks: [gsm8k]
        data: offline
    """))
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe), "--dry-run")
    assert code == 2 and "is not a safe folder name" in one_line(out) and "give the method entry a 'label'" in out.err


def test_every_runner_path_stays_inside_the_run_folder(tmp_path):
    from ensemble_bench.run.folder import inside

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "link").symlink_to(tmp_path)
    assert inside(run_dir, "gac") == run_dir / "gac"
    for name in ("..", "../victim", "a/b", "", ".", "link"):
        with pytest.raises(UserError, match="outside the run folder"):
            inside(run_dir, name)


# --- 2. the top-level handler ---------------------------------------------------------------------------
class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("the message itself fails")


HANDLED = {
    "user error": (UserError("recipe.yaml: tasks[0].limit: bad"), 2, "error: recipe.yaml: tasks[0].limit: bad"),
    "environment fault": (EnvironmentFault("output: '/x' is a file"), 1, "error: output: '/x' is a file"),
    "disk full": (OSError(errno.ENOSPC, "No space left on device", "/r/x.json"), 1,
                  "error: disk full (/r/x.json): free space"),
    "read-only": (OSError(errno.EROFS, "Read-only file system", "/r"), 1,
                  "error: cannot write (/r): Read-only file system"),
    "permission": (PermissionError(errno.EACCES, "Permission denied", "/r"), 1, "cannot write (/r): Permission denied"),
    "sqlite full": (sqlite3.OperationalError("database or disk is full"), 1, "error: disk full: free space"),
    "sqlite damaged": (sqlite3.DatabaseError("file is not a database"), 1,
                       "response cache database of the run is damaged"),
    "network": (ConnectionError("Connection refused"), 1, "error: network unavailable (Connection refused)"),
    "out of memory": (MemoryError(), 1, "error: out of memory: lower batch_size"),
    "keyboard interrupt": (KeyboardInterrupt(), 130, "interrupted: stopped before it finished"),
    "typer usage error": (typer.BadParameter("no such thing"), 2, "no such thing (ensbench --help)"),
    "click usage error": (click.UsageError("no such option"), 2, "error: no such option (ensbench --help)"),
}
for _abort in cli_faults.INTERRUPTS:
    HANDLED[f"abort {_abort.__module__}.{_abort.__name__}"] = (_abort(), 130, "interrupted: stopped before it finished")


@pytest.mark.parametrize("case", sorted(HANDLED))
def test_every_expected_fault_is_one_line_and_its_exit_code(case, monkeypatch, capsys):
    err, code, expected = HANDLED[case]
    monkeypatch.setattr(cli, "app", raising(err))
    got, out = run_cli(monkeypatch, capsys, "list")
    assert got == code and expected in one_line(out)


def test_the_damaged_cache_line_names_the_file_the_runner_writes(tmp_path):
    from ensemble_bench.errors import environment_fault
    from ensemble_bench.run.folder import cache_db

    written = cache_db(tmp_path, "gac").relative_to(tmp_path).as_posix().replace("gac", "<row>")
    line = str(environment_fault(sqlite3.DatabaseError("file is not a database")))
    assert f"remove the run's {written} (its answers are recomputed)" in line


def test_a_network_fault_inside_a_library_error_is_found_through_the_chain(monkeypatch, capsys):
    try:
        try:
            raise ConnectionError("Name or service not known")
        except ConnectionError as cause:
            raise RuntimeError("could not load the dataset") from cause
    except RuntimeError as err:
        monkeypatch.setattr(cli, "app", raising(err))
    code, out = run_cli(monkeypatch, capsys, "list")
    assert code == 1 and "network unavailable (Name or service not known)" in one_line(out)


def test_ctrl_c_under_typer_returns_130(monkeypatch, capsys):
    monkeypatch.setattr(cli, "app", lambda **_: 130)  # typer >= 0.2x turns a KeyboardInterrupt into Exit(130)
    code, out = run_cli(monkeypatch, capsys, "list")
    assert code == 130 and one_line(out) == "interrupted: stopped before it finished"


@pytest.mark.usefixtures("offline_data")
def test_only_a_run_that_resumes_is_told_to_resume(tiny_dirs, tmp_path, monkeypatch, capsys):
    """`table` on a large run, interrupted, said "run the same command again to resume": it resumes nothing."""
    from tests.fake_runs import ROWS, fake_run

    def interrupt(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_run_with_progress", interrupt)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(tiny_recipe(tiny_dirs, tmp_path / "results", limit=2))
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe), "--threads", "1")
    assert code == 130 and one_line(out) == "interrupted: run the same command again to resume"
    import ensemble_bench.report.tables

    monkeypatch.setattr(ensemble_bench.report.tables, "make_table", interrupt)
    code, out = run_cli(monkeypatch, capsys, "table", str(fake_run(tmp_path / "run", ROWS)))
    assert code == 130 and one_line(out) == "interrupted: stopped before it finished"


def test_a_bug_shows_its_traceback_and_asks_for_a_report(monkeypatch, capsys):
    monkeypatch.setattr(cli, "app", raising(ZeroDivisionError("division by zero")))
    code, out = run_cli(monkeypatch, capsys, "list")
    assert code == cli_faults.BUG == 70
    assert "Traceback" in out.err and "ZeroDivisionError" in out.err
    assert out.err.strip().splitlines()[-1].startswith("error: this is a bug in ensbench")


def test_the_handler_itself_cannot_fail(monkeypatch, capsys):
    monkeypatch.setattr(cli, "app", raising(type("Odd", (Unprintable, UserError), {})()))
    code, out = run_cli(monkeypatch, capsys, "list")
    assert code == cli_faults.BUG and "AttributeError" not in out.err


def test_the_handler_names_only_exception_classes_that_exist():
    for group in (cli_faults.HELP_REQUESTS, cli_faults.USAGE_ERRORS, cli_faults.INTERRUPTS):
        assert group and all(isinstance(c, type) and issubclass(c, BaseException) for c in group)
    assert typer.Abort in cli_faults.INTERRUPTS and click.exceptions.Abort in cli_faults.INTERRUPTS


def test_command_line_help_and_success_still_work(monkeypatch, capsys):
    code, out = run_cli(monkeypatch, capsys)
    assert code in (0, 2) and "Usage" in out.out + out.err
    code, out = run_cli(monkeypatch, capsys, "run", "--bogus")
    assert code == 2 and "(ensbench --help)" in one_line(out)


# --- 3. regress against a baseline of another recipe --------------------------------------------------------
@pytest.mark.parametrize("change,field", [
    ({"batch_size": 2}, "batch_size: 2 vs the baseline's 1"),
    ({"tasks": [{"name": "arc_c", "limit": 8}]}, "tasks[0].limit: 8 vs the baseline's 200"),
    ({"tasks": [{"name": "arc_c"}], "limit": 8}, "tasks[0].limit: 8 vs the baseline's 200"),
    ({"tasks": [{"name": "arc_c", "limit": 200, "shots": 5}]}, "tasks[0].shots: 5 vs the baseline's None"),
    ({"method": {"name": "gac", "threshold": 0.5, "gate": "a"}}, "method.gate: 'a' vs the baseline's '(absent)'"),
    ({"members": [{"model": "smollm2-135m", "name": "a"}, {"model": "gemma3-270m", "name": "b"}]}, "members[1].model"),
])
def test_regress_refuses_a_baseline_of_another_recipe(change, field, tmp_path, monkeypatch, capsys):
    current = fake_run(tmp_path / "now", ROWS, {**BASE_RECIPE, **change})
    baseline = fake_run(tmp_path / "base", ROWS, BASE_RECIPE)
    code, out = run_cli(monkeypatch, capsys, "regress", str(current), "--baseline", str(baseline))
    line = one_line(out)
    assert code == 2 and "not a run of the same recipe" in line and field in line, line


def test_regress_accepts_a_renamed_or_moved_recipe_and_keeps_its_tolerances(tmp_path, monkeypatch, capsys):
    current = fake_run(tmp_path / "now", ROWS, {**BASE_RECIPE, "name": "other", "output": "elsewhere",
                                                "description": "moved"})
    baseline = fake_run(tmp_path / "base", ROWS, BASE_RECIPE)
    code, out = run_cli(monkeypatch, capsys, "regress", str(current), "--baseline", str(baseline),
                        "--confidence", "0.99", "--latency-tolerance", "0.1")
    assert code == 0 and "all 4 checks passed" in out.out and "x 1.1" in out.out


# --- 4. damaged state ---------------------------------------------------------------------------------------
@pytest.fixture
def damaged_run(tmp_path):
    """A finished fake run whose 'gac' row has a truncated results file."""
    run_dir = fake_run(tmp_path / "run", ROWS, BASE_RECIPE)
    results = run_dir / "gac" / "results_1.json"
    results.write_text(results.read_text()[:20])
    return run_dir


@pytest.mark.parametrize("command", [
    ["table", "{run}", "--layout", "gac_table3"],
    ["plot", "{run}", "--out", "{tmp}/plot"],
    ["regress", "{run}", "--baseline", "{base}"],
    ["regress", "{base}", "--baseline", "{run}"],
])
def test_reports_name_a_damaged_row_instead_of_crashing(command, damaged_run, tmp_path, monkeypatch, capsys):
    base = fake_run(tmp_path / "base", ROWS, BASE_RECIPE)
    args = [a.format(run=damaged_run, base=base, tmp=tmp_path) for a in command]
    code, out = run_cli(monkeypatch, capsys, *args)
    line = one_line(out)
    assert code == 1 and str(damaged_run / "gac" / "results_1.json") in line and "damaged" in line, line


def test_a_damaged_recipe_of_a_run_is_named(tmp_path, monkeypatch, capsys):
    run_dir = fake_run(tmp_path / "run", ROWS, BASE_RECIPE)
    (run_dir / "recipe.yaml").write_bytes(b"name: [\xff")
    code, out = run_cli(monkeypatch, capsys, "table", str(run_dir), "--layout", "gac_table3")
    assert code == 1 and f"{run_dir / 'recipe.yaml'}: damaged or unreadable" in one_line(out)


@pytest.mark.slow
@pytest.mark.usefixtures("offline_data")
def test_resume_checks_finished_rows_first_and_recomputes_a_damaged_one_from_the_cache(tiny_dirs, tmp_path,
                                                                                      monkeypatch, capfd):
    from ensemble_bench.recipe import load_recipe
    from ensemble_bench.report.summary import write_summary
    from ensemble_bench.run.runner import run_recipe
    from ensemble_bench.run.setup import run_setup

    monkeypatch.chdir(tmp_path)  # not a git checkout: lm-eval's git lookup must stay quiet
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(tiny_recipe(tiny_dirs, tmp_path / "results"))
    recipe = load_recipe(recipe_path)
    run_dir = run_recipe(run_setup(recipe), write_summary)
    assert "fatal" not in capfd.readouterr().err
    first = {row: row_files(run_dir / row) for row in ("bpe", "sp", "gac")}

    (run_dir / "summary.md").unlink()  # interrupted before the end: gac unfinished, bpe's results truncated
    os.replace(run_dir / "gac", run_dir / ".gac.partial")
    [results] = (run_dir / "bpe").glob("results_*.json")
    results.write_text(results.read_text()[:100])
    events = []
    on_row = lambda row, state: events.append((row.label, state))  # noqa: E731
    assert run_recipe(run_setup(recipe), write_summary, on_row=on_row) == run_dir
    assert events[0][0] == "bpe" and events[0][1].startswith(f"damaged ({results.name} does not parse")
    assert events.index(("bpe", "loading")) > events.index(("sp", "kept from the interrupted run"))
    assert {row: row_files(run_dir / row) for row in ("bpe", "sp", "gac")} == first
    assert json.loads((run_dir / "bpe" / "timing.json").read_text())["requests_computed"] == 0
    assert (run_dir / ".bpe.damaged").is_dir() and (run_dir / "summary.md").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("offline_data")
def test_a_damaged_response_cache_is_one_line_before_any_model_loads(tiny_dirs, tmp_path, monkeypatch, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(tiny_recipe(tiny_dirs, tmp_path / "results"))
    assert run_cli(monkeypatch, capsys, "run", str(recipe))[0] == 0
    [run_dir] = (tmp_path / "results" / "tiny-faults").iterdir()
    (run_dir / "summary.md").unlink()
    (run_dir / "gac" / "timing.json").unlink()  # gac unfinished, its cache overwritten with junk
    db = run_dir / "cache" / "gac_rank0.db"
    db.write_bytes(b"not a database at all" * 200)
    loads = []
    monkeypatch.setattr("ensemble_bench.run.build.build_method", lambda *a: loads.append(a))
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe))
    line = one_line(out)
    assert code == 1 and f"{db}: the response cache is damaged" in line and "remove this file" in line
    assert not loads


# --- 5. environment faults ------------------------------------------------------------------------------------
def test_an_output_that_names_a_file_is_refused_up_front(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("x")
    code, out = dry_run(monkeypatch, capsys, tmp_path, ONE_MEMBER.format(name="a", output=tmp_path / "file" / "deeper"))
    assert code == 1 and f"output: '{tmp_path / 'file'}' is a file, not a folder" in one_line(out)


def test_a_read_only_output_folder_is_refused_up_front(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    if os.geteuid() == 0:  # root writes through a read-only mode: fail the probe as a read-only mount would
        writable = tempfile.TemporaryFile

        def read_only(*args, **kwargs):
            if str(kwargs.get("dir", "")).startswith(str(folder)):
                raise OSError(errno.EROFS, "Read-only file system")
            return writable(*args, **kwargs)
        monkeypatch.setattr("ensemble_bench.run.preflight.tempfile.TemporaryFile", read_only)
    try:
        code, out = dry_run(monkeypatch, capsys, tmp_path, ONE_MEMBER.format(name="a", output=folder))
    finally:
        folder.chmod(0o755)
    line = one_line(out)
    assert code == 1 and f"output: cannot write in '{folder}'" in line and ("Read-only" in line or "Permission" in line)


def test_hub_data_without_network_is_refused_up_front(tmp_path, monkeypatch, capsys):
    text = ONE_MEMBER.format(name="a", output=tmp_path).replace("data: offline\n", "")
    code, out = dry_run(monkeypatch, capsys, tmp_path, text)  # the tests run with HF_DATASETS_OFFLINE=1
    expected = "data: hub needs the network but HF_DATASETS_OFFLINE is set: use data: offline"
    assert code == 1 and expected in one_line(out)
    for variable in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)

    def unreachable(address, timeout):
        assert timeout <= 5
        raise OSError(errno.ENETUNREACH, "Network is unreachable")
    monkeypatch.setattr("ensemble_bench.run.preflight.socket.create_connection", unreachable)
    code, out = dry_run(monkeypatch, capsys, tmp_path, text)
    assert code == 1 and "data: hub cannot reach huggingface.co (Network is unreachable)" in one_line(out)


@pytest.mark.parametrize("device,gpus,mps,expected", [
    ("cuda", 0, False, "members[0].device: 'cuda' is not available (this machine has 0 CUDA device(s))"),
    ("cuda:7", 1, False, "members[0].device: 'cuda:7' is not available (this machine has 1 CUDA device(s))"),
    ("mps", 0, False, "members[0].device: 'mps' is not available on this machine"),
])
def test_an_unavailable_device_is_refused_up_front(device, gpus, mps, expected, tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    text = ONE_MEMBER.format(name="a", output=tmp_path).replace("    name: a\n",
                                                                f"    name: a\n    device: '{device}'\n")
    code, out = dry_run(monkeypatch, capsys, tmp_path, text)
    assert code == 1 and expected in one_line(out)


def test_a_model_folder_without_a_model_is_one_complete_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "empty").mkdir()
    text = ONE_MEMBER.format(name="a", output=tmp_path).replace("model: smollm2-135m", f"model: {tmp_path / 'empty'}")
    code, out = dry_run(monkeypatch, capsys, tmp_path, text)
    assert code == 2 and "holds no saved model (no config.json)" in one_line(out)


def test_a_recipe_that_is_not_utf8_is_one_line(tmp_path, monkeypatch, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_bytes(ONE_MEMBER.format(name="a", output=tmp_path).encode() + b"description: caf\xe9\n")
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe), "--dry-run")
    assert code == 2 and f"{recipe}: not UTF-8 text (byte 0xe9" in one_line(out)


@pytest.mark.usefixtures("offline_data")
@pytest.mark.parametrize("fault", ["ENOSPC on a result file", "sqlite disk full", "EROFS on a result file"])
def test_a_full_or_read_only_disk_mid_run_is_one_line(fault, tiny_dirs, tmp_path, monkeypatch, capsys):
    from ensemble_bench.cache import atomic_write_text

    def failing(path=None, *args):
        if fault == "sqlite disk full":
            raise sqlite3.OperationalError("database or disk is full")
        if path.name != "timing.json":  # the first row's evaluation is done when its timing is written
            return atomic_write_text(path, *args)
        number = errno.ENOSPC if fault.startswith("ENOSPC") else errno.EROFS
        raise OSError(number, os.strerror(number), str(path))
    if fault == "sqlite disk full":
        monkeypatch.setattr("sqlitedict.SqliteDict.__setitem__", failing)
    else:
        monkeypatch.setattr("ensemble_bench.run.folder.atomic_write_text", failing)  # timing.json's writer
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(tiny_recipe(tiny_dirs, tmp_path / "results", limit=2))
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe))
    line = one_line(out)
    assert code == 1 and ("disk full" in line if "full" in fault or "ENOSPC" in fault else "cannot write" in line), line


def test_invalid_model_args_json_in_the_lm_eval_cli_is_one_line(monkeypatch, capsys):
    from ensemble_bench.cli.lm_eval import main as lm_eval_main

    monkeypatch.setattr(sys, "argv", ["ensbench-lm-eval", "run", "--model", "single", "--model_args", '{"members": [',
                                      "--tasks", "piqa"])
    with pytest.raises(SystemExit) as exit_info:
        lm_eval_main()
    out = capsys.readouterr()
    assert exit_info.value.code == 2 and "Invalid JSON" in one_line(out)


# --- 6. silent surprises ----------------------------------------------------------------------------------------
def test_a_duplicate_yaml_key_is_refused_with_its_line(tmp_path, monkeypatch, capsys):
    text = ONE_MEMBER.format(name="a", output=tmp_path).replace("method: single\n",
                                                                "method: {name: gac, gate: a}\nmethod: single\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe), "--dry-run")
    assert code == 2 and f"{recipe}: not valid YAML (line 6): duplicate key 'method'" in one_line(out)


# --- interrupts: SIGINT and SIGKILL at several points, identical files after the resume -----------------------
def wait_for(condition, process, seconds=120):
    deadline = time.time() + seconds
    while time.time() < deadline and process.poll() is None and not condition():
        time.sleep(0.02)
    assert process.poll() is None, "the run finished before it could be interrupted"


def cached(run_root, row):
    dbs = list(run_root.glob(f"*/cache/{row}_rank0.db"))
    if not dbs:
        return 0
    try:
        with sqlite3.connect(dbs[0]) as connection:
            return connection.execute("select count(*) from unnamed").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_a_chunk_of_answers_is_cached_in_one_statement(bpe_tokenizer, bpe_model, tmp_path):
    """sqlite commits each statement of lm-eval's response cache on its own; one statement per chunk
    means a kill leaves the whole chunk cached or none of it, so the resumed run batches the rest as
    an uninterrupted run does (the CI failure of stop 45: half a chunk kept, scores 1 ulp apart)."""
    from lm_eval.api.instance import Instance
    from lm_eval.api.model import CachingLM

    from ensemble_bench.members.local import LocalMember
    from ensemble_bench.methods.single import Single
    from ensemble_bench.run.lm import EnsembleLM
    from tests.tiny import CORPUS

    def caching_lm():
        method = Single([LocalMember(bpe_model, bpe_tokenizer, "s")], Single.Params(), batch_size=2)
        return CachingLM(EnsembleLM(method, "s"), str(tmp_path / "s_rank0.db"))

    contexts = [CORPUS[i][:20 + 7 * i] for i in range(3)]
    requests = [Instance("loglikelihood", {}, (context, choice), k)
                for context in contexts for k, choice in enumerate((" yes", " no"))]
    requests.append(Instance("loglikelihood", {}, (CORPUS[3][:15], " maybe"), 0))
    first = caching_lm()
    rows_written = []  # per REPLACE statement while ensbench answers (lm-eval writes them all again after)
    execute, answer = first.dbdict.conn.execute, first.lm.loglikelihood

    def recording(sql, values=(), *rest):
        if sql.startswith("REPLACE") and rows_written is not None:
            rows_written.append(len(values) // 2)
        return execute(sql, values, *rest)

    def answering(batch):
        nonlocal rows_written
        try:
            return answer(batch)
        finally:
            rows_written, recorded = None, rows_written
            answering.recorded = recorded

    first.dbdict.conn.execute, first.lm.loglikelihood = recording, answering
    answers = first.loglikelihood(requests)
    assert [len(c) for c in first.lm._chunks(requests)] == [2, 2, 2, 1]
    assert answering.recorded == [2, 2, 2, 1]
    again = caching_lm()
    assert again.loglikelihood(requests) == answers and again.lm.requests_computed == 0


POINTS = {  # where the run is interrupted
    "first answers cached": lambda root: cached(root, "bpe") >= 2,
    "first row finished": lambda root: any(root.glob("*/bpe/timing.json")),
    "inside the ensemble row": lambda root: cached(root, "gac") >= 2,
}


def default_sigint():
    """In the child: Ctrl-C's default action, also when pytest itself was started in the background
    of a shell without job control (which starts it with SIGINT ignored, and children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def uninterrupted(tiny_dirs, tmp_path_factory):
    """The files of an uninterrupted run of the interrupt tests' recipe."""
    from ensemble_bench.recipe import load_recipe
    from ensemble_bench.report.summary import write_summary
    from ensemble_bench.run.runner import run_recipe
    from ensemble_bench.run.setup import run_setup

    folder = tmp_path_factory.mktemp("whole")
    recipe = folder / "recipe.yaml"
    recipe.write_text(tiny_recipe(tiny_dirs, folder / "results", limit=8))
    run_dir = run_recipe(run_setup(load_recipe(recipe)), write_summary)
    return {row: row_files(run_dir / row) for row in ("bpe", "sp", "gac")}


@pytest.mark.slow
@pytest.mark.usefixtures("offline_data")
@pytest.mark.parametrize("sig,point", [(signal.SIGINT, "first answers cached"),
                                       (signal.SIGINT, "inside the ensemble row"),
                                       (signal.SIGKILL, "first row finished")])
def test_an_interrupted_run_resumes_to_identical_files(sig, point, tiny_dirs, uninterrupted, tmp_path):
    for attempt in range(3):  # on a loaded machine the tiny run can finish while the signal is on its way
        folder = tmp_path / f"attempt{attempt}"
        recipe = folder / "recipe.yaml"
        folder.mkdir()
        recipe.write_text(tiny_recipe(tiny_dirs, folder / "results", limit=8))
        # one torch thread, as the in-process baseline (conftest): float sums can differ across thread counts
        command = [sys.executable, "-m", "ensemble_bench.cli", "run", str(recipe), "--threads", "1"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   preexec_fn=default_sigint)
        wait_for(partial(POINTS[point], folder / "results" / "tiny-faults"), process)
        process.send_signal(sig)
        stderr = process.communicate(timeout=60)[1]
        if not (process.returncode == 0 and any((folder / "results" / "tiny-faults").glob("*/summary.md"))):
            break
    if sig == signal.SIGINT:
        assert process.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
        assert stderr.strip().splitlines()[-1] == "interrupted: run the same command again to resume"
    [run_dir] = (folder / "results" / "tiny-faults").iterdir()
    assert not (run_dir / "summary.md").exists()
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "kept from the interrupted run" in done.stdout or point == "first answers cached"
    assert {row: row_files(run_dir / row) for row in ("bpe", "sp", "gac")} == uninterrupted
