"""What a run's tasks read besides lm-eval itself, found before lm-eval touches any of it.

- **Task files.** Every ``*.yaml`` of an include_path folder is opened by lm-eval's task index, so each
  must be a regular file of bounded size that YAML's limits accept (``yaml_limits``): a named pipe
  would block the index for good, an alias bomb would fill the memory (:func:`task_file_problems`).
- **Includes.** :func:`include_chain` follows a task YAML's ``include:`` chain as lm-eval does (links
  resolved, each file once, at most MAX_INCLUDE_DEPTH steps), every file under the same limits; the
  modules their ``!function`` entries import are found by ``tasks/task_code.py``.
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
MAX_INCLUDE_DEPTH = 16  # include: steps from a task YAML to the last file it reaches (lm-eval's tasks use 1-2)
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
    """One line per task YAML of the include_path folders, or file one of them includes, that lm-eval must
    not open: not a regular file (a pipe, a socket, a device), larger than MAX_TASK_YAML_BYTES, past YAML's
    limits, or at the end of an include chain longer than MAX_INCLUDE_DEPTH files."""
    lines: dict[str, None] = {}
    for folder in folders:
        for path in yaml_files(folder):
            try:
                for _ in include_chain(path):
                    pass
            except ValueError as err:
                lines[f"include_path: {err}"] = None
    return list(lines)


def _include_target(including: Path, named: str) -> Path:
    """An ``include:`` as lm-eval's load_yaml follows it: relative to the including file's real folder, an
    absolute one as written; ``~`` expanded and links resolved."""
    target = Path(named) if Path(named).is_absolute() else including.parent / named
    return target.expanduser().resolve()


def include_chain(path: Path) -> Iterator[TaskYaml]:
    """The task YAML at ``path`` (links resolved, as lm-eval reads it) and every file it includes, each
    once, through any number of ``include:`` steps. ValueError (one line naming the file and what to do)
    for a file lm-eval must not open, or a chain of more than MAX_INCLUDE_DEPTH files; a file that cannot
    be read ends its branch (lm-eval skips the task)."""
    seen: set[Path] = set()
    waiting: list[tuple[Path, Path | None]] = [(path.expanduser().resolve(), None)]  # (file, the file including it)
    chain: dict[Path, int] = {}  # file -> how many files lead to it
    while waiting:
        here, parent = waiting.pop()
        depth = 0 if parent is None else chain[parent] + 1
        if here in seen:
            continue
        if depth > MAX_INCLUDE_DEPTH:
            raise ValueError(f"'{path}' includes files through more than {MAX_INCLUDE_DEPTH} include: steps "
                             f"(down to '{here}'): include fewer levels")
        seen.add(here)
        chain[here] = depth
        try:
            found = read_task_yaml(here)
        except ValueError as err:
            where = f"'{path}' {err}: remove it or move it out of the folder" if parent is None else \
                f"'{here}' (included by '{parent}') {err}: remove it or the include: that names it"
            raise ValueError(where) from None
        yield found
        included = found.config.get("include") if isinstance(found.config, dict) else None
        names = included if isinstance(included, list) else [included]
        waiting += [(_include_target(here, name), here) for name in reversed(names) if isinstance(name, str)]


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


def _expand(named: str, base: Path | None = None) -> list[Path]:
    """One named path as datasets reads it: relative to ``base`` (a builder's ``data_dir``) or the working
    folder, globs expanded."""
    path = Path(named).expanduser()
    path = base / path if base is not None and not path.is_absolute() else path
    if glob.has_magic(named):
        return [Path(p) for p in sorted(glob.glob(str(path), recursive=True))]
    return [path]


def _builder_files(kwargs: dict) -> Iterator[tuple[str, list[Path]]]:
    """(as written, the paths it stands for) of each file, pattern or folder a local builder (``json``,
    ``csv``, ...) reads: ``data_files`` relative to ``data_dir`` when one is given, and ``data_dir``."""
    data_dir = kwargs.get("data_dir")
    base = Path(data_dir).expanduser() if isinstance(data_dir, str) else None
    for named in _named_files(kwargs.get("data_files"), None):
        if "://" not in named:  # a URL: read over the network, not a local file
            yield named, _expand(named, base)
    if base is not None:
        yield data_dir, [base]


def _script_of(dataset: str) -> str | None:
    """The dataset script the datasets library finds for ``dataset_path`` (and refuses to run since 4.0):
    the path itself when it ends in ``.py``, or ``<folder>/<folder's name>.py``; None when there is none."""
    parts = [part for part in dataset.replace(os.sep, "/").split("/") if part]
    script = parts[-1] if parts and parts[-1].endswith(".py") else f"{parts[-1]}.py" if parts else None
    if script is None:
        return None
    return dataset if dataset.endswith(script) else os.path.join(dataset, script) \
        if os.path.isfile(os.path.join(dataset, script)) else None


def _odd_files(paths: Iterable[Path]) -> Iterator[tuple[Path, str]]:
    """The paths (or files below them) that are no regular file nor folder, with what they are."""
    for path in paths:
        below = [path, *path.rglob("*")] if path.is_dir() else [path]
        for found in below:
            with contextlib.suppress(OSError):
                if (kind := _kind(found.stat().st_mode)) not in (None, "a folder"):
                    yield found, kind


def data_problems(cfg: dict) -> list[str]:
    """One line per data source of a task config that would stop the run after its models loaded: a local
    data file that is not there (or a pattern that matches nothing), one that is a named pipe, socket or
    device (reading it blocks or never ends), a dataset script as ``dataset_path``."""
    dataset = cfg.get("dataset_path")
    kwargs = cfg.get("dataset_kwargs") if isinstance(cfg.get("dataset_kwargs"), dict) else {}
    if not isinstance(dataset, str):
        return []
    if dataset not in LOCAL_BUILDERS:
        script = _script_of(dataset)
        named = [Path(dataset).expanduser()] if Path(dataset).expanduser().exists() else []
        lines = [f"dataset_path '{dataset}' is a dataset script ({script}), which the datasets library no longer "
                 "runs: give the data as files (dataset_path: json, csv or parquet, with data_files)"] if script else []
    else:
        lines, named = [], []
        for written, paths in _builder_files(kwargs):
            if not any(path.exists() for path in paths):
                what = "no file matches the pattern" if glob.has_magic(written) else "no such file"
                lines.append(f"data file '{written}': {what} (relative paths are read from the working folder, "
                             "or from data_dir): fix data_files in the task YAML")
            named += paths
    lines += [f"data file '{path}' is {kind}, not a file of data: give a regular file" for path, kind in
              _odd_files(p for p in named if p.exists())]
    return lines


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
    """What the task configs read: ``files`` (real path -> SHA-256 of its bytes, or ``missing``), ``hub``
    ([dataset, config, revision], sorted) and ``links`` (a data file's path as named -> its real path,
    where a link leads elsewhere: to say that the link changed, not the file's bytes)."""
    files: dict[str, str] = {}
    links: dict[str, str] = {}
    hub: set[tuple[str, str, str]] = set()
    for cfg in configs:
        dataset = cfg.get("dataset_path")
        kwargs = cfg.get("dataset_kwargs") if isinstance(cfg.get("dataset_kwargs"), dict) else {}
        if not isinstance(dataset, str):
            continue
        if dataset in LOCAL_BUILDERS:
            paths = [path for _, found in _builder_files(kwargs) for path in found]
        elif Path(dataset).expanduser().exists():
            paths = [Path(dataset).expanduser()]
        else:
            hub.add((dataset, str(cfg.get("dataset_name")), str(hub_revision(dataset, kwargs.get("revision")))))
            continue
        for named in paths:
            for path in _files_under(named) if named.exists() else [named]:
                key = str(path.resolve())
                files[key] = content_digest(path) if path.is_file() else "missing"
                if (named_as := os.path.normpath(os.path.abspath(path))) != key:
                    links[named_as] = key
    return {"files": dict(sorted(files.items())), "hub": sorted(hub), "links": dict(sorted(links.items()))}


__all__ = ["content_digest", "data_fingerprint", "data_problems", "hub_revision", "include_chain", "read_task_yaml",
           "task_file_problems", "yaml_files"]
