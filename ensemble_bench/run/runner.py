"""Recipe -> lm-eval ``simple_evaluate`` -> results/<recipe>/<run id>/, atomically and resumably.

The run folder's files are named and written by ``run.folder`` (its docstring draws the layout);
``results/.<recipe>.lock`` is held by the run in progress (run.lock): one writer per recipe.

A row is one evaluated model: a member alone (method ``single``) or the ensemble. Re-running a
recipe whose last run did not finish resumes it: finished rows are kept and the response cache
answers every request already computed. ``output:`` is read through ``output_root`` only.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ensemble_bench.errors import DAMAGED_SQLITE, EnvironmentFault, UserError, several
from ensemble_bench.recipe import Recipe, Row, selected_benchmarks
from ensemble_bench.run.build import MemberPool, build_method
from ensemble_bench.run.folder import (
    CACHE,
    PARAMS,
    TASKS,
    cache_db,
    inside,
    output_root,
    partial_row,
    recorded_key,
    set_aside,
    write_params,
    write_recipe,
    write_row_timing,
    write_span_trace,
)
from ensemble_bench.run.lock import hold_run_lock, lock_path
from ensemble_bench.run.row_check import damage
from ensemble_bench.run.row_store import (
    LENT_NOTE,
    REUSED_NOTE,
    RowKey,
    RowStore,
    copy_row,
    record_reuse,
    row_keys,
    seed_cache,
)
from ensemble_bench.run.runs import params_damage, planned_run_dir, resolved_params, run_dir_of
from ensemble_bench.tasks import lm_eval_tasks, recipe_tasks
from ensemble_bench.tasks.code_exec import Consent, check_isolation, isolation_level
from ensemble_bench.tasks.offline import ensure_offline_data, write_task_configs
from ensemble_bench.tasks.task_sources import data_fingerprint

if TYPE_CHECKING:
    from lm_eval.tasks import TaskManager

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
    write_row_timing(partial, recipe, row, {**lm.reported(), "row_key": row_key})
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


def _reused(run_dir: Path, row: Row, store: RowStore, key: RowKey, on_row) -> bool:
    """Copy in the row finished under the same key in another run of the output folder, if any and if it
    proves itself (row_check.damage); otherwise say why the row is computed (a stored row that fails its
    check, data that changed since a row was computed)."""
    found = store.finished(key)
    if found is not None and found.problem is not None:
        on_row and on_row(row, f"not reused: {found.name} fails its check ({found.problem}); computed again")
        return False
    if found is None:
        if why := store.data_changed(key):
            on_row and on_row(row, f"computed again: {why}")
        return False
    partial = partial_row(run_dir, row.label)
    copy_row(found.folder, partial, found.name)
    record_reuse(run_dir, row.label, {"from": found.name, "key": key.key, "note": REUSED_NOTE})
    os.replace(partial, inside(run_dir, row.label))
    on_row and on_row(row, f"reused from {found.name}")
    return True


def _lend_cache(run_dir: Path, row: Row, store: RowStore, key: RowKey, on_row) -> None:
    """A row about to be computed for the first time starts from the response cache of a finished row
    of its lineage (same members, method and parameters; other tasks or limits): only new requests run."""
    db = cache_db(run_dir, row.label)
    source = None if db.exists() else store.lineage_cache(key)
    if source is not None and seed_cache(source, db):
        name = source.relative_to(store.root).as_posix()
        record_reuse(run_dir, row.label, {"cache_from": name, "note": LENT_NOTE})
        on_row and on_row(row, f"answers cached in {name} are reused")


def _stale(row_dir: Path, key: RowKey | None) -> str | None:
    """Why a row finished by the interrupted run no longer answers its inputs: its recorded key is not the
    one its task configs and data give now (a row written before keys were recorded is kept)."""
    recorded = recorded_key(row_dir)
    if key is None or recorded is None or recorded == key.key:
        return None
    return "its task configs or the data its tasks read changed since it was computed"


def _rows_to_compute(run_dir: Path, rows: list[Row], groups: list[str], on_row, store: RowStore | None = None,
                     keys: dict[str, RowKey] | None = None) -> list[Row]:
    """Validate the finished rows of a resumed run before computing anything: a damaged one is moved
    aside (to .<row>.damaged) and recomputed from its response cache; every cache to be read must open.
    With a store of finished rows, a row finished under the same key is copied instead of computed,
    and one computed anew starts from the response cache of its lineage (``row_store``)."""
    todo = []
    for row in rows:
        row_dir = inside(run_dir, row.label)
        if row_dir.exists():
            why = damage(row_dir, groups)
            stale = None if why else _stale(row_dir, keys and keys[row.label])
            if why is None and stale is None:
                on_row and on_row(row, "kept from the interrupted run")
                continue
            aside = set_aside(run_dir, row.label)
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(row_dir, aside)
            said = f"damaged ({why})" if why else f"set aside ({stale})"
            on_row and on_row(row, f"{said}: recomputed from the response cache")
        if store and keys and _reused(run_dir, row, store, keys[row.label], on_row):
            continue
        if store and keys:
            _lend_cache(run_dir, row, store, keys[row.label], on_row)
        check_cache(cache_db(run_dir, row.label))
        todo.append(row)
    return todo


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


def _task_groups(recipe: Recipe, run_dir: Path) -> tuple[TaskManager, list[tuple[int | None, str]]]:
    """Task configs for the run: one lm-eval group per distinct limit, all in one folder; and the TaskManager
    reading them (lm-eval's tasks, the recipe's include_path folders, then that folder). A task's gen_kwargs
    update its own generation_kwargs on its member of the group, as lm-eval's --gen_kwargs does."""
    if problems := recipe_tasks.task_preflight(recipe):
        raise several(UserError, problems)
    chosen = selected_benchmarks(recipe)
    builtin = [bench for bench, _, _ in chosen if bench.builtin]
    if recipe.data == "offline" and builtin:
        ensure_offline_data(builtin)
    by_limit: dict[int | None, list] = {}
    for bench, shots, limit in chosen:
        by_limit.setdefault(limit, []).append((bench, shots))
    dest, own_folders = run_dir / TASKS, recipe_tasks.include_folders(recipe)
    consent = Consent(recipe.allow_code_execution, recipe.allow_unisolated_execution)

    def write(extra: dict | None = None) -> list[tuple[int | None, str]]:
        return [(limit, write_task_configs(selection, dest, recipe.data, f"_{k}", extra, own_folders, consent))
                for k, (limit, selection) in enumerate(sorted(by_limit.items(), key=lambda kv: kv[0] or 0))]

    groups, folders = write(), [*recipe_tasks.include_folders(recipe), dest]
    extra = recipe_tasks.generation_overrides(recipe, [bench for bench, _, _ in chosen],
                                               lm_eval_tasks.task_index(folders))
    groups = write(extra) if extra else groups
    return lm_eval_tasks.task_manager(folders), groups


