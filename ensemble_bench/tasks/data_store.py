"""The local copies of the benchmarks' test sets on disk, built from :mod:`.offline_data`.

Layout: ``<cache_dir()>/data/<hub id>/<config>/<split>.jsonl`` plus a ``README.md`` whose YAML front
matter lists the configs, so ``datasets.load_dataset("<that dir>", "<config>")`` works offline.
Each dataset is written into a temporary sibling directory, gets its ``.complete`` marker last (the
layout version and every file's SHA-256), and is then moved into place with ``os.replace``. A
directory without a current marker, or with a file missing or changed since, is rebuilt; files are
hashed again only when their ``stat`` changed (cache.verified).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from pathlib import Path

import yaml

from ensemble_bench.cache import atomic_folder, cache_dir, file_sha256, record_stamp, verified
from ensemble_bench.errors import UserError
from ensemble_bench.tasks import Benchmark, get_benchmark
from ensemble_bench.tasks.offline_data import LOCAL_DATASETS, Configs, LocalDataset, Rows, packaged

MARKER = ".complete"
# Bump when the layout or the row conversion changes: older copies are then rebuilt.
LAYOUT_VERSION = 2  # 2: the marker lists every file's SHA-256
log = logging.getLogger(__name__)


def data_root() -> Path:
    """Where the local datasets live: ``<cache_dir()>/data``."""
    return cache_dir() / "data"


def _stamp(spec: LocalDataset) -> str:
    """The first line of the marker of a complete copy of ``spec``; a different line means rebuild."""
    return f"ensbench local dataset v{LAYOUT_VERSION}: {spec.hub_id} from {spec.source}\n"


def _manifest(folder: Path) -> dict[str, str]:
    """The SHA-256 of every file of a copy (stamped, so that reading it back costs a ``stat`` per file)."""
    digests = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        digests[path.relative_to(folder).as_posix()] = digest = file_sha256(path)
        record_stamp(path, digest)
    return digests


def is_complete(spec: LocalDataset, root: Path) -> bool:
    """Whether ``root/<hub id>`` holds a finished copy built by this version of the code, every file
    of it unchanged since (a damaged copy is logged: the caller rebuilds it)."""
    folder = root / spec.hub_id
    try:
        first, listed = (folder / MARKER).read_text().split("\n", 1)
    except (OSError, ValueError):
        return False
    if first + "\n" != _stamp(spec):
        return False
    try:
        intact = all(verified(folder / name, digest) for name, digest in json.loads(listed).items())
    except (OSError, ValueError, AttributeError, TypeError):  # a marker whose list is not {file: SHA-256}
        intact = False
    if not intact:
        log.warning("%s: a file of the local dataset is missing or changed; rebuilding it", folder)
    return intact


def _readme(spec: LocalDataset, configs: Configs) -> str:
    """README.md with the YAML front matter that makes ``datasets`` see configs and splits."""
    entries = [
        {"config_name": name,
         "data_files": [{"split": split, "path": f"{name}/{split}.jsonl"} for split in splits]}
        for name, splits in configs.items()
    ]
    front = yaml.safe_dump({"configs": entries}, sort_keys=False)
    return (f"---\n{front}---\n# {spec.hub_id} (local copy)\n\n"
            f"Laid out like the hub dataset {spec.hub_id}; built by ensemble_bench from {spec.source}.\n")


def _write_jsonl(path: Path, rows: Rows) -> None:
    """Write ``rows`` as JSON lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        out.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def build_dataset(spec: LocalDataset, root: Path) -> Configs:
    """Build ``spec`` under ``root/<hub id>``: written into a temporary folder, its marker (with every
    file's SHA-256) last, then moved into place."""
    configs = spec.build()
    with atomic_folder(root / spec.hub_id) as staging:
        for name, splits in configs.items():
            for split, rows in splits.items():
                _write_jsonl(staging / name / f"{split}.jsonl", rows)
        (staging / "README.md").write_text(_readme(spec, configs), encoding="utf-8")
        (staging / MARKER).write_text(_stamp(spec) + json.dumps(_manifest(staging)) + "\n")
    return configs


def _summary(configs: Configs) -> str:
    """e.g. ``57 configs, test 14042 / dev 285 / validation 1531 rows``."""
    totals: dict[str, int] = {}
    for splits in configs.values():
        for split, rows in splits.items():
            totals[split] = totals.get(split, 0) + len(rows)
    counts = " / ".join(f"{split} {n}" for split, n in totals.items())
    return f"{len(configs)} config{'s' if len(configs) != 1 else ''}, {counts} rows"


def local_dataset(bench: Benchmark) -> LocalDataset:
    """The local dataset behind ``bench``; UserError if it has none."""
    spec = LOCAL_DATASETS.get(bench.name)
    if spec is None or not bench.offline:
        raise UserError(f"benchmark {bench.name!r} has no offline data: {bench.needs or 'no local source'}")
    return spec


def ensure_offline_data(benchmarks: Iterable[Benchmark]) -> Path:
    """Build the local datasets of ``benchmarks`` that are missing or unfinished; return the root."""
    return ensure_datasets(map(local_dataset, benchmarks))


def ensure_datasets(specs: Iterable[LocalDataset]) -> Path:
    """Build the local datasets ``specs`` that are missing or unfinished; return the root."""
    from rich.console import Console

    console = Console(stderr=True)
    root = data_root()
    for spec in {spec.hub_id: spec for spec in specs}.values():
        if is_complete(spec, root):
            continue
        started = time.perf_counter()
        with console.status(f"building offline data {spec.hub_id} from {spec.source} ..."):
            configs = build_dataset(spec, root)
        seconds = time.perf_counter() - started
        console.print(f"[green]built[/] {spec.hub_id}: {_summary(configs)} ({seconds:.1f}s)")
    return root


def packaged_copy_available(dataset_path: object) -> bool:
    """Whether ``dataset_path`` (a task's) names a packaged dataset this machine can build or has built."""
    spec = packaged(dataset_path) if isinstance(dataset_path, str) else None
    return spec is not None and (spec.missing() is None or is_complete(spec, data_root()))


def copy_layout(spec: LocalDataset, root: Path) -> dict[str, set[str]]:
    """The configs of the built copy of ``spec`` under ``root`` and the splits of each, read from its folders."""
    folder = root / spec.hub_id
    return {config.name: {split.stem for split in config.glob("*.jsonl")}
            for config in sorted(folder.iterdir()) if config.is_dir() and not config.name.startswith(".")}


def nq_questions(count: int) -> list[str]:
    """The first ``count`` NQ-Open validation questions as short QA prompts (for benchmark scripts)."""
    root = ensure_offline_data([get_benchmark("nq")])
    path = root / "google-research-datasets" / "nq_open" / "default" / "validation.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()[:count]]
    return [f"Q: {row['question']}?\nA:" for row in rows]


__all__ = ["MARKER", "build_dataset", "copy_layout", "data_root", "ensure_datasets", "ensure_offline_data",
           "is_complete", "local_dataset", "nq_questions", "packaged_copy_available"]
