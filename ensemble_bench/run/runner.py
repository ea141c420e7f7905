"""Recipe -> lm-eval ``simple_evaluate`` -> results/<recipe>/<run id>/, atomically and resumably.

The run folder's files are named and written by ``run.folder`` (its docstring draws the layout);
``results/.<recipe>.lock`` is held by the run in progress (run.lock): one writer per recipe.

A row is one evaluated model: a member alone (method ``single``) or the ensemble. Re-running a
recipe whose last run did not finish resumes it: finished rows are kept and the response cache
answers every request already computed. The runner acts on a ``RunSetup`` (run/setup.py): what each
row's state is, the task configs, the keys, were decided there, once.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

from ensemble_bench.decoding.request_sampling import applied_sampling, row_policy
from ensemble_bench.errors import DAMAGED_SQLITE, EnvironmentFault
from ensemble_bench.recipe import Recipe, Row
from ensemble_bench.run.folder import (
    CACHE,
    PARAMS,
    TASKS,
    cache_db,
    inside,
    partial_row,
    set_aside,
    write_params,
    write_recipe,
    write_row_timing,
    write_span_trace,
)
from ensemble_bench.run.lock import hold_run_lock, lock_path
from ensemble_bench.run.row_check import damage
from ensemble_bench.run.row_store import LENT_NOTE, REUSED_NOTE, RowKey, RowStore, copy_row, record_reuse, seed_cache
from ensemble_bench.run.runs import params_damage, resolved_params, run_dir_of
from ensemble_bench.run.setup import KEPT, LENT, REUSED, RowState, RunSetup, TaskFolder
from ensemble_bench.tasks import lm_eval_tasks
from ensemble_bench.tasks.code_exec import check_isolation, isolation_level
from ensemble_bench.tasks.ties import position_ties

log = logging.getLogger(__name__)
# --- evaluation -----------------------------------------------------------------------------------
def _evaluate_row(recipe: Recipe, row: Row, lm, run_dir: Path, groups, task_manager,
                  row_key: str | None = None) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker

    partial = partial_row(run_dir, row.label)
    shutil.rmtree(partial, ignore_errors=True)
    cache = inside(run_dir, CACHE)
    cache.mkdir(parents=True, exist_ok=True)
    lm.carry_counts(cache_db(run_dir, row.label))
    chat = any(recipe.members[i].chat_template for i in row.members)
    ties: dict[str, dict[str, int]] = {}
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
        ties.update(position_ties(samples))
        if recipe.allow_code_execution:
            results["config"]["code_execution_isolation"] = isolation_level()
        results["config"]["sampling"] = applied_sampling(results["configs"], lm.sampling)  # what was decoded
        tracker.general_config_tracker.model_name = row.label
        tracker.general_config_tracker.model_name_sanitized = ""  # files go straight into the row dir
        tracker.save_results_aggregated(results=results, samples=samples)
        for task_name in results["configs"]:
            if task_name in samples:
                tracker.save_results_samples(task_name=task_name, samples=samples[task_name])
    write_row_timing(partial, recipe, row, {**lm.reported(), "position_ties": ties, "row_key": row_key})
    traces = lm.span_traces()  # span-level methods: candidates and scores per round
    if traces:
        write_span_trace(partial, traces)
    missing = damage(partial, [group for _, group in groups])
    if missing:  # lm-eval logs a failed write of its files as a warning and goes on
        raise EnvironmentFault(f"{partial}: the files of row {row.label} were not all written ({missing}): check "
                               "that folder's disk and permissions, then run the same command again")
    final = inside(run_dir, row.label)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)


# --- resuming: the state an interrupted run left ------------------------------------------------------
def _not_writable(path: Path) -> EnvironmentFault:
    return EnvironmentFault(f"cannot write {path}: it is read-only (or not writable by this user): make it "
                            "writable and run the same command again")


def check_cache(db: Path) -> None:
    """Before any model loads, one line naming a row's response cache that the run could not use: its
    folder or file read-only, the file unreadable, or (the only case called damaged, with the advice
    to remove it) a readable file that sqlite finds unsound."""
    for path in (db.parent, db):
        if path.exists() and not os.access(path, os.W_OK):
            raise _not_writable(path)
    if not db.exists():
        return
    try:
        connection = sqlite3.connect(db)
        try:
            verdict = connection.execute("pragma quick_check").fetchone()[0]
        finally:
            connection.close()
    except sqlite3.DatabaseError as err:
        if not any(sign in str(err) for sign in DAMAGED_SQLITE):
            raise EnvironmentFault(f"{db}: the response cache cannot be read ({err}): check that this user may read "
                                   "and write it, then run the same command again") from None
        verdict = str(err)
    if verdict != "ok":
        raise EnvironmentFault(f"{db}: the response cache is damaged ({verdict}): remove this file (its answers "
                               "are recomputed) and run the same command again")


def _take(run_dir: Path, row: Row, state: RowState, store: RowStore, key: RowKey, on_row) -> bool:
    """Do what the setup decided for one row (``setup.row_state``), before anything is computed; whether the
    row is still to compute. A damaged or stale row folder is moved aside (to .<row>.damaged) first; a
    reused row is copied in; a lent response cache is copied in (only new requests then run); every cache
    to be read must open."""
    if state.kind == KEPT:
        on_row and on_row(row, "kept from the interrupted run")
        return False
    if state.aside:
        aside = set_aside(run_dir, row.label)
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(inside(run_dir, row.label), aside)
        on_row and on_row(row, f"{state.aside}: recomputed from the response cache")
    if state.note:
        on_row and on_row(row, state.note)
    if state.kind == REUSED:
        partial = partial_row(run_dir, row.label)
        copy_row(state.source, partial, state.source_name)
        record_reuse(run_dir, row.label, {"from": state.source_name, "key": key.key, "note": REUSED_NOTE})
        os.replace(partial, inside(run_dir, row.label))
        on_row and on_row(row, f"reused from {state.source_name}")
        return False
    db = cache_db(run_dir, row.label)
    if state.kind == LENT and seed_cache(state.source, db):
        record_reuse(run_dir, row.label, {"cache_from": state.source_name, "note": LENT_NOTE})
        on_row and on_row(row, f"answers cached in {state.source_name} are reused where the requests match "
                               f"({', '.join(state.lent_tasks)})")
    check_cache(db)
    return True


def _check_complete(run_dir: Path, rows: list[Row], groups: list[str]) -> None:
    """The summary marks a run finished: written only when every row has every file it must have."""
    for row in rows:
        if why := damage(inside(run_dir, row.label), groups):
            raise EnvironmentFault(f"{run_dir}: row {row.label} is not complete ({why}): run the same command "
                                   "again to recompute it from the response cache")


def patch_lm_eval() -> None:
    """The one change ensbench makes to lm-eval: its git hash of the working folder is read without git's
    "fatal: not a git repository" on stderr for every row (``quiet_git_hash``)."""
    import lm_eval.evaluator

    lm_eval.evaluator.get_git_commit_hash = quiet_git_hash


def quiet_git_hash() -> str | None:
    """lm-eval's git hash of the working folder, without git's "fatal: not a git repository" per row."""
    try:
        done = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def run_recipe(setup: RunSetup, finish: Callable[[Path, Recipe], object],
               progress: Callable[[str, int, int | None], None] | None = None,
               on_row: Callable[[Row, str], None] | None = None) -> Path:
    """Run every row of the recipe as ``setup`` (``setup.run_setup``, not a dry run's) resolved it; return
    the run directory. When every row is complete, ``finish`` writes what marks the run finished (the CLI
    passes ``report.summary.write_summary``: the runner writes runs and never imports the reports that read
    them). The recipe's run lock is held throughout, from choosing the run folder to ``finish``: a second
    run of the same recipe meanwhile is refused in one line and changes nothing."""
    if setup.tasks is None:
        raise ValueError("run_recipe needs the setup of a run: built without dry_run, with no problems")
    recipe = setup.recipe
    if recipe.allow_code_execution and any(bench.runs_code for bench, _, _ in setup.benchmarks):
        check_isolation(recipe.allow_unisolated_execution)  # one line; refuses when none and not allowed
    with hold_run_lock(lock_path(setup.output_root, recipe.name)):
        run_dir = _run_locked(setup, progress, on_row)
        finish(run_dir, recipe)
        return run_dir


def _run_locked(setup: RunSetup, progress, on_row) -> Path:
    from ensemble_bench.run.build import MemberPool, build_method  # torch and the members: not for --dry-run
    from ensemble_bench.run.lm import LM_CLASSES, ReplicatedLM  # lm-eval's model API
    from ensemble_bench.run.replicas import Replicas

    patch_lm_eval()  # lm-eval loads here, not for --dry-run / --reuse (about a second)
    recipe = setup.recipe
    # The run folder is the one fact chosen again, now that the lock is held: the setup chose it before, and
    # in between another `ensbench run` of this recipe may have taken the lock, finished the run this one
    # was to resume or left a new unfinished one. A new run's name is taken here too (the second it
    # starts, numbered against the folders there now). Everything else of the setup stands: the row keys
    # do not depend on the run folder, and the finished rows of the output folder are not this lock's.
    run_dir, resumed = run_dir_of(recipe, setup.output_root, setup.fresh)
    if resumed != setup.resumed or resumed and run_dir != setup.run_dir:
        raise EnvironmentFault(f"{run_dir.parent}: another run of recipe '{recipe.name}' changed its run folders "
                               "while this one was planned: run the same command again")
    run_dir.mkdir(parents=True, exist_ok=True)
    if not os.access(run_dir, os.W_OK):
        raise _not_writable(run_dir)
    write_recipe(run_dir, recipe)
    if damaged_params := params_damage(run_dir):
        log.warning("%s: %s: the run resumes with its recipe.yaml and response cache, and writes it again",
                    run_dir / PARAMS, damaged_params)
    if damaged_params or not (run_dir / PARAMS).exists():
        write_params(run_dir, resolved_params(recipe))
    task_manager = lm_eval_tasks.task_manager([*setup.include_folders, _place_tasks(run_dir, setup.tasks)])
    groups, group_names = list(setup.tasks.groups), setup.tasks.group_names
    inside(run_dir, CACHE).mkdir(exist_ok=True)

    pool = MemberPool(recipe)
    store = RowStore(setup.output_root, lambda row_dir: damage(row_dir, group_names))
    keys = setup.keys
    todo = [row for row in recipe.plan if _take(run_dir, row, setup.states[row.label], store, keys[row.label], on_row)]
    replicas = Replicas(recipe) if recipe.placement.replicas > 1 else None  # run/replicas.py
    try:
        for row in todo:
            on_row and on_row(row, "loading")
            row_progress = (lambda n, total, label=row.label: progress(label, n, total)) if progress else None
            policy = row_policy(recipe, row)
            if replicas is not None:
                lm = ReplicatedLM(replicas, row.label, progress=row_progress, sampling=policy)
            else:
                lm = LM_CLASSES[row.method](build_method(recipe, row, pool), row.label, progress=row_progress,
                                            sampling=policy)
            on_row and on_row(row, "evaluating")
            _evaluate_row(recipe, row, lm, run_dir, groups, task_manager, keys[row.label].key)
            store.remember(keys[row.label], inside(run_dir, row.label), cache_db(run_dir, row.label))
    finally:
        if replicas is not None:
            replicas.close()
    _check_complete(run_dir, recipe.plan, group_names)
    return run_dir


def _place_tasks(run_dir: Path, tasks: TaskFolder) -> Path:
    """The run folder's ``tasks/``: the setup's task configs, their bytes as written (a folder left by an
    earlier sitting is replaced whole, so that it holds these files and no other)."""
    dest, partial = run_dir / TASKS, run_dir / f".{TASKS}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    for name, data in tasks.files.items():
        (partial / name).parent.mkdir(parents=True, exist_ok=True)
        (partial / name).write_bytes(data)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(partial, dest)
    return dest
