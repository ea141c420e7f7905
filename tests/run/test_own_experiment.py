"""A researcher's own experiment, end to end, with two tiny models (docs/own_experiment.md walks through it):
their own task YAML through include_path and a stock lm-eval task by name in one recipe, run with
``--limit 3 --set ...``; a second recipe that adds a method and computes no member row again; ``ensbench
table`` without a layout giving LaTeX that compiles; ``ensbench plot`` of the multiple-choice run by
ms/request; and the same pair through ``ensbench-lm-eval --batch_size auto --device cpu --log_samples``."""

import contextlib
import io
import json
import sys
import textwrap

import pytest
import yaml

from ensemble_bench.cli import main as cli
from ensemble_bench.run import build as build_module
from ensemble_bench.run.row_store import REUSED
from tests.cli.test_lm_eval_route import lm_eval
from tests.cli_helpers import run_cli
from tests.report.test_latex import strict_problems
from tests.tasks.test_any_task import MC, QA, task_yaml

LIMIT = 3


def own_recipe(dirs, folder, methods: str) -> str:
    """The researcher's recipe: their pair, their own task (include_path) and lm-eval's arc_challenge."""
    return textwrap.dedent(f"""\
        name: my-pair
        members:
          - {{model: {dirs[0]}, name: small_bpe}}
          - {{model: {dirs[1]}, name: small_sp}}
        {methods}
        singles: true
        include_path: {folder / "my_tasks"}
        tasks:
          - {{name: my_mc, num_fewshot: 1}}
          - arc_challenge
        batch_size: 2
        data: offline
        output: {folder / "results"}
        """)


