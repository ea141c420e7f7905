"""What a run's tasks read besides lm-eval itself, found before lm-eval touches any of it.

- **Task files.** Every ``*.yaml`` of an include_path folder is opened by lm-eval's task index, so each
  must be a regular file of bounded size that YAML's limits accept (``yaml_limits``): a named pipe
  would block the index for good, an alias bomb would fill the memory (:func:`task_file_problems`).
- **Task code.** A task YAML's ``!function utils.fn`` imports ``utils.py`` from beside it and runs it
  while the task loads. :func:`task_code` lists those modules (only files inside include_path folders
  count: lm-eval's own tasks and installed modules are code already installed) and names a module
  that is nowhere to be found.
- **Data.** :func:`data_fingerprint` hashes the bytes of every data file and local dataset folder the
  tasks' configs name (``dataset_kwargs.data_files``, a local ``dataset_path``) and records each hub
  dataset's revision, so that a stored row is reused only while its data is the same (row_store).
  Files are hashed streaming (constant memory) and each hash is kept under the cache folder, trusted
  while the file's size, mtime, ctime and inode are unchanged (``content_digest``; row_store hashes
  the files of local model members the same way).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib.util
import json
import logging
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ensemble_bench import settings
from ensemble_bench.yaml_limits import GuardedLoader, RecipeLimit

MAX_TASK_YAML_BYTES = 8 << 20  # 8 MiB; lm-eval's largest task YAML is a few hundred KiB
IGNORED_DIRS = {"__pycache__", ".ipynb_checkpoints"}  # as lm-eval's index skips them
LOCAL_BUILDERS = frozenset({"json", "csv", "parquet", "text", "arrow", "pandas", "sql", "webdataset"})
DIGESTS = "file-digests"  # under the cache folder: one stamp per hashed file
LONG_HASH_BYTES = 1 << 30  # a file this large takes a second or more to hash: one line says so

log = logging.getLogger(__name__)


# --- task files -------------------------------------------------------------------------------------
def yaml_files(folder: Path) -> list[Path]:
    """The ``*.yaml`` paths of ``folder`` that lm-eval's task index opens, sorted as it sorts them."""
    return sorted((p for p in folder.glob("**/*.yaml") if not IGNORED_DIRS & set(p.parts)), key=Path.as_posix)


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    for test, name in ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


class _TaskLoader(GuardedLoader):
    """A task YAML as data, limits enforced; ``!function x.y`` and any other tag read as plain values
    (nothing is imported), the ``!function`` references collected."""

    def __init__(self, stream):
        super().__init__(stream)
        self.functions: list[str] = []


def _function(loader: _TaskLoader, node: yaml.Node) -> str:
    reference = str(loader.construct_scalar(node))
    loader.functions.append(reference)
    return reference


def _any_tag(loader: _TaskLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node)
    return loader.construct_sequence(node) if isinstance(node, yaml.SequenceNode) else loader.construct_scalar(node)


_TaskLoader.add_constructor("!function", _function)
_TaskLoader.add_multi_constructor("!", _any_tag)


@dataclass(frozen=True)
class TaskYaml:
    path: Path
    config: Any
    functions: tuple[str, ...]  # the !function references, as written


def read_task_yaml(path: Path) -> TaskYaml:
    """One task YAML read under the limits; ValueError with the reason (one line) when lm-eval must not open
    it (not a regular file, too large, past the YAML limits). A file that cannot be read or parsed is
    given with no config, as lm-eval's index skips it."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # a dangling link, no permission: lm-eval's index skips what it cannot open; so does this
        return TaskYaml(path, None, ())
    if (kind := _kind(mode)) is not None:
        raise ValueError(f"is {kind}, not a YAML file")
    try:
        with open(path, "rb") as handle:
            text = handle.read(MAX_TASK_YAML_BYTES + 1)
    except OSError:
        return TaskYaml(path, None, ())
    if len(text) > MAX_TASK_YAML_BYTES:
        raise ValueError(f"is larger than {MAX_TASK_YAML_BYTES >> 20} MiB, the most a task YAML may have")
    try:
        loader = _TaskLoader(text)
    except yaml.YAMLError:  # not UTF-8: lm-eval's own index skips a file it cannot read; so does this one
        return TaskYaml(path, None, ())
    try:
        config = loader.get_single_data()
    except RecipeLimit as err:
        raise ValueError(f"line {err.problem_mark.line + 1}: {err.problem}") from None
    except (yaml.YAMLError, ValueError, RecursionError):
        config = None
    finally:
        loader.dispose()
    return TaskYaml(path, config, tuple(loader.functions))


def task_file_problems(folders: Iterable[Path]) -> list[str]:
    """One line per task YAML of the include_path folders that lm-eval must not open: not a regular file
    (a pipe, a socket, a device), larger than MAX_TASK_YAML_BYTES, or past YAML's limits."""
    lines = []
    for folder in folders:
        for path in yaml_files(folder):
            try:
                read_task_yaml(path)
            except ValueError as err:
                lines.append(f"include_path: '{path}' {err}: remove it or move it out of the folder")
    return lines


# --- task code --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskCode:
    module: Path  # the Python file a !function imports
    task_yaml: Path  # the YAML naming it
    reference: str  # as written: utils.process_docs


def _included(path: Path, seen: set[Path]) -> Iterator[TaskYaml]:
    """The task YAML at ``path`` and the ones it includes (``include:``, relative to it)."""
    path = path.resolve()
    if path in seen:
        return
    seen.add(path)
    try:
        found = read_task_yaml(path)
    except ValueError:
        return  # task_file_problems names it
    yield found
    included = found.config.get("include") if isinstance(found.config, dict) else None
    for name in included if isinstance(included, list) else [included] if included else []:
        if isinstance(name, str):
            yield from _included(Path(name) if Path(name).is_absolute() else path.parent / name, seen)


