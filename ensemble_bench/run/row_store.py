"""Finished rows reused by later runs, in any recipe under the same output folder.

A row's key is a hash of everything that decides its outputs (``row_keys``): its label, its members
as they load (model, the SHA-256 of its files or its hub revision, dtype, device, chat template,
kind, ...), the method, its version and its parameters with defaults filled in, the run's task
configs (every file of its ``tasks/`` folder and of the recipe's include_path folders), the bytes of
every data file and local dataset folder the tasks read and the revision of every hub dataset
(``task_sources.data_fingerprint``), shots, limits (the examples are the first ``limit`` of each
task), data mode, seed, and the versions of this
package, lm-eval, transformers and torch. The batch size and the placement are left out: outputs
do not depend on them (docs/invariants.md). The row's *lineage* is the same hash without the label,
tasks and limits: rows of one lineage answer any request alike, so one's lm-eval response cache
answers the other's requests (a raised limit computes only the new examples).

Layout, under the output folder::

    .rows/<key>.json      {"key", "lineage", "apart_from_data", "data": {file: sha256},
                           "links": {data file as named: its real path}, "run": "<recipe>/<run id>",
                           "row": <label>, "cache": <db>}
    <recipe>/<run id>/reused.json   the rows this run copied, and from where

Before reuse a stored row must prove itself (``row_check.damage``: every file there, its scores
recomputable from its samples, its samples the examples recorded); one that does not is recomputed
and the run names the file that failed. Sources are only read: a reused row's files are copied, a
response cache is copied with sqlite's backup (a consistent copy even while another process writes it).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import sqlite3
from collections.abc import Callable, Collection
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ensemble_bench import __version__
from ensemble_bench.cache import atomic_write_text
from ensemble_bench.decoding.request_sampling import row_policy
from ensemble_bench.members.backends import DEFAULT, backend_spec
from ensemble_bench.members.sources import PACKAGED
from ensemble_bench.methods import method_spec
from ensemble_bench.recipe import MemberSpec, Recipe, Row, is_safe_label
from ensemble_bench.run.folder import REUSED, TIMING, parse_json, read_json, recorded_key, results_files, write_timing
from ensemble_bench.tasks.task_sources import content_digest

INDEX = ".rows"
REUSED_NOTE = "files copied: scores, latency, tokens and requests_computed are the original row's"
LENT_NOTE = "its response cache answered the requests it holds: requests_computed counts only the new ones"
# member fields that do not change a row's outputs: weights reach an ensemble through its method's
# parameters; the others name the member's paper row or size its Ray actor
NOT_OUTPUTS = {"weight", "paper_row", "num_gpus", "num_cpus", "resources"}
LIBRARIES = ("lm_eval", "transformers", "torch")


@dataclass(frozen=True)
class RowKey:
    key: str  # everything that decides the row's outputs
    lineage: str  # the same without tasks, shots and limits
    apart_from_data: str = ""  # the key without the bytes of the tasks' data (to say that only the data changed)
    data: dict[str, str] = field(default_factory=dict)  # data file -> SHA-256 of its bytes
    links: dict[str, str] = field(default_factory=dict)  # data file as named -> its real path (not in the key)
    tasks: dict[str, int] = field(default_factory=dict)  # lm-eval task or group -> shots, as the row evaluates them


@dataclass(frozen=True)
class StoredRow:
    """A finished row found under a key: its folder, its name (``<run>/<row>``) and why it cannot be
    reused (None: it can)."""

    folder: Path
    name: str
    problem: str | None


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _versions() -> dict[str, str | None]:
    return {"ensemble_bench": __version__, **{name: _installed_version(name) for name in LIBRARIES}}


def _hub_revision(model: str) -> str | None:
    """The commit of a hub model's cached snapshot (its folder name), or None when it is not cached."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(model, "config.json")
    except ValueError:  # not a hub id
        return None
    return Path(found).parent.name if isinstance(found, str) else None


def _model_files(model: str) -> Any:
    """What identifies the model's weights: a packaged model's checksum (checked when it loads), the
    SHA-256 of every file of a local file or folder (``content_digest``: streaming, kept while the
    file's size, mtime, ctime and inode stay), or a hub model's cached revision."""
    if model in PACKAGED:
        return PACKAGED[model].sha256
    path = Path(model).expanduser()
    if path.is_file() or path.is_dir():
        files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
        return [str(path.resolve()), *[(p.name, content_digest(p)) for p in files]]
    return _hub_revision(model)


def _member(member: MemberSpec) -> dict[str, Any]:
    fields = member.model_dump(mode="json", exclude=NOT_OUTPUTS)
    if fields["backend"] == DEFAULT:  # the default: keys of rows stored before backends existed stay
        del fields["backend"]
    else:
        fields.update(member.section_kwargs())
        fields["engine_version"] = backend_spec(member.backend).version()
    return {**fields, "label": member.label, "files": _model_files(member.model)}


