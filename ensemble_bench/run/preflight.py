"""What would stop a run on this machine, found before any model loads (``run`` and ``run --dry-run``):
members' models (missing files, hub models not cached while offline), optional packages, benchmark
data, a task that samples under a method that cannot, the output and cache folders, the members'
devices, and the network for ``data: hub``."""

from __future__ import annotations

import importlib.util
import socket
import tempfile
from pathlib import Path

from ensemble_bench import settings
from ensemble_bench.errors import UserError, several
from ensemble_bench.members.backends import backend_spec
from ensemble_bench.members.sources import model_problem
from ensemble_bench.methods import method_spec
from ensemble_bench.recipe import Recipe
from ensemble_bench.tasks import get_benchmark, is_builtin

HUB = ("huggingface.co", 443)


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
    import torch  # only for a member on a GPU: a dry run of a CPU recipe loads no torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    problems = []
    for i, device in placed:
        if device.startswith("cuda") and int(device.partition(":")[2] or 0) >= gpus:
            problems.append(f"members[{i}].device: '{device}' is not available (this machine has {gpus} CUDA "
                            "device(s)): use device: cpu or another index")
        elif device == "mps" and not torch.backends.mps.is_available():
            problems.append(f"members[{i}].device: 'mps' is not available on this machine: use device: cpu")
    return problems


def _output_problem(recipe: Recipe, root: Path) -> str | None:
    target = root / recipe.name
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
    lines += _backend_problems(recipe)
    for row in recipe.plan:
        for package, install in method_spec(row.method).packages(row.params).items():
            if not _installed(package):
                lines.append(f"row {row.label}: method '{row.method}' needs the {install} package with these "
                             f"parameters (pip install {install})")
    return lines


def _backend_problems(recipe: Recipe) -> list[str]:
    """The packages the members' backends need (vLLM members: the vllm package)."""
    used = dict.fromkeys(member.backend for member in recipe.members)
    return [f"backend: {name} needs the {package} package ({install})" for name in used
            for package, install in backend_spec(name).packages.items() if not _installed(package)]


def _model_problems(recipe: Recipe) -> list[tuple[type[Exception], str]]:
    """Members (and models a method loads, such as a scorer) that cannot be loaded here (sources.model_problem)."""
    named = [(f"members[{i}].model", member.model) for i, member in enumerate(recipe.members)]
    named += [(f"row {row.label}", model) for row in recipe.plan
              for model in method_spec(row.method).models(row.params)]
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


def preflight(recipe: Recipe, source: str, root: Path, task_lines: list[str]) -> list[str]:
    """What would stop the run on this machine, found before any model is loaded, every problem at
    once: members' models (missing files, hub models not cached while offline), optional packages,
    benchmark data, the recipe's tasks (``task_lines``: ``recipe_tasks.task_preflight``'s, or
    ``include_folders``'s), the output folder ``root`` (``folder.output_root``), the cache folder, the
    members' devices, the network for ``data: hub``. A mistake in the recipe for this machine (a missing
    model file or package) raises one UserError of one line each (with the environment's lines); the
    environment's problems alone are returned, one line each (empty when all is well). ``run/setup.py``
    calls it with the facts it resolved (a bad environment variable was refused before)."""
    models = _model_problems(recipe)
    mistakes = [f"{source}: {line}" for line in (*[line for kind, line in models if kind is UserError],
                                                 *_package_problems(recipe), *_data_problems(recipe), *task_lines)]
    problems = [*[line for kind, line in models if kind is not UserError], _output_problem(recipe, root),
                _cache_problem(), *_device_problems(recipe), _network_problem(recipe)]
    problems = [p for p in problems if p]
    if mistakes:
        raise several(UserError, mistakes + problems)
    return problems
