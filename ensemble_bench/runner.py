"""Recipe -> lm-eval ``simple_evaluate`` -> results/<recipe>/<run id>/, atomically and resumably.

The run folder's files are named and written by ``run_folder`` (its docstring draws the layout);
``results/.<recipe>.lock`` is held by the run in progress (run_lock): one writer per recipe.

A row is one evaluated model: a member alone (method ``single``) or the ensemble. Re-running a
recipe whose last run did not finish resumes it: finished rows are kept and the response cache
answers every request already computed. ``output:`` is read through ``output_root`` only.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import yaml

from ensemble_bench import settings
from ensemble_bench.build import MemberPool, build_method
from ensemble_bench.cache import atomic_write_text
from ensemble_bench.errors import DAMAGED_SQLITE, EnvironmentFault, UserError, several
from ensemble_bench.members.sources import model_problem
from ensemble_bench.methods import current_params, get_method
from ensemble_bench.recipe import Recipe, Row, parse_recipe, selected_benchmarks
from ensemble_bench.report.summary import write_summary
from ensemble_bench.row_check import damage
from ensemble_bench.row_store import (
    LENT_NOTE,
    REUSED_NOTE,
    RowKey,
    RowStore,
    copy_row,
    record_reuse,
    row_keys,
    seed_cache,
)
from ensemble_bench.run_folder import (
    CACHE,
    PARAMS,
    RECIPE,
    SPAN_TRACE,
    TASKS,
    is_finished,
    recorded_key,
    write_recipe,
    write_timing,
)
from ensemble_bench.run_lock import hold_run_lock, lock_path
from ensemble_bench.sittings import resume_counts, save_counts
from ensemble_bench.tasks import get_benchmark, is_builtin, lm_eval_tasks, recipe_tasks
from ensemble_bench.tasks.code_exec import Consent, check_isolation, isolation_level
from ensemble_bench.tasks.offline import ensure_offline_data, write_task_configs
from ensemble_bench.tasks.task_sources import data_fingerprint

if TYPE_CHECKING:
    from lm_eval.tasks import TaskManager

log = logging.getLogger(__name__)
HUB = ("huggingface.co", 443)


def output_root(recipe: Recipe) -> Path:
    """The recipe's ``output:`` folder with ``~`` and ``$VAR`` expanded: the one reading of it, used by
    the preflight and the run alike (``settings.expand_path``)."""
    return settings.expand_path(recipe.output, f"output: '{recipe.output}'")


# --- checks before anything is loaded (run and --dry-run) -------------------------------------------
def _network_problem(recipe: Recipe) -> str | None:
    if recipe.data != "hub":
        return None
    offline = settings.hub_offline()
    if offline:
        return (f"data: hub needs the network but {offline} is set: use data: offline (benchmarks with a "
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
    target = output_root(recipe) / recipe.name
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


def _cache_problem() -> str | None:
    """The cache of models and data ($ENSBENCH_CACHE) cannot be written (a read-only disk)."""
    root = settings.cache_root()
    try:
        with tempfile.TemporaryFile(dir=root):
            pass
    except OSError as err:
        return (f"{settings.CACHE}: cannot write in '{root}' ({err.strerror or err}): make it writable or set "
                f"{settings.CACHE} to a writable folder")
    return None


def _installed(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def _package_problems(recipe: Recipe) -> list[str]:
    """Optional packages the recipe needs that this machine lacks: ray (placement), bitsandbytes
    (quantization in this process), and what a method's parameters need (``Method.packages``)."""
    lines = []
    if recipe.placement.kind == "ray" and not _installed("ray"):
        lines.append("placement.kind: ray needs the ray package (pip install 'ensemble-bench[ray]')")
    for i, member in enumerate(recipe.members):
        if member.quantization and recipe.placement.kind != "ray" and not _installed("bitsandbytes"):
            lines.append(f"members[{i}].quantization: '{member.quantization}' needs the bitsandbytes package "
                         "(pip install bitsandbytes)")
    for row in recipe.plan:
        for package, install in get_method(row.method).packages(row.params).items():
            if not _installed(package):
                lines.append(f"row {row.label}: method '{row.method}' needs the {install} package with these "
                             f"parameters (pip install {install})")
    return lines


