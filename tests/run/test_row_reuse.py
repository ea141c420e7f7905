"""Finished rows are reused across runs and recipes of one output folder (ensemble_bench/run/row_store.py):
a second recipe with another method computes no member-alone request, a raised limit computes only the
new examples, and a member whose outputs may differ (another dtype) is computed again."""

import contextlib
import json
import os
import shutil
import sqlite3
import sys
import textwrap

import pytest

from ensemble_bench.cli import main as cli
from ensemble_bench.recipe import parse_recipe, selected_benchmarks
from ensemble_bench.run import build as build_module
from ensemble_bench.run.row_store import INDEX, REUSED, RowStore, StoredRow, row_keys
from tests.cli_helpers import run_cli

pytestmark = pytest.mark.usefixtures("offline_data")
PIQA_CHOICES = 2


def recipe_text(dirs, output, method="gac", limit=3, x_dtype="float32"):
    return textwrap.dedent(f"""\
        name: tiny-{method}
        members:
          - model: {dirs[0]}
            name: x
            dtype: {x_dtype}
          - model: {dirs[1]}
            name: y
        method: {method}
        singles: true
        tasks:
          - name: piqa
            limit: {limit}
        batch_size: 2
        data: offline
        output: {output}
    """)


def cli_run(monkeypatch, capsys, tmp_path, text, *flags):
    """Run the recipe in this process; the row labels whose method was built (computed) and the run folder."""
    built = []
    build = build_module.build_method

    def recording(recipe, row, pool):
        built.append(row.label)
        return build(recipe, row, pool)

    monkeypatch.setattr(build_module, "build_method", recording)
    path = tmp_path / f"recipe-{len(list(tmp_path.glob('recipe-*')))}.yaml"
    path.write_text(text)
    code, out = run_cli(monkeypatch, capsys, "run", str(path), *flags)
    assert code == 0, out.err[-2000:]
    monkeypatch.undo()
    recipe = yaml_name(text)
    return built, max((tmp_path / "results" / recipe).iterdir())


def yaml_name(text):
    return text.splitlines()[0].removeprefix("name: ")


def timing(run_dir, row):
    return json.loads((run_dir / row / "timing.json").read_text())


def samples(row_dir):
    return {p.name.split("_")[1]: [(s["doc_id"], s["resps"]) for s in map(json.loads, p.read_text().splitlines())]
            for p in sorted(row_dir.glob("samples_*.jsonl"))}


def cached(db):
    with sqlite3.connect(db) as connection:
        return connection.execute("select count(*) from unnamed").fetchone()[0]


@pytest.fixture(scope="module")
def first_run(tiny_dirs, tmp_path_factory):
    """Recipe A (members x and y, GaC, each alone) run once; each test copies its output folder."""
    folder = tmp_path_factory.mktemp("first")
    path = folder / "a.yaml"
    path.write_text(recipe_text(tiny_dirs, folder / "results"))
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(sys, "argv", ["ensbench", "run", str(path)])
        with contextlib.suppress(SystemExit):
            cli.main()
    assert list((folder / "results" / "tiny-gac").glob("*/summary.md"))
    return folder / "results"


@pytest.fixture
def output(first_run, tmp_path):
    shutil.copytree(first_run, tmp_path / "results")
    [run_a] = (tmp_path / "results" / "tiny-gac").iterdir()
    return run_a


