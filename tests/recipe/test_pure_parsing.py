"""Parsing a recipe reads nothing of the machine; every mistake of a recipe is reported at once, one
line each; what the machine lacks is found by the preflight that `run` and `--dry-run` call; a
stored run reads on any machine; resume says why it passes a run over."""

import shutil
import textwrap

import pytest

from ensemble_bench.errors import EnvironmentFault, UserError, lines_of
from ensemble_bench.recipe import parse_recipe
from ensemble_bench.run import preflight, runs
from ensemble_bench.run.folder import output_root
from ensemble_bench.run.setup import run_setup
from tests.cli_helpers import run_cli
from tests.fake_runs import fake_run
from tests.report.test_compare import ARC, NQ, RECIPE, write_samples

THREE_MISTAKES = textwrap.dedent("""\
    name: three
    members:
      - {model: smollm2-135m, dtype: fp8}
    method: single
    tasks:
      - {name: piqa, limit: -3}
    batch_size: eight
    data: offline
""")


def test_a_recipe_with_three_mistakes_prints_three_lines(tmp_path, monkeypatch, capsys):
    path = tmp_path / "three.yaml"
    path.write_text(THREE_MISTAKES)
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run")
    lines = out.err.strip().splitlines()
    assert code == 2 and len(lines) == 3, out.err
    assert all(line.startswith(f"error: {path}: ") for line in lines)
    assert [line.split(": ")[2] for line in lines] == ["members[0].dtype", "tasks[0].limit", "batch_size"]
    assert "Traceback" not in out.err


def test_mistakes_in_method_parameters_tasks_and_plan_are_reported_together():
    data = {"name": "x", "members": [{"model": "a/b", "name": "a"}, {"model": "c/d", "name": "b"}],
            "methods": [{"name": "gac", "threshold": 2.0, "k": 1}, {"name": "unite", "label": "a"}],
            "tasks": ["piqa", "piqa"], "singles": True}
    with pytest.raises(UserError) as info:
        parse_recipe(data, "r.yaml")
    lines = lines_of(info.value)
    assert len(lines) == 4 and all(line.startswith("r.yaml: ") for line in lines), lines
    assert "methods[0].threshold" in lines[0] and "methods[0].k: unknown field" in lines[1]
    assert "tasks[1].name" in lines[2] and "labelled 'a'" in lines[3]


def test_a_value_with_a_line_break_stays_on_its_line(tmp_path, monkeypatch, capsys):
    path = tmp_path / "r.yaml"
    path.write_text(THREE_MISTAKES.replace("batch_size: eight", 'batch_size: "8\\nerror: forged"'))
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run")
    assert code == 2 and len(out.err.strip().splitlines()) == 3 and "(got '8\\nerror: forged')" in out.err


def test_parsing_reads_nothing_of_the_machine(tmp_path, monkeypatch):
    """Missing model files, a folder without a model and a missing package parse; the preflight finds them all."""
    monkeypatch.setattr(preflight, "_installed", lambda package: False)
    (tmp_path / "empty").mkdir()
    data = {"name": "gone", "members": [{"model": str(tmp_path / "gone.gguf"), "name": "a"},
                                        {"model": str(tmp_path / "empty"), "name": "b", "quantization": "8bit"},
                                        {"model": "unknown-thing", "name": "c"}],
            "method": {"name": "packllm"}, "placement": {"kind": "ray"}, "tasks": ["piqa"], "data": "offline",
            "output": str(tmp_path / "out")}
    recipe = parse_recipe(data, "r.yaml")
    with pytest.raises(UserError) as info:
        run_setup(recipe, "r.yaml", dry_run=True)
    lines = lines_of(info.value)
    assert all(line.startswith("r.yaml: ") for line in lines) and len(lines) == 5, lines
    assert "members[0].model: model file not found" in lines[0] and "holds no saved model" in lines[1]
    assert "unknown model 'unknown-thing'" in lines[2] and "needs the ray package" in lines[3]
    assert "method 'packllm' needs the rapidfuzz package" in lines[4]  # quantization under ray: the actor's


def test_a_hub_model_not_cached_while_offline_is_found_by_the_dry_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    data = {"name": "hub", "members": [{"model": "someone/not-cached"}], "method": "single", "tasks": ["piqa"],
            "data": "offline", "output": str(tmp_path / "out")}
    problems = run_setup(parse_recipe(data), "r.yaml", dry_run=True).problems
    assert problems == ("members[0].model: 'someone/not-cached' is not in the local hub cache and HF_HUB_OFFLINE "
                        "is set: download it first (huggingface-cli download someone/not-cached), or unset "
                        "HF_HUB_OFFLINE",)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert run_setup(parse_recipe(data), "r.yaml", dry_run=True).problems == ()


def test_a_rerank_scorer_package_missing_is_found_by_the_dry_run(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "_installed", lambda package: package != "llm_blender")
    data = {"name": "rr", "members": [{"model": "smollm2-135m"}, {"model": "qwen2.5-0.5b"}], "tasks": ["nq"],
            "method": {"name": "rerank", "scorer": "reward", "scorer_backend": "llm-blender",
                       "scorer_model": "llm-blender/PairRM"}, "data": "offline", "output": str(tmp_path)}
    with pytest.raises(UserError, match=r"^r.yaml: row rerank: method 'rerank' needs the llm-blender package"):
        run_setup(parse_recipe(data), "r.yaml", dry_run=True)