def tasks_read(folders: list[Path], groups: list[str]) -> dict:
    """What the run's task groups read (``task_sources.data_fingerprint``): the bytes of their data files
    and local dataset folders, the revisions of their hub datasets."""
    index = lm_eval_tasks.task_index(folders)
    configs = [cfg for group in groups for cfg in lm_eval_tasks.leaf_configs(index[group], index)]
    return data_fingerprint(configs)


def _offline_data_built(recipe: Recipe) -> bool:
    """Whether every packaged dataset the recipe's built-in benchmarks read is already built here."""
    from ensemble_bench.tasks.data_store import data_root, is_complete, local_dataset

    builtin = [bench for bench, _, _ in selected_benchmarks(recipe) if bench.builtin]
    return recipe.data != "offline" or all(is_complete(local_dataset(bench), data_root()) for bench in builtin)


def planned_reuse(recipe: Recipe, fresh: bool = False) -> dict[str, str]:
    """For the plan, by row label: what a run would take instead of computing the row, in words (kept from
    the unfinished run it resumes, or copied from a finished row of another run). The keys are computed as
    the run computes them, over task configs written to a temporary folder. Empty when nothing can be
    taken (``fresh``; no finished row in the output folder and no run to resume) or when the offline data
    is not built yet (the run builds it, and decides then)."""
    run_dir, resumed = planned_run_dir(recipe, fresh)
    store = RowStore(output_root(recipe), lambda row_dir: None)
    if fresh or not (resumed or store.folder.is_dir()) or not _offline_data_built(recipe):
        return {}
    with tempfile.TemporaryDirectory() as scratch:
        _, groups = _task_groups(recipe, Path(scratch))
        folders = [*recipe_tasks.include_folders(recipe), Path(scratch) / TASKS]
        group_names = [group for _, group in groups]
        keys = row_keys(recipe, recipe.plan, [folders[-1], *folders[:-1]], groups,
                        tasks_read(folders, group_names))
    states = {}
    for label, key in keys.items():
        kept = run_dir / label if resumed else None
        if kept and kept.is_dir() and damage(kept, group_names) is None and _stale(kept, key) is None:
            states[label] = "kept from the unfinished run"
        elif (found := store.finished(key)) is not None and damage(found.folder, group_names) is None:
            states[label] = f"reused from {found.name}"
    return states