@pytest.mark.slow
def test_another_method_computes_no_member_alone_request(tiny_dirs, tmp_path, monkeypatch, capsys, output):
    run_a = output
    before = {p: p.read_bytes() for p in sorted(run_a.rglob("*")) if p.is_file()}
    built, run_b = cli_run(monkeypatch, capsys, tmp_path, recipe_text(tiny_dirs, tmp_path / "results", "unite"))
    assert built == ["unite"]  # x and y alone: copied, no member alone computed a request
    reused = json.loads((run_b / REUSED).read_text())
    source = f"tiny-gac/{run_a.name}"
    assert {row: reused[row]["from"] for row in ("x", "y")} == {"x": f"{source}/x", "y": f"{source}/y"}
    for row in ("x", "y"):
        assert timing(run_b, row)["reused_from"] == f"{source}/{row}"
        assert timing(run_b, row)["decode_ms_per_token"] == timing(run_a, row)["decode_ms_per_token"]
        assert samples(run_b / row) == samples(run_a / row)
    assert timing(run_b, "unite")["requests_computed"] == 3 * PIQA_CHOICES
    summary = (run_b / "summary.md").read_text()
    assert "| x" in summary and f"- x: copied from `{source}/x`" in summary
    assert {p: p.read_bytes() for p in sorted(run_a.rglob("*")) if p.is_file()} == before  # the source: untouched


@pytest.mark.slow
def test_a_raised_limit_computes_only_the_new_examples(tiny_dirs, tmp_path, monkeypatch, capsys, output):
    run_a = output
    built, run_c = cli_run(monkeypatch, capsys, tmp_path, recipe_text(tiny_dirs, tmp_path / "results", limit=5))
    assert built == ["x", "y", "gac"] and run_c != run_a
    for row in ("x", "y", "gac"):
        computed = timing(run_c, row)["requests_computed"]
        assert computed == 2 * PIQA_CHOICES  # examples 4 and 5 only; 1-3 answered from run A's cache
        assert cached(run_c / "cache" / f"{row}_rank0.db") - cached(run_a / "cache" / f"{row}_rank0.db") == computed
        first = {task: answers[:3] for task, answers in samples(run_c / row).items()}
        assert first == samples(run_a / row)
    reused = json.loads((run_c / REUSED).read_text())
    assert reused["x"]["cache_from"] == f"tiny-gac/{run_a.name}/cache/x_rank0.db"
    assert f"- x: answers already in `tiny-gac/{run_a.name}/cache/x_rank0.db`'s response cache were reused" in \
        (run_c / "summary.md").read_text()


@pytest.mark.slow
def test_a_lineage_that_ran_other_shots_gives_no_cached_answers_and_says_so(tiny_dirs, tmp_path, monkeypatch, capsys,
                                                                           output):
    """Issue 47: "answers cached in ... are reused" was said of a row whose lineage's cache held none of its tasks."""
    run_a = output
    lines = {}
    for name, limit, shots in (("shots", 3, "    shots: 1\n"), ("more", 5, "")):
        text = recipe_text(tiny_dirs, tmp_path / "results", limit=limit).replace(f"limit: {limit}\n",
                                                                                 f"limit: {limit}\n{shots}")
        path = tmp_path / f"{name}.yaml"
        path.write_text(text.replace("name: tiny-gac", f"name: tiny-{name}"))
        code, out = run_cli(monkeypatch, capsys, "run", str(path))
        assert code == 0, out.err[-2000:]
        lines[name] = [line for line in out.out.splitlines() if line.startswith("x: ") and "cached" in line]
    source = f"tiny-gac/{run_a.name}/cache/x_rank0.db"
    assert lines["shots"] == [f"x: no cached answers ({source} holds none of its tasks with their shots)"]
    assert lines["more"] == [f"x: answers cached in {source} are reused where the requests match (piqa)"]
    [run_shots] = (tmp_path / "results" / "tiny-shots").iterdir()
    assert timing(run_shots, "x")["requests_computed"] == 3 * PIQA_CHOICES
    assert not (run_shots / REUSED).exists()  # nothing taken from the other run


