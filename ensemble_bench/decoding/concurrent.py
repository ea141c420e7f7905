"""Members stepping side by side: an ensemble step costs its slowest member, not the sum.

``each(members, call, *per_member)`` is ``[call(m, *args) for m, *args in zip(members, ...)]``,
run on a shared thread pool when the members' forward passes can overlap: remote members (Ray
actors; the thread waits on the network with the GIL released) or local members on different
CUDA devices. Members on the CPU (one shared core pool) or on one device run in a plain loop.
Results come back in member order, and each call touches only its own member, so the outcome
is the same as the loop's; the first error (in member order) is raised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ensemble_bench.members.base import Stepping

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()
_inside = threading.local()


def lane(member: Stepping) -> str:
    """Where a member's forward passes run; members on different lanes can overlap."""
    if member.remote:
        return f"remote:{id(member)}"
    device = str(member.device)
    if device.startswith("cuda"):
        return "cuda:0" if device == "cuda" else device
    return "host"


def overlaps(members: Sequence) -> bool:
    return len({lane(m) for m in members}) > 1


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="ensbench-member")
        return _pool


def _marked(call: Callable) -> Callable:
    def run(*args):
        _inside.active = True
        try:
            return call(*args)
        finally:
            _inside.active = False
    return run


def each(members: Sequence, call: Callable[..., Any], *per_member: Sequence) -> list:
    """``call(member, *args)`` for every member (``args`` from ``per_member``, in member order)."""
    members = list(members)
    if len(members) < 2 or getattr(_inside, "active", False) or not overlaps(members):
        return [call(m, *args) for m, *args in zip(members, *per_member)]
    return list(_shared_pool().map(_marked(call), members, *per_member))