def _model_problems(recipe: Recipe) -> list[tuple[type[Exception], str]]:
    """Members (and models a method loads, such as a scorer) that cannot be loaded here (sources.model_problem)."""
    named = [(f"members[{i}].model", member.model) for i, member in enumerate(recipe.members)]
    named += [(f"row {row.label}", model) for row in recipe.plan
              for model in get_method(row.method).models(row.params)]
    fields: dict[str, str] = {}  # model -> the first field naming it
    for field, model in named:
        fields.setdefault(model, field)
    found = []
    for model, field in fields.items():
        if problem := model_problem(model):
            kind, line = problem
            found.append((kind, f"{field}: {line}"))
    return found


def _data_problems(recipe: Recipe) -> list[str]:
    """Benchmarks whose offline copy is not built and cannot be built here (BBH without its folder)."""
    if recipe.data != "offline":
        return []
    from ensemble_bench.tasks.data_store import data_root, is_complete
    from ensemble_bench.tasks.offline_data import LOCAL_DATASETS

    lines = []
    for i, task in enumerate(recipe.tasks):  # built-in benchmarks only: any other task brings its own data
        spec = LOCAL_DATASETS.get(get_benchmark(task.name, task.variant).name) if is_builtin(task.name) else None
        if spec is not None and (needs := spec.missing()) and not is_complete(spec, data_root()):
            lines.append(f"tasks[{i}].name: benchmark '{task.name}' has no offline data on this machine: {needs}")
    return lines


def preflight(recipe: Recipe, source: str = "recipe") -> list[str]:
    """What would stop the run on this machine, found before any model is loaded, every problem at
    once: members' models (missing files, hub models not cached while offline), optional packages,
    benchmark data, the output folder, the cache folder, the members' devices, the network for
    ``data: hub``. A mistake in the recipe for this machine (a missing model file or package) raises
    one UserError of one line each (with the environment's lines); the environment's problems alone
    are returned, one line each (empty when all is well). A bad environment variable is a UserError
    first (``settings.check_environment``)."""
    settings.check_environment()
    models = _model_problems(recipe)
    mistakes = [f"{source}: {line}" for line in (*[line for kind, line in models if kind is UserError],
                                                 *_package_problems(recipe), *_data_problems(recipe),
                                                 *recipe_tasks.task_preflight(recipe))]
    problems = [*[line for kind, line in models if kind is not UserError], _output_problem(recipe),
                _cache_problem(), *_device_problems(recipe), _network_problem(recipe)]
    problems = [p for p in problems if p]
    if mistakes:
        raise several(UserError, mistakes + problems)
    return problems


# --- run directories ---------------------------------------------------------------------------
def inside(folder: Path, name: str) -> Path:
    """``folder / name``, refused unless it is an entry of that folder (no separator, no '..', no
    link out): every path the runner writes or deletes goes through here (labels are also checked
    when the recipe is read)."""
    path = folder / name
    if name in ("", ".", "..") or "/" in name or "\\" in name or path.resolve().parent != folder.resolve():
        raise UserError(f"{name!r} would be written outside the run folder {folder}; refused")
    return path


def _runs_of(recipe: Recipe, passed: list[tuple[Path, str]] | None = None) -> list[Path]:
    """Run folders of this exact recipe, oldest first; judged by the recipe each folder holds, so
    runs stay findable when the fingerprint's own definition changes. A run whose rows were
    computed with other method parameters than this code gives the recipe (a default changed
    since) is not this recipe's run: it is neither resumed nor reused. Each folder passed over is
    added to ``passed`` with the reason, in a few words."""
    base = output_root(recipe) / recipe.name
    fingerprint = recipe.fingerprint()
    found: list[Path] = []
    passed = [] if passed is None else passed
    for folder in sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []:
        try:
            held = parse_recipe(yaml.safe_load((folder / RECIPE).read_text()), str(folder))
        except (OSError, UserError, yaml.YAMLError) as err:
            why = str(err).splitlines()[0] if str(err).strip() else type(err).__name__
            passed.append((folder, f"its recipe.yaml cannot be read ({why})"))
            continue
        if held.model_copy(update={"output": recipe.output}).fingerprint() != fingerprint:
            passed.append((folder, "it ran another version of this recipe"))
        elif not _same_params(folder, recipe):
            passed.append((folder, "its rows used other method parameters than this code gives the recipe "
                                   "(a default changed since)"))
        else:
            found.append(folder)
    return found