@pytest.mark.slow
def test_a_changed_member_or_fresh_run_is_not_reused(tiny_dirs, tmp_path, monkeypatch, capsys, output):
    text = recipe_text(tiny_dirs, tmp_path / "results", x_dtype="bfloat16")
    built, run_d = cli_run(monkeypatch, capsys, tmp_path, text)
    assert built == ["x", "gac"]  # x in bfloat16 and the ensemble over it: computed; y: reused
    assert timing(run_d, "x")["requests_computed"] == timing(run_d, "gac")["requests_computed"] == 3 * PIQA_CHOICES
    assert set(json.loads((run_d / REUSED).read_text())) == {"y"}
    built, _ = cli_run(monkeypatch, capsys, tmp_path, text, "--fresh")
    assert built == ["x", "y", "gac"]


def keys_of(dirs, tmp_path, **changes):
    tasks = tmp_path / "tasks"
    tasks.mkdir(exist_ok=True)
    (tasks / "group.yaml").write_text(changes.pop("task_file", "task: piqa\n"))
    data = {"name": "k", "members": [{"model": dirs[0], "name": "x"}, {"model": dirs[1], "name": "y"}],
            "method": {"name": "gac"}, "singles": True, "tasks": ["piqa"], "data": "offline", **changes}
    recipe = parse_recipe(data)
    return row_keys(recipe, recipe.plan, [tasks], [(recipe.limit, "group")], selected_benchmarks(recipe, None))


def test_the_key_holds_what_decides_outputs_and_nothing_else(tiny_dirs, tmp_path, monkeypatch):
    base = keys_of(tiny_dirs, tmp_path)
    same = [{"batch_size": 8}, {"output": "elsewhere"}, {"name": "other"}, {"description": "words"},
            {"method": {"name": "unite"}}]
    for change in same:
        assert keys_of(tiny_dirs, tmp_path, **change)["x"] == base["x"], change
    other_member = {"members": [{"model": tiny_dirs[0], "name": "x", "chat_template": True},
                                {"model": tiny_dirs[1], "name": "y"}]}
    for change in ({"seed": 7}, {"limit": 9}, {"task_file": "task: piqa\nnum_fewshot: 1\n"}, other_member):
        assert keys_of(tiny_dirs, tmp_path, **change)["x"].key != base["x"].key, change
    assert keys_of(tiny_dirs, tmp_path, limit=9)["x"].lineage == base["x"].lineage
    assert keys_of(tiny_dirs, tmp_path, method={"name": "gac", "threshold": 0.5})["gac"] != base["gac"]
    assert keys_of(tiny_dirs, tmp_path, method={"name": "gac", "threshold": 0.5})["y"] == base["y"]
    from ensemble_bench.methods import method_spec

    monkeypatch.setattr(method_spec("gac"), "version", 2)  # the declaration's: the implementation inherits it
    assert keys_of(tiny_dirs, tmp_path)["gac"] != base["gac"] and keys_of(tiny_dirs, tmp_path)["x"] == base["x"]


def test_an_index_entry_pointing_outside_the_output_folder_is_ignored(tiny_dirs, tmp_path):
    key = keys_of(tiny_dirs, tmp_path)["x"]
    root = tmp_path / "results"
    outside = tmp_path / "elsewhere" / "x"
    outside.mkdir(parents=True)
    (outside / "timing.json").write_text(json.dumps({"row_key": key.key}))
    (root / INDEX).mkdir(parents=True)
    (root / INDEX / f"{key.key}.json").write_text(json.dumps({"run": "../elsewhere", "row": "x",
                                                              "lineage": key.lineage, "cache": "../elsewhere/c.db"}))
    store = RowStore(root, lambda row_dir: None)
    assert store.finished(key) is None and store.lineage_cache(key) is None
    (root / "r" / "x").mkdir(parents=True)
    shutil.copy(outside / "timing.json", root / "r" / "x")
    (root / INDEX / f"{key.key}.json").write_text(json.dumps({"run": "r", "row": "x"}))
    assert store.finished(key) == StoredRow(root / "r" / "x", "r/x", None)


