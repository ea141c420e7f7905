"""Finished run folders written by the tests themselves (recipe.yaml, summary.md, per-row
timing.json and lm-eval-shaped results), for the reporting commands."""

import json

import yaml

TASKS = {"arc_c": ("arc_challenge", "acc,none"), "nq": ("nq_open", "exact_match,remove_whitespace"),
         "triviaqa": ("triviaqa", "exact_match,remove_whitespace")}


ROWS = {"a": ("single", {"arc_c": (0.30, 200)}, {"decode_ms_per_token": 100.0}),
        "b": ("single", {"arc_c": (0.40, 200)}, {"decode_ms_per_token": 200.0}),
        "gac": ("gac", {"arc_c": (0.42, 200)}, {"decode_ms_per_token": 310.0})}
BASE_RECIPE = {"name": "reg",
               "members": [{"model": "smollm2-135m", "name": "a"}, {"model": "qwen2.5-0.5b", "name": "b"}],
               "method": "gac", "singles": True, "data": "offline", "tasks": [{"name": "arc_c", "limit": 200}]}


def fake_run(folder, rows, recipe=None, results_extras=None):
    """rows: label -> (method, {benchmark: (score 0..1, n)}, timing extras) in the recipe's row order
    (``ROWS``: two singles and GaC); recipe: ``BASE_RECIPE`` when not given; results_extras: more keys of
    every results file (lm-eval's ``pretty_env_info``, ...)."""
    folder.mkdir(parents=True)
    recipe = recipe or BASE_RECIPE
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (folder / "summary.md").write_text("done\n")
    for label, (method, scores, timing) in rows.items():
        row = folder / label
        row.mkdir()
        (row / "timing.json").write_text(json.dumps({"label": label, "method": method, **timing}))
        results = {"results": {TASKS[b][0]: {TASKS[b][1]: s} for b, (s, _) in scores.items()},
                   "n-samples": {TASKS[b][0]: {"effective": n} for b, (_, n) in scores.items()},
                   **(results_extras or {})}
        (row / "results_1.json").write_text(json.dumps(results))
    return folder
