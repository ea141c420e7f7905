"""`ensbench run` end to end on tiny local models and the offline suite: files, table, resume."""

import json
import shutil
import sys
import textwrap

import pytest

from ensemble_bench.cli.main import main

pytestmark = pytest.mark.usefixtures("offline_data")


def recipe_text(dirs, output):
    return textwrap.dedent(f"""\
        name: tiny-run
        members:
          - model: {dirs[0]}
            name: bpe
          - model: {dirs[1]}
            name: sp
        method:
          name: gac
          threshold: 0.6
          gate: bpe
        singles: true
        tasks:
          - name: piqa
            limit: 6
          - name: gsm8k
            shots: 1
            limit: 2
        batch_size: 2
        data: offline
        output: {output}
    """)


def run(monkeypatch, *args):
    monkeypatch.setattr(sys, "argv", ["ensbench", *args])
    try:
        main()
    except SystemExit as exit_info:
        return exit_info.code
    return 0


def samples_of(row_dir):
    found = {}
    for path in sorted(row_dir.glob("samples_*.jsonl")):
        task = path.name.split("_")[1]
        found[task] = [(r["doc_id"], r["filter"], r["resps"]) for r in map(json.loads, path.read_text().splitlines())]
    return found


@pytest.mark.slow
def test_run_writes_lm_eval_files_and_summary_then_resumes(tiny_dirs, tmp_path, monkeypatch, capsys):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(recipe_text(tiny_dirs, tmp_path / "results"))
    assert run(monkeypatch, "run", str(recipe)) == 0
    [run_dir] = (tmp_path / "results" / "tiny-run").iterdir()
    for row in ("bpe", "sp", "gac"):
        assert list((run_dir / row).glob("results_*.json")) and list((run_dir / row).glob("samples_piqa_*.jsonl"))
        timing = json.loads((run_dir / row / "timing.json").read_text())
        assert timing["tokens_generated"] > 0 and timing["decode_ms_per_token"] > 0
    summary = (run_dir / "summary.md").read_text()
    assert "| bpe" in summary and "| sp" in summary and "| gac" in summary and "piqa" in summary
    results = json.loads(next((run_dir / "bpe").glob("results_*.json")).read_text())
    assert results["config"]["ensbench"]["method"] == "single"
    gac = json.loads(next((run_dir / "gac").glob("results_*.json")).read_text())["config"]["ensbench"]
    assert gac["method"] == "gac" and 0 < gac["ensembled_fraction"] <= 1 and gac["gac"]["union_size"] > 400
    first = {row: samples_of(run_dir / row) for row in ("bpe", "sp", "gac")}
    first_tokens = {row: json.loads((run_dir / row / "timing.json").read_text())["tokens_generated"]
                    for row in ("sp", "gac")}
    assert len({doc for doc, _, _ in first["bpe"]["piqa"]}) == 6
    assert len({doc for doc, _, _ in first["bpe"]["gsm8k"]}) == 2

    # an interrupted run: the second and third rows never finished and no summary was written
    shutil.rmtree(run_dir / "sp")
    shutil.rmtree(run_dir / "gac")
    (run_dir / "summary.md").unlink()
    capsys.readouterr()
    assert run(monkeypatch, "run", str(recipe)) == 0
    assert [p.name for p in (tmp_path / "results" / "tiny-run").iterdir()] == [run_dir.name]
    assert "kept" in capsys.readouterr().out
    for row in ("sp", "gac"):
        timing = json.loads((run_dir / row / "timing.json").read_text())
        assert timing["requests_computed"] == 0  # every answer came from the response cache,
        assert timing["tokens_generated"] == first_tokens[row]  # and its statistics from the first sitting
    assert {row: samples_of(run_dir / row) for row in ("bpe", "sp", "gac")} == first

    # a fresh run of the same recipe: a new directory, identical answers and scores
    assert run(monkeypatch, "run", str(recipe), "--fresh") == 0
    runs = sorted((tmp_path / "results" / "tiny-run").iterdir())
    assert len(runs) == 2
    assert {row: samples_of(runs[1] / row) for row in ("bpe", "sp", "gac")} == first
    scores = [(r / "summary.csv").read_text().split("ms/token")[0] for r in runs]
    assert scores[0] == scores[1]


def test_stock_lm_eval_registry_builds_our_models(tiny_dirs):
    """`lm_eval --model gac --model_args '<json>'`: the registered name builds the method."""
    from lm_eval.api.instance import Instance
    from lm_eval.api.registry import get_model

    from ensemble_bench.run.lm import register_all

    register_all()
    members = [{"model": str(tiny_dirs[0]), "name": "a"}, {"model": str(tiny_dirs[1]), "name": "b"}]
    args = json.dumps({"members": members, "method": {"name": "gac", "threshold": 0.5, "gate": "b"}})
    lm = get_model("gac").create_from_arg_string(args, {"batch_size": 2})
    assert lm.method.name == "gac" and lm.method.batch_size == 2 and lm.method.gate == 1
    request = Instance(request_type="generate_until", doc={}, idx=0,
                       arguments=("The quick brown", {"until": ["\n"], "max_gen_toks": 5}))
    assert isinstance(lm.generate_until([request])[0], str)
    single = get_model("single").create_from_arg_string(json.dumps({"members": [{"model": str(tiny_dirs[0])}]}))
    assert single.method.name == "single"


