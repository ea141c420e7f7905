"""Reproduce dry runs (issue 47): each block labelled, a recipe that fills several blocks planned once, an
estimate of the real run from measured per-example costs (report/estimate.py), and the offline targets
as docs/reproduction.md describes them (no MMLU, no BBH)."""

from pathlib import Path

import pytest
import yaml

from ensemble_bench.recipe import parse_recipe
from ensemble_bench.report import estimate as estimates
from ensemble_bench.report.estimate import HOW, estimate, estimate_lines
from scripts import reproduce
from scripts.reproduce import TARGETS

ROOT = Path(__file__).resolve().parents[2]


def recipe(members, methods, tasks):
    return parse_recipe({"name": "r", "members": [{"model": m, "name": m.split("-")[0].replace("/", "_")}
                                                 for m in members],
                         "methods": methods, "singles": True, "tasks": tasks, "data": "offline"}, "r.yaml")


@pytest.fixture()
def measured(monkeypatch):
    costs = {("smollm2-135m", "piqa"): 0.5, ("qwen2.5-0.5b", "piqa"): 1.5, ("smollm2-135m", "nq"): 2.0,
             ("qwen2.5-0.5b", "nq"): 6.0, ("qwen2.5-0.5b", "flores_en-de"): 10.0}
    monkeypatch.setattr(estimates, "member_costs", lambda: costs)
    monkeypatch.setattr(estimates, "method_factors", lambda: {"single": 1.0, "gac": 0.5})


def test_a_row_costs_its_examples_times_its_members_costs_times_the_methods_factor(measured):
    found = estimate(recipe(["smollm2-135m", "qwen2.5-0.5b"], ["gac", "eva"],
                            [{"name": "piqa", "limit": 10}, {"name": "nq", "limit": 4}]))
    assert found.rows == {"smollm2": 10 * 0.5 + 4 * 2.0, "qwen2.5": 10 * 1.5 + 4 * 6.0,
                          "gac": 0.5 * (10 * 2.0 + 4 * 8.0), "eva": 10 * 2.0 + 4 * 8.0}
    assert found.assumed == ["eva"] and found.unmeasured == []
    lines = estimate_lines(found)
    assert lines[0] == "estimate: about 2 min from scratch (4 rows; costliest eva 52 s, qwen2.5 39 s, gac 26 s)"
    assert lines[1] == "estimate counts eva at 1x their members (no measured figure)"


def test_what_has_no_measured_cost_is_named_not_guessed(measured):
    found = estimate(recipe(["qwen2.5-0.5b", "org/big-model"], ["gac"],
                            [{"name": "flores_ro-en", "variant": "flores200", "limit": 2}, {"name": "nq"}]))
    assert found.rows["qwen2.5"] == 2 * 10.0  # every Flores direction is measured as en-de
    assert found.unmeasured == ["nq without a limit (every example)", "org/big-model"]
    assert estimate_lines(found)[1] == ("estimate leaves out (no measured cost): nq without a limit (every example), "
                                        "org/big-model")
    found = estimate(recipe(["smollm2-135m", "qwen2.5-0.5b"], ["gac"], [{"name": "flores_en-de", "limit": 2}]))
    assert found.unmeasured == ["smollm2-135m on flores_en-de"] and found.rows == {"smollm2": 0.0, "qwen2.5": 20.0,
                                                                                   "gac": 0.0}
    paper = estimate(recipe(["org/a", "org/b"], ["gac"], [{"name": "piqa", "limit": 3}]))
    assert estimate_lines(paper) == ["estimate: none (no measured cost for org/a, org/b)"]


def offline_recipes() -> dict[str, list[Path]]:
    return {target: [ROOT / "recipes" / "offline" / f"{name}.yaml" for _, _, names in scales["offline"]
                     for name in names] for target, scales in TARGETS.items() if "offline" in scales}


def test_every_offline_target_is_estimated_from_measured_costs_and_has_no_mmlu_or_bbh():
    """docs/reproduction.md: SCALE=offline runs the packaged models, no MMLU/BBH (issue 47: the CoRE
    target ran 57 MMLU subtasks)."""
    from ensemble_bench.recipe import load_recipe

    for target, paths in offline_recipes().items():
        for path in paths:
            tasks = [task["name"] for task in yaml.safe_load(path.read_text())["tasks"]]
            assert not {"mmlu", "bbh"} & set(tasks), (target, path.name, tasks)
            found = estimate(load_recipe(path, []))
            assert found.unmeasured == [] and found.seconds > 0, (target, path.name, found.unmeasured)


def test_a_dry_run_labels_each_block_plans_a_recipe_once_and_estimates_the_run(capsys):
    """Issue 47: `make reproduce-core SCALE=offline DRY_RUN=1` printed the same plan twice, unlabelled,
    and no estimate."""
    commands = []
    reproduce.main(["core", "--scale", "offline", "--dry-run", "--limit", "2"], run=lambda *args: commands.append(args))
    [command] = commands
    assert command[:2] == ("run", str(ROOT / "recipes" / "offline" / "core_benchmark.yaml"))
    assert "--dry-run" in command and command[command.index("--limit") + 1] == "2"
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "== core_benchmark, block Top-2: recipe core_benchmark"
    assert lines[1].startswith("estimate of core_benchmark: about ") and "from scratch (19 rows; costliest " in lines[1]
    assert lines[2] == "estimate of core_benchmark counts eva at 1x their members (no measured figure)"
    assert lines[3:5] == ["== core_benchmark, block Top-3: recipe core_benchmark",
                          "core_benchmark: planned above, under core_benchmark, block Top-2"]
    assert lines[5].startswith("estimate of core: about ") and lines[-1] == HOW