def _resolve_function(reference: str, task_yaml: Path) -> Path | str | None:
    """Where ``!function reference`` comes from, as lm-eval resolves it: a file beside the YAML (its
    path), an installed module (its name), or nowhere (None)."""
    module, _, _ = reference.rpartition(".")
    if not module:
        return None
    beside = (task_yaml.parent / f"{module.replace('.', '/')}.py").resolve()
    if beside.is_file():
        return beside
    try:
        return module if importlib.util.find_spec(module) is not None else None
    except (ImportError, ValueError):
        return None


def task_code(task_yamls: Iterable[Path], folders: Iterable[Path]) -> tuple[list[TaskCode], list[str]]:
    """The modules that the ``!function`` entries of ``task_yamls`` (and their includes) import from the
    include_path ``folders``, and one line per reference to a module found nowhere."""
    inside = [folder.resolve() for folder in folders]
    seen: set[Path] = set()
    code: dict[Path, TaskCode] = {}
    missing = []
    for start in task_yamls:
        for found in _included(start, seen):
            for reference in found.functions:
                where = _resolve_function(reference, found.path)
                if where is None:
                    missing.append(f"'{found.path}': !function {reference}: no module "
                                   f"{reference.rpartition('.')[0] or reference!r} beside it nor installed")
                elif isinstance(where, Path) and any(where.is_relative_to(folder) for folder in inside):
                    code.setdefault(where, TaskCode(where, found.path, reference))
    return sorted(code.values(), key=lambda c: str(c.module)), missing


# --- data -------------------------------------------------------------------------------------------
def _stamp_file(path: Path) -> Path:
    return settings.cache_root() / DIGESTS / f"{hashlib.sha256(str(path).encode()).hexdigest()[:40]}.json"


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def content_digest(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in blocks (constant memory); kept in the cache folder and
    trusted while the file's size, mtime, ctime and inode stay as they were (ctime changes on any write
    and cannot be set back, so rewritten bytes with their mtime restored are hashed again). A file of
    LONG_HASH_BYTES or more is announced in one line when it is hashed (model weights: GBs)."""
    from ensemble_bench.cache import atomic_write_text, file_sha256

    path = path.resolve()
    before = _identity(path.stat())
    stamp = _stamp_file(path)
    try:
        kept = json.loads(stamp.read_text())
        if kept["path"] == str(path) and kept["identity"] == before:
            return kept["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if before[0] >= LONG_HASH_BYTES:
        log.warning("hashing %s (%.1f GB) once, for the row keys: its digest is kept until the file changes",
                    path, before[0] / 1e9)
    digest = file_sha256(path)
    if _identity(path.stat()) == before:  # not written while it was read
        with contextlib.suppress(OSError):  # a read-only cache: hashed again next time
            atomic_write_text(stamp, json.dumps({"path": str(path), "identity": before, "sha256": digest}))
    return digest


def _files_under(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and not IGNORED_DIRS & set(p.parts))


def _named_files(data_files: Any, data_dir: Any) -> list[str]:
    """The paths or glob patterns that a datasets builder's ``data_files`` / ``data_dir`` name."""
    if isinstance(data_files, dict):
        named = [p for value in data_files.values() for p in _named_files(value, None)]
    elif isinstance(data_files, (list, tuple)):
        named = [p for p in data_files if isinstance(p, str)]
    else:
        named = [data_files] if isinstance(data_files, str) else []
    return named + ([data_dir] if isinstance(data_dir, str) else [])


def _expand(named: str) -> list[Path]:
    """One named path as datasets reads it: relative to the working folder, globs expanded."""
    path = Path(named).expanduser()
    if glob.has_magic(named):
        return [Path(p) for p in sorted(glob.glob(str(path), recursive=True))]
    return [path]


def hub_revision(dataset: str, revision: str | None) -> str | None:
    """The commit a hub dataset is read at: the one the config pins, else the cached snapshot's (the
    ``refs`` file of the hub cache), else None (not cached: whatever the hub serves when it runs)."""
    if revision:
        return revision
    import huggingface_hub.constants

    refs = Path(huggingface_hub.constants.HF_HUB_CACHE) / f"datasets--{dataset.replace('/', '--')}" / "refs" / "main"
    try:
        return refs.read_text().strip() or None
    except OSError:
        return None


def data_fingerprint(configs: Iterable[dict]) -> dict[str, Any]:
    """What the task configs read: ``files`` (path -> SHA-256 of its bytes, or ``missing``) and ``hub``
    ([dataset, config, revision], sorted)."""
    files: dict[str, str] = {}
    hub: set[tuple[str, str, str]] = set()
    for cfg in configs:
        dataset = cfg.get("dataset_path")
        kwargs = cfg.get("dataset_kwargs") if isinstance(cfg.get("dataset_kwargs"), dict) else {}
        if not isinstance(dataset, str):
            continue
        if dataset in LOCAL_BUILDERS:
            paths = [p for named in _named_files(kwargs.get("data_files"), kwargs.get("data_dir"))
                     for p in _expand(named)]
        elif Path(dataset).expanduser().exists():
            paths = [Path(dataset).expanduser()]
        else:
            hub.add((dataset, str(cfg.get("dataset_name")), str(hub_revision(dataset, kwargs.get("revision")))))
            continue
        for named in paths:
            for path in _files_under(named) if named.exists() else [named]:
                key = str(path.resolve())
                files[key] = content_digest(path) if path.is_file() else "missing"
    return {"files": dict(sorted(files.items())), "hub": sorted(hub)}


__all__ = ["TaskCode", "content_digest", "data_fingerprint", "hub_revision", "read_task_yaml", "task_code",
           "task_file_problems", "yaml_files"]
