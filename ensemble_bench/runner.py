"""Recipe -> lm-eval ``simple_evaluate`` -> results/<recipe>/<run id>/, atomically and resumably.

Layout of one run::

    results/<recipe>/<run id>/
      recipe.yaml            the recipe as run (with its fingerprint)
      params.json            every row's method parameters, defaults included
      tasks/                 generated lm-eval task configs
      cache/<row>.db         lm-eval's response cache: every answered request, committed at once
      <row>/                 lm-eval's own files for one row (results_*.json, samples_*.jsonl)
                             + timing.json; appears only when the row is complete
      summary.md / .csv      the table, written last

A row is one evaluated model: a member alone (method ``single``) or the ensemble. Re-running a
recipe whose last run did not finish resumes it: finished rows are kept and the response cache
answers every request already computed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

from ensemble_bench.build import MemberPool, build_method, row_params
from ensemble_bench.cache import atomic_write_text
from ensemble_bench.errors import EnvironmentFault, UserError
from ensemble_bench.recipe import Recipe, Row, parse_recipe, plan_rows, selected_benchmarks
from ensemble_bench.report.summary import DONE_FILE as DONE, write_summary
from ensemble_bench.tasks.code_exec import ALLOW_ENV, UNISOLATED_ENV, check_isolation, isolation_level
from ensemble_bench.tasks.offline import ensure_offline_data, include_defaults_needed, write_task_configs

PARAMS = "params.json"
HUB = ("huggingface.co", 443)
OFFLINE_VARIABLES = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")

# --- checks before anything is loaded (run and --dry-run) -------------------------------------------
def _network_problem(recipe: Recipe) -> str | None:
    if recipe.data != "hub":
        return None
    offline = [v for v in OFFLINE_VARIABLES if os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")]
    if offline:
        return (f"data: hub needs the network but {offline[0]} is set: use data: offline (benchmarks with a "
                "packaged copy) or unset it")
    try:
        socket.create_connection(HUB, timeout=3).close()
    except OSError as err:
        return f"data: hub cannot reach {HUB[0]} ({err.strerror or err}): check the network, or use data: offline"
    return None


def _device_problems(recipe: Recipe) -> list[str]:
    """Members placed on a device this machine lacks (with Ray, devices belong to the cluster's nodes)."""
    placed = [(i, m.device) for i, m in enumerate(recipe.members) if m.device_map is None and m.device != "cpu"]
    if recipe.placement.kind == "ray" or not placed:
        return []
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    problems = []
    for i, device in placed:
        if device.startswith("cuda") and int(device.partition(":")[2] or 0) >= gpus:
            problems.append(f"members[{i}].device: '{device}' is not available (this machine has {gpus} CUDA "
                            "device(s)): use device: cpu or another index")
        elif device == "mps" and not torch.backends.mps.is_available():
            problems.append(f"members[{i}].device: 'mps' is not available on this machine: use device: cpu")
    return problems


def _output_problem(recipe: Recipe) -> str | None:
    target = Path(recipe.output).expanduser() / recipe.name
    existing = None
    try:
        existing = next(p for p in (target, *target.parents) if p.exists())
        if not existing.is_dir():
            return f"output: '{existing}' is a file, not a folder: set output: to a folder"
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        where = existing or err.filename or recipe.output
        return f"output: cannot write in '{where}' ({err.strerror or err}): make it writable or choose another output:"
    return None


def preflight(recipe: Recipe) -> list[str]:
    """What would stop the run on this machine, found before any model is loaded: the output folder,
    the members' devices, the network for ``data: hub``. One line each; empty when all is well."""
    return [p for p in (_output_problem(recipe), *_device_problems(recipe), _network_problem(recipe)) if p]


# --- run directories ---------------------------------------------------------------------------
def inside(folder: Path, name: str) -> Path:
    """``folder / name``, refused unless it is an entry of that folder (no separator, no '..', no
    link out): every path the runner writes or deletes goes through here (labels are also checked
    when the recipe is read)."""
    path = folder / name
    if name in ("", ".", "..") or "/" in name or "\\" in name or path.resolve().parent != folder.resolve():
        raise UserError(f"{name!r} would be written outside the run folder {folder}; refused")
    return path


def _runs_of(recipe: Recipe) -> list[Path]:
    """Run folders of this exact recipe, oldest first; judged by the recipe each folder holds, so
    runs stay findable when the fingerprint's own definition changes. A run whose rows were
    computed with other method parameters than this code gives the recipe (a default changed
    since) is not this recipe's run: it is neither resumed nor reused."""
    base = Path(recipe.output) / recipe.name
    fingerprint = recipe.fingerprint()
    found = []
    for folder in sorted(base.iterdir()) if base.is_dir() else []:
        try:
            held = parse_recipe(yaml.safe_load((folder / "recipe.yaml").read_text()), str(folder))
        except (OSError, UserError, yaml.YAMLError):
            continue
        if (held.model_copy(update={"output": recipe.output}).fingerprint() == fingerprint
                and _same_params(folder, recipe)):
            found.append(folder)
    return found


def resolved_params(recipe: Recipe) -> dict[str, dict]:
    """Every row's method parameters with the defaults of this code filled in (the recipe's
    fingerprint leaves defaults out, so that adding a field keeps old runs resumable)."""
    return {row.label: row_params(recipe, row).model_dump(mode="json") for row in plan_rows(recipe)}


def _same_params(folder: Path, recipe: Recipe) -> bool:
    """Whether a run folder's rows used the parameters this code resolves; runs written before
    PARAMS existed have none to compare and count as the same."""
    try:
        held = json.loads((folder / PARAMS).read_text())
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False
    return held == resolved_params(recipe)


def _run_dir(recipe: Recipe, fresh: bool) -> tuple[Path, bool]:
    """The unfinished run of this exact recipe to resume, or a new run directory."""
    unfinished = [p for p in _runs_of(recipe) if not (p / DONE).exists()]
    if unfinished and not fresh:
        return unfinished[-1], True
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(recipe.output) / recipe.name / f"{stamp}-{recipe.fingerprint()}", False


def finished_run(recipe: Recipe) -> Path | None:
    """The newest finished run of this exact recipe, if any."""
    done = [p for p in _runs_of(recipe) if (p / DONE).exists()]
    return done[-1] if done else None


def _write_recipe(run_dir: Path, recipe: Recipe) -> None:
    dumped = recipe.model_dump(mode="json", exclude_none=True)
    atomic_write_text(run_dir / "recipe.yaml", yaml.safe_dump(dumped, sort_keys=False))


# --- evaluation -----------------------------------------------------------------------------------
def _evaluate_row(recipe: Recipe, row: Row, lm, run_dir: Path, groups, task_manager) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker

    partial = inside(run_dir, f".{row.label}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    cache = inside(run_dir, "cache")
    cache.mkdir(parents=True, exist_ok=True)
    chat = any(recipe.members[i].chat_template for i in row.members)
    for limit, group in groups:
        tracker = EvaluationTracker(output_path=str(partial))
        results = simple_evaluate(
            model=lm, tasks=[group], task_manager=task_manager,
            limit=limit, log_samples=True, bootstrap_iters=0, evaluation_tracker=tracker,
            use_cache=str(inside(cache, row.label)), apply_chat_template=chat,
            fewshot_as_multiturn=recipe.fewshot_as_multiturn and chat,
            random_seed=recipe.seed, numpy_random_seed=recipe.seed, torch_random_seed=recipe.seed,
            fewshot_random_seed=recipe.seed, verbosity="ERROR",
            confirm_run_unsafe_code=recipe.allow_code_execution,
        )
        if results is None:
            raise RuntimeError("lm-eval returned no results")
        samples = results.pop("samples", {})
        if recipe.allow_code_execution:
            results["config"]["code_execution_isolation"] = isolation_level()
        tracker.general_config_tracker.model_name = row.label
        tracker.general_config_tracker.model_name_sanitized = ""  # files go straight into the row dir
        tracker.save_results_aggregated(results=results, samples=samples)
        for task_name in results["configs"]:
            if task_name in samples:
                tracker.save_results_samples(task_name=task_name, samples=samples[task_name])
    timing = {"label": row.label, "method": row.method,
              "members": [recipe.members[i].label for i in row.members], **lm.method.info(),
              "requests_computed": lm.requests_computed}
    atomic_write_text(partial / "timing.json", json.dumps(timing, indent=2))
    traces = getattr(lm.method, "traces", None)  # span-level methods: candidates and scores per round
    if traces:
        atomic_write_text(partial / "span_trace.jsonl", "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in traces))
    final = inside(run_dir, row.label)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)


# --- resuming: the state an interrupted run left ------------------------------------------------------
def _damage(row_dir: Path) -> str | None:
    """Why a finished row's files cannot be used (missing or not parsing), or None."""
    results = sorted(row_dir.glob("results_*.json"))
    samples = sorted(row_dir.glob("samples_*.jsonl"))
    if not results or not samples:
        return "its results_*.json or samples_*.jsonl are missing"
    for path in [row_dir / "timing.json", *results, *samples]:
        try:
            text = path.read_text(encoding="utf-8")
            for line in text.splitlines() if path.suffix == ".jsonl" else [text]:
                json.loads(line)
        except (OSError, ValueError) as err:
            return f"{path.name} does not parse ({type(err).__name__})"
    return None


def cache_db(run_dir: Path, label: str) -> Path:
    """lm-eval's response cache of one row (lm-eval appends _rank<n>.db to the name it is given)."""
    return inside(run_dir / "cache", f"{label}_rank0.db")


def check_cache(db: Path) -> None:
    """One line naming the file when a response cache does not open as a database."""
    if not db.exists():
        return
    try:
        connection = sqlite3.connect(db)
        try:
            verdict = connection.execute("pragma quick_check").fetchone()[0]
        finally:
            connection.close()
    except sqlite3.DatabaseError as err:
        verdict = str(err)
    if verdict != "ok":
        raise EnvironmentFault(f"{db}: the response cache is damaged ({verdict}): remove this file (its answers "
                               "are recomputed) and run the same command again")


def _rows_to_compute(run_dir: Path, rows: list[Row], on_row) -> list[Row]:
    """Validate the finished rows of a resumed run before computing anything: a damaged one is moved
    aside (to .<row>.damaged) and recomputed from its response cache; every cache to be read must open."""
    todo = []
    for row in rows:
        row_dir = inside(run_dir, row.label)
        if (row_dir / "timing.json").exists() or row_dir.exists():
            why = _damage(row_dir)
            if why is None:
                on_row and on_row(row, "kept from the interrupted run")
                continue
            aside = inside(run_dir, f".{row.label}.damaged")
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(row_dir, aside)
            on_row and on_row(row, f"damaged ({why}): recomputed from the response cache")
        check_cache(cache_db(run_dir, row.label))
        todo.append(row)
    return todo


def _quiet_git_hash() -> str | None:
    """lm-eval's git hash of the working folder, without git's "fatal: not a git repository" per row."""
    try:
        done = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _task_groups(recipe: Recipe, run_dir: Path) -> tuple[str, list[tuple[int | None, str]]]:
    """Task configs for the run: one lm-eval group per distinct limit, all in one folder."""
    chosen = selected_benchmarks(recipe)
    if recipe.data == "offline":
        ensure_offline_data([b for b, _, _ in chosen])
    by_limit: dict[int | None, list] = {}
    for bench, shots, limit in chosen:
        by_limit.setdefault(limit, []).append((bench, shots))
    dest = run_dir / "tasks"
    groups = [(limit, write_task_configs(selection, dest, recipe.data, suffix=f"_{k}"))
              for k, (limit, selection) in enumerate(sorted(by_limit.items(), key=lambda kv: kv[0] or 0))]
    return str(dest), groups


def run_recipe(recipe: Recipe, fresh: bool = False, progress: Callable[[str, int, int | None], None] | None = None,
               on_row: Callable[[Row, str], None] | None = None) -> Path:
    """Run every row of the recipe; return the run directory (with summary.md when done)."""
    import lm_eval.evaluator  # lm-eval loads here, not for --dry-run / --reuse (about a second)
    from lm_eval.tasks import TaskManager

    from ensemble_bench.lm import LM_CLASSES  # lm-eval's model API

    lm_eval.evaluator.get_git_commit_hash = _quiet_git_hash
    if recipe.allow_code_execution and any(bench.runs_code for bench, _, _ in selected_benchmarks(recipe)):
        check_isolation(recipe.allow_unisolated_execution)  # one line; refuses when none and not allowed
        os.environ[UNISOLATED_ENV] = "1" if recipe.allow_unisolated_execution else "0"
    run_dir, resumed = _run_dir(recipe, fresh)
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_recipe(run_dir, recipe)
    if not (run_dir / PARAMS).exists():
        atomic_write_text(run_dir / PARAMS, json.dumps(resolved_params(recipe), indent=1, sort_keys=True))
    include_path, groups = _task_groups(recipe, run_dir)
    task_manager = TaskManager(include_path=include_path, include_defaults=include_defaults_needed(recipe.data))

    if recipe.allow_code_execution:
        os.environ[ALLOW_ENV] = "1"
    pool = MemberPool(recipe)
    for row in _rows_to_compute(run_dir, plan_rows(recipe), on_row):
        on_row and on_row(row, "loading")
        method = build_method(recipe, row, pool)
        lm = LM_CLASSES[row.method](method, row.label,
                                    progress=(lambda n, label=row.label: progress(label, n, None)) if progress else None)
        on_row and on_row(row, "evaluating")
        _evaluate_row(recipe, row, lm, run_dir, groups, task_manager)
    write_summary(run_dir, recipe)
    return run_dir