def in_process(*argv) -> tuple[int, str, str, list[str]]:
    """``ensbench ARGV`` in this process: exit code, stdout, stderr and the labels of the rows computed."""
    computed, build = [], build_module.build_method

    def recording(recipe, row, pool):
        computed.append(row.label)
        return build(recipe, row, pool)

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        patch.setattr(build_module, "build_method", recording)
        patch.setattr(sys, "argv", ["ensbench", *argv])
        try:
            cli.main()
            code = 0
        except SystemExit as done:
            code = done.code or 0
    return code, out.getvalue(), err.getvalue(), computed


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The researcher's folder: my_tasks/ with a multiple-choice and a generative task on local JSON files."""
    root = tmp_path_factory.mktemp("own")
    (root / "my_tasks").mkdir()
    for name, rows in (("mc", MC), ("qa", QA)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        (root / "my_tasks" / f"my_{name}.yaml").write_text(task_yaml(f"my_{name}", str(root / f"{name}.jsonl"), name))
    return root


@pytest.fixture(scope="module")
def first(tiny_dirs, folder):
    """Recipe one (GaC and each member alone), run with overrides: (run folder, stdout, rows computed)."""
    path = folder / "my-pair.yaml"
    path.write_text(own_recipe(tiny_dirs, folder, "method: gac"))
    code, out, err, computed = in_process("run", str(path), "--limit", str(LIMIT), "--set", "method.weights=[2,1]")
    assert code == 0, err[-3000:]
    [run_dir] = (folder / "results" / "my-pair").iterdir()
    return run_dir, out, computed


@pytest.fixture(scope="module")
def second(tiny_dirs, folder, first):
    """Recipe two: the same pair and tasks, UniTE added: (run folder, rows computed)."""
    path = folder / "my-pair-unite.yaml"
    path.write_text(own_recipe(tiny_dirs, folder, "methods: [{name: gac, weights: [2, 1]}, unite]")
                    .replace("name: my-pair\n", "name: my-pair-unite\n"))
    code, _, err, computed = in_process("run", str(path), "--limit", str(LIMIT))
    assert code == 0, err[-3000:]
    [run_dir] = (folder / "results" / "my-pair-unite").iterdir()
    return run_dir, computed


def samples(row_dir, task):
    [path] = row_dir.glob(f"samples_{task}_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_dry_run_shows_the_plan_and_where_results_go(tiny_dirs, folder, monkeypatch, capsys):
    path = folder / "dry.yaml"
    path.write_text(own_recipe(tiny_dirs, folder, "method: gac").replace("name: my-pair\n", "name: dry\n"))
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run", "--limit", "3")
    assert code == 0, out.err
    assert f"results: {folder / 'results' / 'dry'}/" in out.out and "(a new run)" in out.out
    assert not (folder / "results" / "dry").exists()


@pytest.mark.slow
def test_own_task_through_include_path_runs_with_its_shots(first):
    run_dir, _, computed = first
    assert computed == ["small_bpe", "small_sp", "gac"]
    for row in computed:
        found = samples(run_dir / row, "my_mc")
        assert [s["doc_id"] for s in found] == list(range(LIMIT))
        prompt = found[0]["arguments"]["gen_args_0"]["arg_0"]
        assert prompt.count("even?") == 2  # one shot, then the question


def test_a_stock_lm_eval_task_by_name_runs_on_the_packaged_copy(first):
    run_dir, _, _ = first
    assert len(samples(run_dir / "gac", "arc_challenge")) == LIMIT
    header = (run_dir / "summary.csv").read_text().splitlines()[0]
    assert "my_mc (acc)" in header and "arc_c (acc)" in header


def test_the_overrides_are_the_recipe_as_run(first):
    run_dir, out, _ = first
    as_run = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    assert [t["limit"] for t in as_run["tasks"]] == [LIMIT, LIMIT]
    assert as_run["method"]["weights"] == [2, 1]
    assert out.rstrip().endswith(f"results: {run_dir}")


@pytest.mark.slow
def test_a_second_recipe_adding_a_method_computes_no_member_row(first, second):
    first_dir, _, _ = first
    run_dir, computed = second
    assert computed == ["unite"]  # each member alone and GaC: the first recipe's rows, copied
    reused = json.loads((run_dir / REUSED).read_text())
    source = f"my-pair/{first_dir.name}"
    assert {row: reused[row]["from"] for row in reused} == {
        row: f"{source}/{row}" for row in ("small_bpe", "small_sp", "gac")}
    timing = json.loads((run_dir / "unite" / "timing.json").read_text())
    requests = sum(len(s["arguments"]) for task in ("my_mc", "arc_challenge") for s in samples(run_dir / "unite", task))
    assert timing["requests_computed"] == requests  # one per choice of each question: UniTE's own, nothing else
    assert samples(run_dir / "small_bpe", "my_mc") == samples(first_dir / "small_bpe", "my_mc")


def test_a_table_of_any_run_writes_escaped_latex(second, tmp_path, monkeypatch, capsys):
    run_dir, _ = second
    code, out = run_cli(monkeypatch, capsys, "table", str(run_dir), "--out", str(tmp_path / "mine"))
    assert code == 0, out.err
    tex = (tmp_path / "mine.tex").read_text()
    assert strict_problems(tex) == []
    assert "small\\_bpe" in tex and "my\\_mc" in tex and "unite" in tex
    assert "small_bpe" in (tmp_path / "mine.md").read_text()


def test_a_multiple_choice_run_is_plotted_by_ms_per_request(second, tmp_path, monkeypatch, capsys):
    run_dir, _ = second
    code, out = run_cli(monkeypatch, capsys, "plot", str(run_dir), "--out", str(tmp_path / "fig"))
    assert code == 0, out.err
    assert "left out" not in out.err
    svg = (tmp_path / "fig.svg").read_text()
    assert "ms/request" in svg and (tmp_path / "fig.png").stat().st_size > 1000


@pytest.mark.slow
def test_the_lm_eval_route_runs_the_pair_on_the_own_task(tiny_dirs, folder, tmp_path, monkeypatch, capsys):
    args = json.dumps({"members": [{"model": tiny_dirs[0], "name": "small_bpe"},
                                   {"model": tiny_dirs[1], "name": "small_sp"}]})
    code, out = lm_eval(monkeypatch, capsys, "run", "--model", "gac", "--model_args", args, "--tasks", "my_qa",
                        "--include_path", str(folder / "my_tasks"), "--limit", "2", "--gen_kwargs", "max_gen_toks=4",
                        "--batch_size", "auto", "--device", "cpu", "--log_samples", "--output_path", str(tmp_path))
    assert code == 0, out.err[-3000:]
    run = tmp_path / "gac-small_bpe+small_sp"
    config = json.loads(next((run / "gac").glob("results_*.json")).read_text())["config"]
    assert (config["model"], config["device"], config["batch_size"]) == ("gac", "cpu", "auto")
    found = samples(run / "gac", "my_qa")
    assert len(found) == 2 and all(s["arguments"]["gen_args_0"]["arg_1"]["max_gen_toks"] == 4 for s in found)
    code, out = run_cli(monkeypatch, capsys, "table", str(run))
    assert code == 0 and "| gac" in out.out and "my_qa" in out.out, out