def test_bbh_without_its_folder_is_found_by_the_dry_run_and_not_listed_ready(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ENSBENCH_BBH_DIR", raising=False)
    monkeypatch.setenv("ENSBENCH_CACHE", str(tmp_path / "cache"))
    data = {"name": "b", "members": [{"model": "smollm2-135m"}], "method": "single", "tasks": ["bbh"],
            "data": "offline", "output": str(tmp_path / "out")}
    with pytest.raises(UserError) as info:
        run_setup(parse_recipe(data), "r.yaml", dry_run=True)
    [line] = lines_of(info.value)
    assert line.startswith("r.yaml: tasks[0].name: benchmark 'bbh' has no offline data") and "ENSBENCH_BBH_DIR" in line
    assert str(tmp_path) not in line and "/" not in line.split("ENSBENCH_BBH_DIR")[1]
    code, out = run_cli(monkeypatch, capsys, "list")
    [row] = [line for line in out.out.splitlines() if "│ bbh " in line]
    assert code == 0 and "ready" not in row and "hub only [1]" in row
    assert "[1] bbh: for data: offline, no package ships its data: set ENSBENCH_BBH_DIR" in " ".join(out.out.split())


@pytest.fixture()
def moved_run(tmp_path):
    """A finished run whose members were a saved folder and a .gguf file, both deleted since, made with
    placement ray on a machine that had it."""
    folder, gguf = tmp_path / "model", tmp_path / "m.gguf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    gguf.write_text("x")
    recipe = {**RECIPE, "members": [{"model": str(folder), "name": "a"}, {"model": str(gguf), "name": "b"}],
              "placement": {"kind": "ray"}}
    rows = {label: ("single" if label != "gac" else "gac",
                    {"arc_c": (sum(ARC[label]) / 10, 10), "nq": (sum(r for _, r in NQ[label]) / 4, 4)}, {})
            for label in ARC}
    run = write_samples(fake_run(tmp_path / "results" / "pair" / "20260101-000000-abc", rows, recipe))
    shutil.rmtree(folder)
    gguf.unlink()
    return run


@pytest.mark.parametrize("command", [["compare"], ["table"]])
def test_a_stored_run_reads_after_its_models_are_gone(command, moved_run, monkeypatch, capsys):
    monkeypatch.setattr(preflight, "_installed", lambda package: False)  # no ray on this machine either
    code, out = run_cli(monkeypatch, capsys, *command, str(moved_run))
    assert code == 0, out.err
    assert "gac" in out.out and "arc_c" in out.out


def test_select_accepts_a_recipe_folder(moved_run, tmp_path, monkeypatch, capsys):
    out_file = tmp_path / "chosen.yaml"
    code, out = run_cli(monkeypatch, capsys, "select", str(moved_run.parent), "--gap", "1", "--out", str(out_file))
    assert code == 0, out.err
    assert out_file.exists() and "chosen" in out.out


def test_resume_says_why_it_passes_over_an_unfinished_run(tmp_path, caplog):
    data = {"name": "r", "members": [{"model": "smollm2-135m"}], "method": "single", "tasks": ["piqa"],
            "data": "offline", "output": str(tmp_path)}
    recipe = parse_recipe(data)
    damaged = tmp_path / "r" / "20260101-000000-aaaaaaaaaaaa"
    damaged.mkdir(parents=True)
    (damaged / "recipe.yaml").write_text("name: [unclosed\n")
    other = tmp_path / "r" / "20260101-000001-bbbbbbbbbbbb"
    other.mkdir()
    (other / "recipe.yaml").write_text(f"{{name: r, members: [{{model: smollm2-135m}}], method: single, "
                                       f"tasks: [nq], data: offline, output: {tmp_path}}}\n")
    folder, resumed = runs.run_dir_of(recipe, output_root(recipe), fresh=False)
    said = [r.getMessage() for r in caplog.records]
    assert not resumed and folder not in (damaged, other) and len(said) == 2
    assert said[0].startswith(f"{damaged}: unfinished run not resumed: its recipe.yaml cannot be read")
    assert said[1] == f"{other}: unfinished run not resumed: it ran another version of this recipe; a new run starts"


def test_environment_problems_of_the_dry_run_are_one_line_each(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (tmp_path / "file").write_text("x")
    path = tmp_path / "r.yaml"
    path.write_text(f"{{name: r, members: [{{model: smollm2-135m, device: cuda}}], method: single, tasks: [piqa], "
                    f"output: {tmp_path / 'file'}}}\n")
    code, out = run_cli(monkeypatch, capsys, "run", str(path), "--dry-run")
    lines = out.err.strip().splitlines()
    assert code == EnvironmentFault.exit_code and len(lines) == 3, out.err
    assert "is a file, not a folder" in lines[0] and "'cuda' is not available" in lines[1] and "data: hub" in lines[2]
