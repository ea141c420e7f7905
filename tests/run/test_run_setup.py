"""A run is resolved once (issue 48): ``ensbench run`` and its dry run derive each fact of the run one time
(run/setup.py), the plan prints that value and the runner acts on it (tiny models)."""

import sys
from collections import Counter
from contextlib import contextmanager

import pytest

from ensemble_bench.run import folder, row_store, runs
from ensemble_bench.tasks import recipe_tasks, task_configs
from tests.cli_helpers import run_cli, tiny_recipe

# the derivations counted, by the function that makes each one
DERIVATIONS = {"output_root": folder.output_root, "include_folders": recipe_tasks.include_folders,
               "row_keys": row_store.row_keys, "task_configs": task_configs.write_task_configs,
               "run_folder_scans": runs._runs_of}


@contextmanager
def counted_calls():
    """How many times each function of DERIVATIONS is entered, whatever module calls it, however imported."""
    names = {function.__code__: name for name, function in DERIVATIONS.items()}
    counts = Counter()

    def profile(frame, event, _):
        if event == "call" and frame.f_code in names:
            counts[names[frame.f_code]] += 1

    sys.setprofile(profile)
    try:
        yield counts
    finally:
        sys.setprofile(None)


def recipe_file(tmp_path, dirs, name, limit):
    """The tiny recipe (two single rows and GaC on piqa) named ``name``, with an include_path folder."""
    tasks = tmp_path / "my_tasks"
    tasks.mkdir(exist_ok=True)
    path = tmp_path / f"{name}.yaml"
    text = tiny_recipe(dirs, tmp_path / "results", limit=limit).replace("name: tiny-faults", f"name: {name}")
    path.write_text(text + f"include_path: {tasks}\n")
    return path


@pytest.mark.slow
@pytest.mark.usefixtures("offline_data")
def test_each_fact_of_a_run_is_derived_once_per_command(tiny_dirs, tmp_path, monkeypatch, capsys):
    """With an output folder that holds a finished run (its rows lend their response caches), the dry run
    and the run of another recipe each resolve the output folder and the include_path folders, write the
    task configs and compute the row keys once; the run folders are scanned once by the dry run, and once
    more by the run under its lock (the one choice redone there)."""
    assert run_cli(monkeypatch, capsys, "run", str(recipe_file(tmp_path, tiny_dirs, "first", 2)))[0] == 0
    second = recipe_file(tmp_path, tiny_dirs, "second", 3)  # one example more: every row computed, caches lent
    with counted_calls() as dry:
        code, out = run_cli(monkeypatch, capsys, "run", str(second), "--dry-run")
    assert code == 0, out.err
    assert dict(dry) == {"output_root": 1, "include_folders": 1, "row_keys": 1, "task_configs": 1,
                         "run_folder_scans": 1}
    with counted_calls() as run:
        code, out = run_cli(monkeypatch, capsys, "run", str(second))
    assert code == 0, out.err
    assert dict(run) == {"output_root": 1, "include_folders": 1, "row_keys": 1, "task_configs": 1,
                         "run_folder_scans": 2}
    assert out.out.count("answers cached in first/") == 3  # what the setup decided, done


@pytest.mark.usefixtures("offline_data")
def test_a_run_folder_changed_since_the_setup_stops_the_run_in_one_line(tiny_dirs, tmp_path):
    """The run folder is chosen again under the run lock: an unfinished run of the recipe that appeared
    after the setup planned a new one (another `ensbench run` in between) stops the run before anything
    loads, since the rows' states were decided for another folder."""
    from ensemble_bench.errors import EnvironmentFault, lines_of
    from ensemble_bench.recipe import load_recipe
    from ensemble_bench.run.runner import run_recipe
    from ensemble_bench.run.setup import COMPUTE, run_setup

    recipe = load_recipe(recipe_file(tmp_path, tiny_dirs, "changed", 2))
    setup = run_setup(recipe)
    assert not setup.resumed and {state.kind for state in setup.states.values()} == {COMPUTE}
    other = tmp_path / "results" / "changed" / "20260101-000000-other"
    other.mkdir(parents=True)
    folder.write_recipe(other, recipe)  # an unfinished run of this very recipe
    with pytest.raises(EnvironmentFault) as caught:
        run_recipe(setup, lambda run_dir, recipe: None)
    [line] = lines_of(caught.value)
    assert "changed its run folders while this one was planned: run the same command again" in line
    assert sorted(p.name for p in other.iterdir()) == ["recipe.yaml"]  # nothing written into it
    assert run_setup(recipe).run_dir == other  # planned again: that run is resumed


def test_the_plan_prints_the_setup_and_imports_no_runner():
    from tests.package.test_imports import imports_of

    top, inner, typing = imports_of("ensemble_bench.cli.plan")
    assert not any(name.startswith("ensemble_bench.run.runner") for name in top | inner | typing)
    assert "ensemble_bench.run.setup" in inner
