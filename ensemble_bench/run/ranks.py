"""lm-eval's own data parallelism: ``torchrun`` or ``accelerate launch`` start N processes of
``ensbench-lm-eval``; each holds a whole copy of the ensemble and answers the requests of its rank (lm-eval
gives rank r the documents r, r + N, r + 2N, ... of every task), and rank 0 gathers the metrics and samples
and writes the files.

The launcher's environment says which rank a process is (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``). A
member on ``cuda:i`` runs on ``cuda:(LOCAL_RANK x G + i)``, G being the number of GPUs one copy of the
ensemble uses, so the ranks of a node take GPUs of their own. The ranks talk over torch.distributed's
gloo backend (CPU tensors and Python objects): only lm-eval's request counts, metrics and samples cross it.

Every rank builds the requests of every document, as one process does, and keeps its own: lm-eval's own
sharding draws each rank's few-shot examples in the rank's document order from the task's one random
sampler, so a rank's prompts would differ from one process's (GSM8K's five shots do). The prompts,
samples and metrics then equal one process's, at batch 1 (a rank batches its own documents: at a larger
batch the padding of a row, and the last bits of its scores, can differ). Two exceptions, both lm-eval's
or a sampled request's: lm-eval evens the ranks' request counts by passing a rank's last request again,
and appends the copies' answers to that request's (a metric over all of a request's samples, pass@k,
counts them); and a sampled request's repeat index counts the same prompt and settings over the rank's
requests, not the whole task's, so two documents with one prompt on two ranks draw alike.

Members on one copy's own terms only: a member placed by ``device_map``, one on another backend than
transformers (vLLM starts its own torch.distributed workers) and Ray placement (``replicas``) are refused
under a launcher, in one line.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from datetime import timedelta

from ensemble_bench.errors import EnvironmentFault, UserError
from ensemble_bench.members.backends import DEFAULT
from ensemble_bench.recipe import Recipe

CUDA = re.compile(r"^cuda(?::(\d+))?$")
USE_REPLICAS = "use one process with placement replicas (--model_args {\"replicas\": N}) instead"


@dataclass(frozen=True)
class Ranks:
    """Where this process stands among the launcher's processes."""

    rank: int
    world_size: int
    local_rank: int


def launched(environ=None) -> Ranks | None:
    """The ranks a launcher set in the environment, or None for a process on its own (WORLD_SIZE unset or 1)."""
    environ = os.environ if environ is None else environ
    if environ.get("WORLD_SIZE", "1") == "1":
        return None
    values = {}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        text = environ.get(key, "0" if key == "LOCAL_RANK" else None)
        if text is None or not text.isdigit():
            raise EnvironmentFault(f"{key}={text!r}: a launcher's rank must be a whole number (WORLD_SIZE is "
                                   f"{environ['WORLD_SIZE']!r}); unset WORLD_SIZE to run one process")
        values[key] = int(text)
    ranks = Ranks(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"])
    if not 0 <= ranks.rank < ranks.world_size:
        raise EnvironmentFault(f"RANK={ranks.rank} is outside WORLD_SIZE={ranks.world_size}")
    return ranks


def refuse_recipe_run(environ=None) -> None:
    """``ensbench run`` is one process: under a launcher each rank would run the whole recipe into one folder."""
    ranks = launched(environ)
    if ranks is not None:
        raise UserError(f"ensbench run under a launcher (WORLD_SIZE={ranks.world_size}): run it as one process; its "
                        "copies of the ensemble are placement: {kind: ray, replicas: N} (lm-eval's ranks are for "
                        "ensbench-lm-eval)")


def placed_on_rank(recipe: Recipe, ranks: Ranks, gpus: int | None = None) -> Recipe:
    """The recipe as this rank's copy of the ensemble runs it: its members' GPUs shifted past the GPUs of
    the node's lower ranks (``gpus``: the GPUs this machine has; torch's count when None)."""
    problem = _refused(recipe)
    if problem:
        raise UserError(f"{problem} under a launcher (WORLD_SIZE={ranks.world_size}): {USE_REPLICAS}")
    used = sorted({_cuda_index(m.device) for m in recipe.members if CUDA.match(m.device)})
    if not used:
        return recipe
    per_copy = used[-1] + 1
    needed = per_copy * (ranks.local_rank + 1)
    gpus = _gpu_count() if gpus is None else gpus
    if needed > gpus:
        raise EnvironmentFault(f"rank {ranks.rank} (local rank {ranks.local_rank}) needs GPUs "
                               f"{per_copy * ranks.local_rank}-{needed - 1} for its copy of the ensemble "
                               f"({per_copy} per copy), but this machine has {gpus}: launch fewer processes per node")
    shift = per_copy * ranks.local_rank
    members = [m.model_copy(update={"device": f"cuda:{_cuda_index(m.device) + shift}"})
               if CUDA.match(m.device) else m for m in recipe.members]
    return recipe.model_copy(update={"members": members})


def _refused(recipe: Recipe) -> str | None:
    if recipe.placement.kind != "local":
        return "placement: ray"
    for member in recipe.members:
        if member.device_map is not None:
            return f"member {member.label}: device_map"
        if member.backend != DEFAULT:
            return f"member {member.label}: backend {member.backend}"
    return None


def _cuda_index(device: str) -> int:
    return int(CUDA.match(device).group(1) or 0)


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


# --- lm-eval's collectives, over gloo ---------------------------------------------------------------------
def connect(ranks: Ranks) -> None:
    """Join the launcher's process group (its MASTER_ADDR and MASTER_PORT), once per process, and have the
    tasks build their requests as one process does (``as_one_process``)."""
    import torch.distributed as dist
    from lm_eval.api.task import Task

    if not dist.is_initialized():  # a rank may wait hours at a barrier for the slowest one (torch's default: 30 min)
        dist.init_process_group("gloo", rank=ranks.rank, world_size=ranks.world_size, timeout=timedelta(days=30))
    if not getattr(Task.build_all_requests, "as_one_process", False):
        Task.build_all_requests = as_one_process(Task.build_all_requests)


def as_one_process(build):
    """lm-eval's ``Task.build_all_requests`` for a rank: every document's requests built in one process's
    order (the few-shot draws with them), then the rank's documents kept (those lm-eval's ``doc_iterator``
    gives the rank: position r, r + N, ...)."""
    @functools.wraps(build)
    def build_all_requests(self, *args, rank: int = 0, world_size: int = 1, **kwargs):
        build(self, *args, rank=0, world_size=1, **kwargs)
        if world_size > 1:
            documents = len({request.doc_id for request in self._instances})
            if documents < world_size:  # every rank sees it: a rank without documents would stop lm-eval's collectives
                raise UserError(f"task {self.config.task}: {documents} document(s) for {world_size} ranks: give each "
                                "rank one at least (a larger --limit, or fewer processes)")
            self._instances = [request for request in self._instances if request.doc_id % world_size == rank]

    build_all_requests.as_one_process = True
    return build_all_requests


def all_gather(tensor):
    """Every rank's ``tensor``, concatenated in rank order (a number from each rank: a vector of them)."""
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)


def gather_object(obj, dst: int = 0) -> list | None:
    """Every rank's ``obj`` on rank ``dst``, in rank order; None on the other ranks."""
    import torch.distributed as dist

    gathered = [None] * dist.get_world_size() if dist.get_rank() == dst else None
    dist.gather_object(obj, gathered, dst=dst)
    return gathered


def barrier() -> None:
    import torch.distributed as dist

    dist.barrier()