# --- member keys from content (issue 47) ------------------------------------------------------------------
def rewrite_negated(weights):
    """The float32 tensors of a safetensors file negated in place (each value's sign bit flipped): the
    same size and inode, its mtime set back as ``touch -r`` would (its ctime cannot be)."""
    stat = weights.stat()
    data = bytearray(weights.read_bytes())
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    for tensor in (t for name, t in header.items() if name != "__metadata__"):
        assert tensor["dtype"] == "F32"
        start, end = (8 + size + offset for offset in tensor["data_offsets"])
        data[start + 3:end:4] = bytes(b ^ 0x80 for b in data[start + 3:end:4])
    with open(weights, "r+b") as fh:
        fh.write(data)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = weights.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (stat.st_size, stat.st_mtime_ns, stat.st_ino)


def test_a_member_file_rewritten_with_its_mtime_set_back_changes_the_key(tiny_dirs, tmp_path):
    folder = tmp_path / "member"
    shutil.copytree(tiny_dirs[0], folder)
    dirs = [str(folder), tiny_dirs[1]]
    before = keys_of(dirs, tmp_path)
    rewrite_negated(folder / "model.safetensors")
    after = keys_of(dirs, tmp_path)
    assert after["x"].key != before["x"].key and after["gac"].key != before["gac"].key
    assert after["x"].lineage != before["x"].lineage  # nor does its response cache answer the new weights
    assert after["y"] == before["y"]


def test_member_files_are_hashed_once_while_their_stat_stays(tiny_dirs, tmp_path, monkeypatch):
    import ensemble_bench.cache as cache

    folder = tmp_path / "member"
    shutil.copytree(tiny_dirs[0], folder)
    dirs = [str(folder), tiny_dirs[1]]
    first = keys_of(dirs, tmp_path)
    hashed = []
    monkeypatch.setattr(cache, "file_sha256", lambda path: hashed.append(path) or "rehashed")
    assert keys_of(dirs, tmp_path) == first and hashed == []
    (folder / "config.json").write_text((folder / "config.json").read_text() + " ")
    assert keys_of(dirs, tmp_path)["x"] != first["x"] and hashed == [(folder / "config.json").resolve()]


def test_a_packaged_member_is_keyed_by_its_checked_sha256_unread(tmp_path, monkeypatch):
    """Its SHA-256 is checked when it loads (members/sources.py): the key takes it without a second hash."""
    import ensemble_bench.cache as cache
    from ensemble_bench.members.sources import PACKAGED
    from ensemble_bench.run.row_store import _member

    monkeypatch.setattr(cache, "file_sha256", lambda path: pytest.fail(f"{path} hashed for the key"))
    recipe = parse_recipe({"name": "k", "members": [{"model": "smollm2-135m", "name": "s"}], "method": "single",
                           "tasks": ["piqa"], "data": "offline"})
    assert _member(recipe.members[0])["files"] == PACKAGED["smollm2-135m"].sha256
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "group.yaml").write_text("task: piqa\n")
    assert row_keys(recipe, recipe.plan, [tasks], [(recipe.limit, "group")], selected_benchmarks(recipe, None))["s"].key


def test_only_a_large_file_is_announced_when_it_is_hashed(tiny_dirs, tmp_path, monkeypatch, caplog):
    from ensemble_bench.tasks import task_sources

    folder = tmp_path / "member"
    shutil.copytree(tiny_dirs[0], folder)
    weights = folder / "model.safetensors"
    monkeypatch.setattr(task_sources, "LONG_HASH_BYTES", weights.stat().st_size)  # the largest file of the folder
    keys_of([str(folder), tiny_dirs[1]], tmp_path)
    announced = [r.getMessage() for r in caplog.records if str(folder.resolve()) in r.getMessage()]
    assert announced == [f"hashing {weights.resolve()} (0.0 GB) once, for the row keys: its digest is kept until "
                         "the file changes"]
    caplog.clear()
    keys_of([str(folder), tiny_dirs[1]], tmp_path)
    assert not [r for r in caplog.records if str(folder.resolve()) in r.getMessage()]