@pytest.mark.slow
def test_stock_lm_eval_cli_runs_our_models(tiny_dirs, tmp_path):
    """`ensbench-lm-eval run --model single ...` on the offline PIQA config: lm-eval's own CLI."""
    import subprocess

    from ensemble_bench.tasks import get_benchmark
    from ensemble_bench.tasks.offline import write_task_configs

    group = write_task_configs([(get_benchmark("piqa"), 0)], tmp_path / "tasks", "offline")
    args = json.dumps({"members": [{"model": str(tiny_dirs[0])}]})
    done = subprocess.run(
        [sys.executable, "-c", "from ensemble_bench.cli.lm_eval import main; main()", "run",
         "--model", "single", "--model_args", args, "--tasks", group, "--include_path", str(tmp_path / "tasks"),
         "--limit", "3", "--output_path", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "piqa" in done.stdout and list((tmp_path / "out").rglob("results_*.json"))


def cached_requests(db) -> int:
    import sqlite3

    if not db.exists():
        return 0
    with sqlite3.connect(db) as connection:
        try:
            return connection.execute("select count(*) from unnamed").fetchone()[0]
        except sqlite3.OperationalError:  # the file exists, its table not yet
            return 0


@pytest.mark.slow
def test_a_killed_run_resumes_and_computes_no_request_twice(tiny_dirs, tmp_path):
    """SIGKILL a run in a subprocess once answers are cached, run it again: the final files equal
    an uninterrupted run's, and the resumed process computes exactly the requests not cached."""
    import signal
    import subprocess
    import time

    text = recipe_text(tiny_dirs, tmp_path / "killed").replace("limit: 6", "limit: 30")
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(text)
    command = [sys.executable, "-m", "ensemble_bench.cli", "run", str(recipe)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cache = tmp_path / "killed" / "tiny-run"
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        dbs = list(cache.glob("*/cache/*.db"))
        if dbs and any(cached_requests(db) >= 16 for db in dbs):
            break
        time.sleep(0.05)
    assert process.poll() is None, "the run finished before it could be interrupted"
    process.send_signal(signal.SIGKILL)
    process.wait()
    [run_dir] = cache.iterdir()
    assert not (run_dir / "summary.md").exists()
    finished_before = {row for row in ("bpe", "sp", "gac") if (run_dir / row / "timing.json").exists()}
    cached_before = {row: cached_requests(run_dir / "cache" / f"{row}_rank0.db") for row in ("bpe", "sp", "gac")}
    assert sum(cached_before.values()) > 0

    assert subprocess.run(command, capture_output=True).returncode == 0
    assert (run_dir / "summary.md").exists()
    for row in ("bpe", "sp", "gac"):
        total = cached_requests(run_dir / "cache" / f"{row}_rank0.db")
        if row not in finished_before:
            computed = json.loads((run_dir / row / "timing.json").read_text())["requests_computed"]
            assert computed == total - cached_before[row], row

    recipe.write_text(text.replace(str(tmp_path / "killed"), str(tmp_path / "whole")))
    assert subprocess.run(command, capture_output=True).returncode == 0
    [whole] = (tmp_path / "whole" / "tiny-run").iterdir()
    assert {row: samples_of(run_dir / row) for row in ("bpe", "sp", "gac")} == \
           {row: samples_of(whole / row) for row in ("bpe", "sp", "gac")}
    scores = [(r / "summary.csv").read_text().split("ms/token")[0] for r in (run_dir, whole)]
    assert scores[0] == scores[1]


@pytest.mark.slow
def test_a_run_made_under_other_defaults_is_neither_resumed_nor_reused(tiny_dirs, tmp_path, monkeypatch, caplog):
    """params.json holds every row's parameters with this code's defaults; when a default changes
    (here: the stored file says GaC's retokenize was canonical), the old run is left alone."""
    from ensemble_bench.recipe import load_recipe
    from ensemble_bench.run.folder import PARAMS
    from ensemble_bench.run.runs import finished_run, run_dir_of

    recipe_path = tmp_path / "tiny.yaml"
    recipe_path.write_text(recipe_text(tiny_dirs, tmp_path / "results"))
    assert run(monkeypatch, "run", str(recipe_path)) == 0
    [run_dir] = (tmp_path / "results" / "tiny-run").iterdir()
    recipe = load_recipe(recipe_path)
    stored = json.loads((run_dir / PARAMS).read_text())
    assert stored["gac"]["retokenize"] == "local" and stored["gac"]["threshold"] == 0.6 and stored["bpe"] == {}
    root = tmp_path / "results"
    assert finished_run(recipe, root) == run_dir

    stored["gac"]["retokenize"] = "canonical"
    (run_dir / PARAMS).write_text(json.dumps(stored))
    assert finished_run(recipe, root) is None
    (run_dir / "summary.md").unlink()  # unfinished now: still not resumed, and the user is told why in one line
    assert run_dir_of(recipe, root, fresh=False)[1] is False
    [said] = [r.getMessage() for r in caplog.records if "not resumed" in r.getMessage()]
    assert str(run_dir) in said and "other method parameters" in said and "\n" not in said
