"""A run resolved once: everything ``ensbench run`` decides before a model loads, as one frozen value.

:func:`run_setup` builds a :class:`RunSetup` right after the recipe is parsed. The plan (cli/plan.py)
prints it and the runner (run/runner.py) acts on it, so each fact of a run is derived once per command:
the output folder and the include_path folders are resolved, lm-eval's task index is read, the
benchmarks are selected, the machine is checked (run/preflight.py), the run to resume is found, the task
configs are written, the data they read is fingerprinted, the row keys are computed, and each row's state
(kept, reused, lent, compute) is decided by one function, :func:`row_state`.

The task configs are written once, into a scratch folder, and kept as bytes: the keys are computed over
that folder (its own path replaced, as ``row_store`` does for every task folder), and the runner writes
the same bytes into the run folder's ``tasks/``. Only the run folder is chosen again, by the runner under
the recipe's run lock (runner.py says why).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from ensemble_bench import settings
from ensemble_bench.errors import UserError, lines_of
from ensemble_bench.recipe import Recipe, Row, selected_benchmarks
from ensemble_bench.run.folder import TASKS, cache_db, inside, output_root, recorded_key
from ensemble_bench.run.preflight import preflight
from ensemble_bench.run.row_check import damage
from ensemble_bench.run.row_store import INDEX, RowKey, RowStore, row_keys
from ensemble_bench.run.runs import resumed_run
from ensemble_bench.tasks import Benchmark, lm_eval_tasks, recipe_tasks
from ensemble_bench.tasks.code_exec import Consent
from ensemble_bench.tasks.data_store import data_root, is_complete, local_dataset
from ensemble_bench.tasks.lm_eval_tasks import Found
from ensemble_bench.tasks.offline import ensure_offline_data, write_task_configs
from ensemble_bench.tasks.task_sampling import sampling_problems
from ensemble_bench.tasks.task_sources import data_fingerprint

KEPT, REUSED, LENT, COMPUTE = "kept", "reused", "lent", "compute"


@dataclass(frozen=True)
class RowState:
    """What the run does with one row. ``kind``: KEPT (finished by the unfinished run it resumes),
    REUSED (copied from a finished row of the output folder with the same key), LENT (computed, starting
    from the response cache of a finished row of its lineage) or COMPUTE."""

    kind: str
    source: Path | None = None  # REUSED: the stored row's folder; LENT: the response cache lent
    source_name: str = ""  # the source under the output folder, as the run names it
    aside: str | None = None  # the row folder the unfinished run left is set aside first: why, in words
    note: str | None = None  # why a finished row with this key (or almost) is not reused, in words
    lent_tasks: tuple[str, ...] = ()  # LENT: the tasks (with this row's shots) whose answers the lent cache holds


@dataclass(frozen=True)
class TaskFolder:
    """The run's lm-eval task configs as written once: each file's bytes by its path under ``tasks/``,
    and the lm-eval group of each task limit."""

    files: Mapping[str, bytes]
    groups: tuple[tuple[int | None, str], ...]

    @property
    def group_names(self) -> list[str]:
        return [group for _, group in self.groups]


@dataclass(frozen=True)
class RunSetup:
    """A recipe's run as resolved before anything loads (see the module's docstring)."""

    recipe: Recipe
    fresh: bool
    output_root: Path
    include_folders: tuple[Path, ...]
    task_index: Mapping[str, Found] | None  # lm-eval's tasks with the include_path folders; None: all built in
    benchmarks: tuple[tuple[Benchmark, int | None, int | None], ...]  # (benchmark, shots, limit) per task
    problems: tuple[str, ...]  # what stops the run on this machine (the preflight's lines): the plan shows them
    run_dir: Path | None  # the unfinished run it resumes, or the new run's folder (<date>-<time>); None: unread
    resumed: bool
    tasks: TaskFolder | None  # None: not written (problems; a dry run with nothing to reuse or data not built)
    keys: Mapping[str, RowKey]  # by row label, when ``tasks`` is written
    states: Mapping[str, RowState]  # by row label, when ``tasks`` is written


def run_setup(recipe: Recipe, source: str = "recipe", fresh: bool = False, dry_run: bool = False) -> RunSetup:
    """The run of ``recipe`` resolved. The recipe's mistakes for this machine (a missing model file, a task
    lm-eval lacks here, an include_path that is not a folder, ...) raise one UserError of one line each;
    the machine's problems are kept in ``problems``. A dry run writes the task configs and computes the
    keys only when a row could be taken from an earlier run and the offline data is already built (a run
    builds it here first)."""
    settings.check_environment()  # a bad environment variable first, before anything reads one
    root = output_root(recipe)
    try:
        folders, folder_lines = recipe_tasks.include_folders(recipe), []
    except UserError as err:
        folders, folder_lines = [], list(lines_of(err))
    index = None if folder_lines else recipe_tasks.task_index_of(recipe, folders)
    task_lines = folder_lines or [*recipe_tasks.task_preflight(recipe, index), *sampling_problems(recipe, index)]
    problems = tuple(preflight(recipe, source, root, task_lines))
    benchmarks = tuple(selected_benchmarks(recipe, index))
    run_dir, resumed = _planned_run_dir(recipe, root, fresh, problems)
    tasks, keys, states = None, {}, {}
    if not problems and (not dry_run or _rows_to_take(recipe, root, fresh, resumed, benchmarks)):
        tasks, keys = _write_tasks(recipe, benchmarks, folders)
        groups = tasks.group_names
        store = None if fresh else RowStore(root, lambda row_dir: damage(row_dir, groups))
        states = {row.label: row_state(row, keys[row.label], run_dir if resumed else None, store, groups)
                  for row in recipe.plan}
    return RunSetup(recipe, fresh, root, tuple(folders), index, benchmarks, problems, run_dir, resumed, tasks,
                    MappingProxyType(keys), MappingProxyType(states))


def _planned_run_dir(recipe: Recipe, root: Path, fresh: bool, problems: tuple[str, ...]) -> tuple[Path | None, bool]:
    """The unfinished run a run resumes (True), or where a new one goes (False; named by the second the run
    starts, shown as <date>-<time>). None when the run folders cannot be read and the preflight already
    names a problem (else that read's one line)."""
    try:
        found = None if fresh else resumed_run(recipe, root)
    except OSError:
        if not problems:
            raise
        return None, False
    if found is not None:
        return found, True
    return root.resolve() / recipe.name / f"<date>-<time>-{recipe.fingerprint()}", False


def _rows_to_take(recipe: Recipe, root: Path, fresh: bool, resumed: bool, benchmarks) -> bool:
    """Whether a dry run is to say which rows would be taken rather than computed: not with --fresh; with a
    run to resume or finished rows in the output folder; and only once every packaged dataset the
    recipe's built-in benchmarks read is built here (a dry run builds none: the run does, and decides then)."""
    builtin = [bench for bench, _, _ in benchmarks if bench.builtin]
    built = recipe.data != "offline" or all(is_complete(local_dataset(bench), data_root()) for bench in builtin)
    return not fresh and (resumed or (root / INDEX).is_dir()) and built


def _write_tasks(recipe: Recipe, benchmarks, folders: list[Path]) -> tuple[TaskFolder, dict[str, RowKey]]:
    """The run's task configs, written once into a scratch folder (the offline data built first), and the
    key of every row over them and the bytes of the data they read."""
    with tempfile.TemporaryDirectory(prefix="ensbench-tasks-") as scratch:
        dest = Path(scratch) / TASKS
        groups = _write_groups(recipe, benchmarks, folders, dest)
        names = [group for _, group in groups]
        index = lm_eval_tasks.task_index([*folders, dest])
        data = data_fingerprint(cfg for group in names for cfg in lm_eval_tasks.leaf_configs(index[group], index))
        keys = row_keys(recipe, recipe.plan, [dest, *folders], groups, benchmarks, data)
        files = {path.relative_to(dest).as_posix(): path.read_bytes()
                 for path in sorted(dest.rglob("*")) if path.is_file()}
    return TaskFolder(MappingProxyType(files), tuple(groups)), keys


def _write_groups(recipe: Recipe, benchmarks, folders: list[Path], dest: Path) -> list[tuple[int | None, str]]:
    """One lm-eval group per distinct limit, all in ``dest``. A task's gen_kwargs update its own
    generation_kwargs on its member of the group, as lm-eval's --gen_kwargs does: they are read from the
    configs just written (a template task's are in ``dest``), and the groups written again with them."""
    builtin = [bench for bench, _, _ in benchmarks if bench.builtin]
    if recipe.data == "offline" and builtin:
        ensure_offline_data(builtin)
    by_limit: dict[int | None, list] = {}
    for bench, shots, limit in benchmarks:
        by_limit.setdefault(limit, []).append((bench, shots))
    consent = Consent(recipe.allow_code_execution, recipe.allow_unisolated_execution)

    def write(extra: dict | None = None) -> list[tuple[int | None, str]]:
        return [(limit, write_task_configs(selection, dest, recipe.data, f"_{k}", extra, folders, consent))
                for k, (limit, selection) in enumerate(sorted(by_limit.items(), key=lambda kv: kv[0] or 0))]

    groups = write()
    extra = recipe_tasks.generation_overrides(recipe, [bench for bench, _, _ in benchmarks],
                                              lm_eval_tasks.task_index([*folders, dest]))
    return write(extra) if extra else groups


def row_state(row: Row, key: RowKey, run_dir: Path | None, store: RowStore | None, groups: list[str]) -> RowState:
    """The one decision of what happens to a row: kept when the unfinished run ``run_dir`` it resumes
    finished it and it proves itself (``row_check.damage``) under the key its inputs give now (else that
    folder is set aside, and the row recomputed from its response cache); reused when ``store`` (the
    output folder's finished rows; None with --fresh) holds a row with the same key that proves itself;
    lent when it does not, but a row of its lineage left a response cache (and the run has none of its
    own); computed otherwise."""
    aside = None
    if run_dir is not None and (row_dir := inside(run_dir, row.label)).exists():
        why = damage(row_dir, groups)
        stale = None if why else _stale(row_dir, key)
        if why is None and stale is None:
            return RowState(KEPT)
        aside = f"damaged ({why})" if why else f"set aside ({stale})"
    if store is None:
        return RowState(COMPUTE, aside=aside)
    found = store.finished(key)
    if found is not None and found.problem is None:
        return RowState(REUSED, found.folder, found.name, aside)
    note = f"not reused: {found.name} fails its check ({found.problem}); computed again" if found else None
    if found is None and (why := store.data_changed(key)):
        note = f"computed again: {why}"
    own_cache = run_dir is not None and cache_db(run_dir, row.label).exists()
    lent = None if own_cache else store.lineage_cache(key)
    if lent is None:
        return RowState(COMPUTE, aside=aside, note=note)
    source, tasks = lent
    name = source.relative_to(store.root).as_posix()
    if not tasks:  # its answers are to other tasks or shots: nothing to lend, and the line says so
        none = f"no cached answers ({name} holds none of its tasks with their shots)"
        return RowState(COMPUTE, aside=aside, note=f"{note}; {none}" if note else none)
    return RowState(LENT, source, name, aside, note, tuple(tasks))


def _stale(row_dir: Path, key: RowKey) -> str | None:
    """Why a row finished by the interrupted run no longer answers its inputs: its recorded key is not the
    one its task configs and data give now (a row written before keys were recorded is kept)."""
    recorded = recorded_key(row_dir)
    if recorded is None or recorded == key.key:
        return None
    return "its task configs or the data its tasks read changed since it was computed"
