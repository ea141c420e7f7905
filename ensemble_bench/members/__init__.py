"""Members: one model + its tokenizer each, behind one interface (see base.Member)."""

from __future__ import annotations

from ensemble_bench.members.base import Member, Prompt, Score
from ensemble_bench.members.loading import (
    CONVERTING,
    DTYPES,
    QUANTIZATIONS,
    cached_tokenizer,
    load_listener,
    load_member,
    load_tokenizer,
    quantization_config,
    tell_load,
)
from ensemble_bench.members.sources import PACKAGED

__all__ = ["CONVERTING", "DTYPES", "PACKAGED", "QUANTIZATIONS", "LocalMember", "Member", "Prompt", "Score",
           "cached_tokenizer", "load_listener", "load_member", "load_tokenizer", "quantization_config", "tell_load"]


def __getattr__(name: str):
    """``LocalMember`` on first use: importing the package (or members.base) loads no transformers."""
    if name == "LocalMember":
        from ensemble_bench.members.local import LocalMember

        return LocalMember
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