def resolved_params(recipe: Recipe) -> dict[str, dict]:
    """Every row's method parameters with the defaults of this code filled in (the recipe's
    fingerprint leaves defaults out, so that adding a field keeps old runs resumable)."""
    return {row.label: row.params.model_dump(mode="json") for row in recipe.plan}


def _params_damage(folder: Path) -> str | None:
    """Why a run folder's PARAMS cannot be read (cut short, not JSON, not a mapping), or None (sound or absent)."""
    try:
        held = json.loads((folder / PARAMS).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        return f"{PARAMS} is damaged ({type(err).__name__})"
    return None if isinstance(held, dict) else f"{PARAMS} is damaged (not a JSON object)"


def _same_params(folder: Path, recipe: Recipe) -> bool:
    """Whether a run folder's rows used the parameters this code resolves; runs written before
    PARAMS existed have none to compare and count as the same, and so does a damaged PARAMS (its
    recipe.yaml is this recipe: the run resumes, says so, and writes the file again)."""
    if _params_damage(folder) is not None:
        return True
    try:
        held = json.loads((folder / PARAMS).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return True
    method_of = {row.label: row.method for row in recipe.plan}  # stored names read as this code's (lead)
    held = {label: current_params(method_of.get(label, ""), p) if isinstance(p, dict) else p
            for label, p in held.items()} if isinstance(held, dict) else held
    return held == resolved_params(recipe)


def _run_dir(recipe: Recipe, fresh: bool) -> tuple[Path, bool]:
    """The unfinished run of this exact recipe to resume, or a new run directory's name; whether resumed."""
    passed: list[tuple[Path, str]] = []
    unfinished = _unfinished_runs(recipe, passed)
    if unfinished and not fresh:
        return unfinished[-1], True
    for folder, why in passed if not fresh else []:  # never passed over silently
        log.warning("%s: unfinished run not resumed: %s; a new run starts", folder, why)
    return _new_run_dir(recipe), False


def _unfinished_runs(recipe: Recipe, passed: list[tuple[Path, str]]) -> list[Path]:
    """The unfinished runs of this exact recipe, oldest first; the unfinished folders of the recipe's
    name that are not its runs are added to ``passed`` with the reason."""
    found: list[tuple[Path, str]] = []
    runs = [p for p in _runs_of(recipe, found) if not is_finished(p)]
    passed += [(folder, why) for folder, why in found if not is_finished(folder)]
    return runs


def planned_run_dir(recipe: Recipe, fresh: bool = False) -> tuple[Path, bool]:
    """Where a run of the recipe will write, for its plan: the unfinished run it resumes (True), or
    its new folder (False; named by the second the run starts, shown as <date>-<time>)."""
    unfinished = _unfinished_runs(recipe, [])
    if unfinished and not fresh:
        return unfinished[-1], True
    return output_root(recipe).resolve() / recipe.name / f"<date>-<time>-{recipe.fingerprint()}", False


def _new_run_dir(recipe: Recipe) -> Path:
    """A name for a new run folder: the time (to the second) and the fingerprint, with -02, -03, ...
    when a run of the same second has it. Chosen under the recipe's run lock, so no other run of
    this name and fingerprint can take it before it is created; the names still sort oldest first."""
    base = output_root(recipe) / recipe.name
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{recipe.fingerprint()}"
    number = 1
    while (base / (name := stem if number == 1 else f"{stem}-{number:02d}")).exists():
        number += 1
    return base / name


def finished_run(recipe: Recipe) -> Path | None:
    """The newest finished run of this exact recipe, if any."""
    done = [p for p in _runs_of(recipe) if is_finished(p)]
    return done[-1] if done else None


# --- evaluation -----------------------------------------------------------------------------------
def _evaluate_row(recipe: Recipe, row: Row, lm, run_dir: Path, groups, task_manager,
                  row_key: str | None = None) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker

    partial = inside(run_dir, f".{row.label}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    cache = inside(run_dir, CACHE)
    cache.mkdir(parents=True, exist_ok=True)
    _carry_counts(lm, cache_db(run_dir, row.label))
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
              "requests_computed": lm.requests_computed, **lm.scoring.summary(), "row_key": row_key}
    write_timing(partial, timing)
    traces = getattr(lm.method, "traces", None)  # span-level methods: candidates and scores per round
    if traces:
        lines = "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in traces)
        atomic_write_text(partial / SPAN_TRACE, lines)
    missing = damage(partial, [group for _, group in groups])
    if missing:  # lm-eval logs a failed write of its files as a warning and goes on
        raise EnvironmentFault(f"{partial}: the files of row {row.label} were not all written ({missing}): check "
                               "that folder's disk and permissions, then run the same command again")
    final = inside(run_dir, row.label)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)


def _carry_counts(lm, db: Path) -> None:
    """The row's statistics over all its sittings: the earlier sittings' counters are added before it
    computes anything, and the counters so far are written after every chunk of cached answers."""
    holders = {**lm.method.carried(), "scoring": lm.scoring}
    resume_counts(holders, db)
    lm.after_chunk = lambda: save_counts(holders, db)


# --- resuming: the state an interrupted run left ------------------------------------------------------
def cache_db(run_dir: Path, label: str) -> Path:
    """lm-eval's response cache of one row (lm-eval appends _rank<n>.db to the name it is given)."""
    return inside(run_dir / CACHE, f"{label}_rank0.db")


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
    partial = inside(run_dir, f".{row.label}.partial")
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
            aside = inside(run_dir, f".{row.label}.damaged")
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


def run_recipe(recipe: Recipe, fresh: bool = False, progress: Callable[[str, int, int | None], None] | None = None,
               on_row: Callable[[Row, str], None] | None = None) -> Path:
    """Run every row of the recipe; return the run directory (with summary.md when done). The recipe's
    run lock is held throughout, from choosing the run folder to the summary: a second run of the same
    recipe meanwhile is refused in one line and changes nothing."""
    if recipe.allow_code_execution and any(bench.runs_code for bench, _, _ in selected_benchmarks(recipe)):
        check_isolation(recipe.allow_unisolated_execution)  # one line; refuses when none and not allowed
    with hold_run_lock(lock_path(output_root(recipe), recipe.name)):
        return _run_locked(recipe, fresh, progress, on_row)


def _run_locked(recipe: Recipe, fresh: bool, progress, on_row) -> Path:
    from ensemble_bench.lm import LM_CLASSES  # lm-eval's model API

    patch_lm_eval()  # lm-eval loads here, not for --dry-run / --reuse (about a second)
    run_dir, _ = _run_dir(recipe, fresh)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not os.access(run_dir, os.W_OK):
        raise _not_writable(run_dir)
    write_recipe(run_dir, recipe)
    if params_damage := _params_damage(run_dir):
        log.warning("%s: %s: the run resumes with its recipe.yaml and response cache, and writes it again",
                    run_dir / PARAMS, params_damage)
    if params_damage or not (run_dir / PARAMS).exists():
        atomic_write_text(run_dir / PARAMS, json.dumps(resolved_params(recipe), indent=1, sort_keys=True))
    task_manager, groups = _task_groups(recipe, run_dir)
    group_names = [group for _, group in groups]
    inside(run_dir, CACHE).mkdir(exist_ok=True)

    pool = MemberPool(recipe)
    rows = recipe.plan
    store = RowStore(output_root(recipe), lambda row_dir: damage(row_dir, group_names))
    folders = [*recipe_tasks.include_folders(recipe), run_dir / TASKS]
    keys = row_keys(recipe, rows, [folders[-1], *folders[:-1]], groups, tasks_read(folders, group_names))
    for row in _rows_to_compute(run_dir, rows, group_names, on_row, None if fresh else store, keys):
        on_row and on_row(row, "loading")
        method = build_method(recipe, row, pool)
        row_progress = (lambda n, total, label=row.label: progress(label, n, total)) if progress else None
        lm = LM_CLASSES[row.method](method, row.label, progress=row_progress)
        on_row and on_row(row, "evaluating")
        _evaluate_row(recipe, row, lm, run_dir, groups, task_manager, keys[row.label].key)
        store.remember(keys[row.label], inside(run_dir, row.label), cache_db(run_dir, row.label))
    _check_complete(run_dir, rows, group_names)
    write_summary(run_dir, recipe)
    return run_dir
