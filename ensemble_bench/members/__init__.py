"""Members: one model + its tokenizer each, behind one interface (see base.Member). Every name below is
imported on first use, so that importing the backends' declarations (``members.backends``, each
``<name>_backend``) or the packaged model names loads no torch or transformers."""

from __future__ import annotations

import importlib

WHERE = {  # name -> the module defining it
    **dict.fromkeys(("Member", "Prompt", "Score"), "base"),
    **dict.fromkeys(("CONVERTING", "DTYPES", "QUANTIZATIONS", "cached_tokenizer", "load_listener", "load_member",
                     "load_tokenizer", "quantization_config", "tell_load"), "loading"),
    "PACKAGED": "sources",
    "LocalMember": "local",
}

__all__ = sorted(WHERE)


def __getattr__(name: str):
    if name in WHERE:
        return getattr(importlib.import_module(f"{__name__}.{WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