def run_recipe(recipe: Recipe, finish: Callable[[Path, Recipe], object], fresh: bool = False,
               progress: Callable[[str, int, int | None], None] | None = None,
               on_row: Callable[[Row, str], None] | None = None) -> Path:
    """Run every row of the recipe; return the run directory. When every row is complete, ``finish``
    writes what marks the run finished (the CLI passes ``report.summary.write_summary``: the runner
    writes runs and never imports the reports that read them). The recipe's run lock is held
    throughout, from choosing the run folder to ``finish``: a second run of the same recipe meanwhile is
    refused in one line and changes nothing."""
    if recipe.allow_code_execution and any(bench.runs_code for bench, _, _ in selected_benchmarks(recipe)):
        check_isolation(recipe.allow_unisolated_execution)  # one line; refuses when none and not allowed
    with hold_run_lock(lock_path(output_root(recipe), recipe.name)):
        run_dir = _run_locked(recipe, fresh, progress, on_row)
        finish(run_dir, recipe)
        return run_dir


def _run_locked(recipe: Recipe, fresh: bool, progress, on_row) -> Path:
    from ensemble_bench.run.lm import LM_CLASSES, ReplicatedLM  # lm-eval's model API
    from ensemble_bench.run.replicas import Replicas

    patch_lm_eval()  # lm-eval loads here, not for --dry-run / --reuse (about a second)
    run_dir, _ = run_dir_of(recipe, fresh)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not os.access(run_dir, os.W_OK):
        raise _not_writable(run_dir)
    write_recipe(run_dir, recipe)
    if damaged_params := params_damage(run_dir):
        log.warning("%s: %s: the run resumes with its recipe.yaml and response cache, and writes it again",
                    run_dir / PARAMS, damaged_params)
    if damaged_params or not (run_dir / PARAMS).exists():
        write_params(run_dir, resolved_params(recipe))
    task_manager, groups = _task_groups(recipe, run_dir)
    group_names = [group for _, group in groups]
    inside(run_dir, CACHE).mkdir(exist_ok=True)

    pool = MemberPool(recipe)
    rows = recipe.plan
    store = RowStore(output_root(recipe), lambda row_dir: damage(row_dir, group_names))
    folders = [*recipe_tasks.include_folders(recipe), run_dir / TASKS]
    keys = row_keys(recipe, rows, [folders[-1], *folders[:-1]], groups, tasks_read(folders, group_names))
    replicas = Replicas(recipe) if recipe.placement.replicas > 1 else None  # run/replicas.py
    try:
        for row in _rows_to_compute(run_dir, rows, group_names, on_row, None if fresh else store, keys):
            on_row and on_row(row, "loading")
            row_progress = (lambda n, total, label=row.label: progress(label, n, total)) if progress else None
            if replicas is not None:
                lm = ReplicatedLM(replicas, row.label, progress=row_progress)
            else:
                lm = LM_CLASSES[row.method](build_method(recipe, row, pool), row.label, progress=row_progress)
            on_row and on_row(row, "evaluating")
            _evaluate_row(recipe, row, lm, run_dir, groups, task_manager, keys[row.label].key)
            store.remember(keys[row.label], inside(run_dir, row.label), cache_db(run_dir, row.label))
    finally:
        if replicas is not None:
            replicas.close()
    _check_complete(run_dir, rows, group_names)
    return run_dir