WHOLE_FILE_BYTES = 1 << 20  # task configs up to this size are read whole (their folder's path replaced)


def _folders_digest(folders: list[Path], data_files: Collection[str] = ()) -> str:
    """Every file of the run's task folder and of the recipe's include_path folders but the tasks' data
    files (keyed apart). A task config (up to WHOLE_FILE_BYTES) is read with each folder's own path
    written as ``<folder k>``, so that the same configs in another run folder hash alike; a larger file is
    hashed streaming, its hash kept in the cache (``content_digest``): constant memory whatever its size."""
    digest = hashlib.sha256()
    for k, folder in enumerate(folders):
        here = str(folder).encode()
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and str(p.resolve()) not in data_files):
            digest.update(f"{k}/{path.relative_to(folder).as_posix()}".encode() + b"\0")
            if path.stat().st_size > WHOLE_FILE_BYTES:
                digest.update(content_digest(path).encode() + b"\0")
            else:
                digest.update(path.read_bytes().replace(here, f"<folder {k}>".encode()) + b"\0")
    return digest.hexdigest()


def row_keys(recipe: Recipe, rows: list[Row], task_folders: list[Path], groups: list[tuple[int | None, str]],
             benchmarks, data: dict[str, Any] | None = None) -> dict[str, RowKey]:
    """The key and lineage of every row of a run, by label. ``task_folders``: the run's task configs
    and the recipe's include_path folders; ``groups``: the lm-eval groups with their limits;
    ``benchmarks``: the selected (benchmark, shots, limit) of each task (``recipe.selected_benchmarks``);
    ``data``: what the tasks read (``task_sources.data_fingerprint``: data files' bytes, hub revisions)."""
    data = data or {"files": {}, "hub": []}
    shared = {"versions": _versions(), "seed": recipe.seed, "fewshot_as_multiturn": recipe.fewshot_as_multiturn,
              "allow_code_execution": recipe.allow_code_execution}
    tasks = {"files": _folders_digest(task_folders, data["files"]), "groups": groups, "data": recipe.data,
             "tasks": [task.model_dump(mode="json") for task in recipe.tasks]}
    evaluated = {bench.task: bench.default_shots if shots is None else shots
                 for bench, shots, _ in benchmarks}
    keys = {}
    for row in rows:
        lineage = {**shared, "method": row.method, "version": method_spec(row.method).version,
                   "params": row.params.model_dump(mode="json"),
                   "members": [_member(recipe.members[i]) for i in row.members]}
        if (override := row_policy(recipe, row).override) is not None:  # absent: the keys rows had before it
            lineage["sampling"] = override.model_dump(mode="json")
        apart = {**lineage, "label": row.label, "tasks": tasks, "hub_data": data["hub"]}
        keys[row.label] = RowKey(_digest({**apart, "read": data["files"]}), _digest(lineage), _digest(apart),
                                 data["files"], data.get("links", {}), evaluated)
    return keys


