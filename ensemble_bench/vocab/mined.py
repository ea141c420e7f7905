"""MinED: each token of a reference vocabulary -> the nearest token of another vocabulary
(PackLLM, Mavromatis et al., arXiv 2404.11531: its tokenizer selection and alignment; section
and equation numbers not checked against the PDF).

For every reference token the member's token with exactly the same text, otherwise the member's
token at the least edit distance. Text is compared as bytes (vocab/bytes_view.py): for the
byte-level BPE vocabularies the paper's models use, the edit distance of raw token strings is the
edit distance of bytes (one character per byte, the space mark swapped as the paper's code does).
Ties go to the member's lowest id (the paper's code takes the first in dictionary order).

Tokens are matched within their role, so that "stop" stays "stop": stop ids with the member's
stop ids, other special tokens with its other special tokens (by their literal text), text tokens
with its text tokens. A reference id without text, or whose role the member lacks, maps to -1.

Maps are cached on disk (``cached_mined_map``, the convention of vocab/cache.py), keyed by both
vocabularies' fingerprints.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np
import torch
from rapidfuzz import process
from rapidfuzz.distance import Levenshtein

from ensemble_bench.vocab.bytes_view import VocabView
from ensemble_bench.vocab.cache import MapFormat, load_or_build, map_path
from ensemble_bench.vocab.union import vocab_fingerprint

VERSION = "mined-1"  # part of the file's key: a new rule or layout never reads an old file
CHUNK = 128          # reference tokens per block of edit distances (CHUNK x member tokens int32)


def nearest(queries: Sequence[bytes], choices: Sequence[bytes]) -> list[int]:
    """Index into ``choices`` of each query's exact match (the first), else of the first choice at
    the least Levenshtein distance over bytes; -1 when there are no choices."""
    if not choices:
        return [-1] * len(queries)
    exact: dict[bytes, int] = {}
    for index, choice in enumerate(choices):
        exact.setdefault(choice, index)
    found = [exact.get(q, -1) for q in queries]
    missing = [k for k, f in enumerate(found) if f < 0]
    spelled = [c.decode("latin-1") for c in choices]  # one character per byte
    for start in range(0, len(missing), CHUNK):
        block = missing[start:start + CHUNK]
        distances = process.cdist([queries[k].decode("latin-1") for k in block], spelled,
                                  scorer=Levenshtein.distance, dtype=np.int32, workers=1)
        for k, best in zip(block, distances.argmin(axis=1).tolist()):  # argmin: the first of the least
            found[k] = best
    return found


def roles(view: VocabView, stop_ids: Sequence[int]) -> dict[str, list[int]]:
    """The ids with text in each role, ascending: stop, other special, text."""
    stops = set(stop_ids)
    grouped: dict[str, list[int]] = {"stop": [], "special": [], "text": []}
    for token_id, piece in enumerate(view.pieces):
        if token_id in stops:
            grouped["stop"].append(token_id)
        elif piece is None:
            continue
        elif token_id in view.special_ids:
            grouped["special"].append(token_id)
        else:
            grouped["text"].append(token_id)
    return grouped


def mined_map(reference: VocabView, reference_stops: Sequence[int],
              member: VocabView, member_stops: Sequence[int]) -> torch.Tensor:
    """[reference.size] member id of each reference id, -1 where none (see the module docstring)."""
    out = torch.full((reference.size,), -1, dtype=torch.long)
    if vocab_fingerprint(reference, reference_stops) == vocab_fingerprint(member, member_stops):
        with_text = [i for i, piece in enumerate(reference.pieces) if piece is not None or i in reference_stops]
        out[with_text] = torch.tensor(with_text, dtype=torch.long)  # the same vocabulary: every id itself
        return out
    theirs = roles(member, member_stops)
    for role, ours in roles(reference, reference_stops).items():
        choices = theirs[role]
        picked = nearest([reference.pieces[i] or b"" for i in ours], [member.pieces[i] or b"" for i in choices])
        for token_id, index in zip(ours, picked):
            out[token_id] = choices[index] if index >= 0 else -1
    return out


def mined_path(reference: VocabView, reference_stops: Sequence[int], member: VocabView,
               member_stops: Sequence[int], folder: Path) -> Path:
    return map_path(folder, "mined", VERSION, [vocab_fingerprint(reference, reference_stops),
                                               vocab_fingerprint(member, member_stops)])


def mined_from_tensor(saved: object, reference_size: int, member_size: int) -> torch.Tensor:
    """A loaded cache file as a map from ``reference_size`` ids to member ids (or -1); ValueError when it is not one."""
    fits = (isinstance(saved, torch.Tensor) and saved.dtype == torch.long and saved.shape == (reference_size,)
            and (reference_size == 0 or int(saved.min()) >= -1 and int(saved.max()) < member_size))
    if not fits:
        raise ValueError("the cached map does not fit the vocabularies")
    return saved


def cached_mined_map(reference: VocabView, reference_stops: Sequence[int], member: VocabView,
                     member_stops: Sequence[int], folder: Path) -> torch.Tensor:
    """``mined_map``, read from ``folder`` when built before (vocab/cache.py); a file that does not fit is rebuilt."""
    kind = MapFormat("MinED", lambda built: built,
                     partial(mined_from_tensor, reference_size=reference.size, member_size=member.size))
    return load_or_build(mined_path(reference, reference_stops, member, member_stops, folder), kind,
                         lambda: mined_map(reference, reference_stops, member, member_stops))