class RowStore:
    """The index of finished rows under one output folder. ``problem(row_dir)`` says why a row folder
    cannot be reused (a file missing, scores its samples do not give), or None (the runner's check)."""

    def __init__(self, root: Path, problem: Callable[[Path], str | None]):
        self.root = root
        self.folder = root / INDEX
        self.problem = problem

    def _entry(self, path: Path) -> dict | None:
        try:
            entry = parse_json(path)
        except (OSError, ValueError):
            return None
        return entry if isinstance(entry, dict) and isinstance(entry.get("run"), str) else None

    def _entries(self) -> list[dict]:
        return [entry for path in (sorted(self.folder.glob("*.json")) if self.folder.is_dir() else [])
                if (entry := self._entry(path))]

    def _inside(self, relative: str) -> Path | None:
        """``root / relative`` when it stays inside the output folder (an index file is never trusted further)."""
        path = self.root / relative
        return path if path.resolve().is_relative_to(self.root.resolve()) else None

    def finished(self, key: RowKey) -> StoredRow | None:
        """The finished row with this key whose timing.json records the same key, with why it cannot be
        reused (``problem``), if there is one."""
        entry = self._entry(self.folder / f"{key.key}.json")
        if entry is None or not is_safe_label(str(entry.get("row"))):
            return None
        run = self._inside(entry["run"])
        row_dir = run / entry["row"] if run else None
        if row_dir is None or recorded_key(row_dir) != key.key:
            return None
        return StoredRow(row_dir, f"{entry['run']}/{entry['row']}", self.problem(row_dir))

    def data_changed(self, key: RowKey) -> str | None:
        """When a finished row differs from this key only in the bytes of its data: which file changed
        (or appeared, or went), and the row, in words; else None."""
        for entry in self._entries():
            if entry.get("apart_from_data") != key.apart_from_data or entry.get("key") == key.key:
                continue
            when = f"{entry['run']}/{entry.get('row')} was computed"
            if moved := _moved_link(entry.get("links"), key.links):
                return f"the link {moved[0]} points to {moved[2]}, not to {moved[1]} as when {when}"
            before = entry.get("data") if isinstance(entry.get("data"), dict) else {}
            changed = sorted(set(before) ^ set(key.data) | {f for f in before if key.data.get(f) != before[f]})
            what = f"{changed[0]} has other bytes" if changed else "the data it read changed"
            return f"{what} than when {when}"
        return None

    def lineage_cache(self, key: RowKey) -> tuple[Path, list[str]] | None:
        """The response cache of a finished row of the same lineage that ran the most of this key's tasks
        (with the same shots), the largest of those; and those tasks (none: its answers are to other
        requests). None when no row of the lineage is stored."""
        found = []
        for entry in self._entries():
            if entry.get("lineage") == key.lineage and isinstance(entry.get("cache"), str):
                db, run = self._inside(entry["cache"]), self._inside(entry["run"])
                if db is not None and db.is_file() and run is not None and is_safe_label(str(entry.get("row"))):
                    found.append((db, shared_tasks(run / entry["row"], key.tasks)))
        return max(found, key=lambda pair: (len(pair[1]), pair[0].stat().st_size), default=None)

    def remember(self, key: RowKey, row_dir: Path, db: Path) -> None:
        """Point the key at a row just finished in this output folder."""
        relative = row_dir.relative_to(self.root)
        entry = {"key": key.key, "lineage": key.lineage, "apart_from_data": key.apart_from_data, "data": key.data,
                 "links": key.links, "run": relative.parent.as_posix(), "row": row_dir.name,
                 "cache": db.relative_to(self.root).as_posix()}
        atomic_write_text(self.folder / f"{key.key}.json", json.dumps(entry, indent=1))


def _moved_link(before, now: dict[str, str]) -> tuple[str, str, str] | None:
    """(link, its target then, its target now) of the first data link that points elsewhere than it did."""
    before = before if isinstance(before, dict) else {}
    return next(((link, before[link], target) for link, target in sorted(now.items())
                 if link in before and before[link] != target), None)


def copy_row(source: Path, target: Path, reused_from: str) -> None:
    """Copy a finished row's files into ``target`` (a fresh partial folder); its timing.json gains
    ``reused_from`` (latency and counts stay the original's). The source is only read."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, symlinks=True)
    timing = parse_json(target / TIMING)
    timing["reused_from"] = reused_from
    write_timing(target, timing)


def seed_cache(source: Path, target: Path) -> bool:
    """Copy a response cache (sqlite's backup: consistent, the source opened read-only) to ``target``,
    which must not exist yet; whether it was copied (an unreadable source is skipped: nothing reused)."""
    partial = target.with_name(f".{target.name}.seeding")
    partial.unlink(missing_ok=True)
    try:
        with closing(sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)) as reading, \
                closing(sqlite3.connect(partial)) as writing:
            reading.backup(writing)
    except sqlite3.Error:
        partial.unlink(missing_ok=True)
        return False
    os.replace(partial, target)
    return True


def shared_tasks(row_dir: Path, tasks: dict[str, int]) -> list[str]:
    """Those of ``tasks`` (lm-eval task or group -> shots) that the finished row in ``row_dir`` evaluated
    with the same shots, as its results files record them: the tasks whose requests its cache can hold."""
    ran: dict[str, object] = {}
    for path in results_files(row_dir):
        results = read_json(path)
        shots = results.get("n-shot") if isinstance(results.get("n-shot"), dict) else {}
        subtasks = results.get("group_subtasks") if isinstance(results.get("group_subtasks"), dict) else {}
        for name in results.get("results") or {}:
            leaf = name
            for _ in range(16):  # a group's shots are its first task's (lm-eval records them per task)
                if leaf in shots or not subtasks.get(leaf):
                    break
                leaf = subtasks[leaf][0]
            ran[name] = shots.get(leaf)
    return [task for task, wanted in tasks.items() if task in ran and ran[task] == wanted]


def record_reuse(run_dir: Path, label: str, record: dict[str, str]) -> None:
    """Note in the run's reused.json what one row took from another run (written atomically)."""
    path = run_dir / REUSED
    try:
        reused = parse_json(path)
    except (OSError, ValueError):
        reused = {}
    reused[label] = record
    atomic_write_text(path, json.dumps(reused, indent=1, sort_keys=True))
