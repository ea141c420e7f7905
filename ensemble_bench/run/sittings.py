"""A row's statistics carried across the sittings of a resumed run.

A request answered from the response cache is not computed again, so the method never counts it: a
resumed row's ``timing.json`` used to hold only its last sitting (a GaC row whose answers were all
cached showed 0 tokens). After every chunk of answers the runner writes the method's accumulators
(``Method.carried``: dataclasses of counters and sums of seconds) beside the response cache; a later
sitting of the row joins them into its fresh accumulators before it computes anything, so its statistics
are those of the whole row. A counter adds to the earlier sittings'; one marked ``peak`` keeps the larger;
a list of request records (``per_request``) gets the earlier sittings' records in front of this one's:
batches are cached whole (lm.cache_chunk), so a resumed row computes the batches the earlier sittings did
not, in the order an uninterrupted row computes them (decoding/stats.py).
The file belongs to the cache: without the cache it is not read.

A chunk's answers are committed to the cache before its statistics are written: a process killed in
between leaves that chunk's answers cached but uncounted (never counted twice).
"""

from __future__ import annotations

import json
import logging
import operator
from collections.abc import Callable
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path

from ensemble_bench.cache import atomic_write_text
from ensemble_bench.decoding.stats import JOINED, RECORD
from ensemble_bench.run.folder import parse_json, sittings_file

log = logging.getLogger(__name__)


def _countable(value) -> bool:
    """A number (not a bool), or a list of them."""
    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    return number(value) or (isinstance(value, list) and all(number(v) for v in value))


def _rules(holder) -> dict[str, Callable]:
    """How each carried counter of a holder joins the earlier sittings' (public fields of numbers or lists of
    numbers, not ``per_request`` records): added, or the larger kept (``peak``)."""
    rules = {f.name: f.metadata.get(JOINED, operator.add) for f in fields(holder) if not f.name.startswith("_")}
    return {name: rule for name, rule in rules.items() if rule is not None and _countable(getattr(holder, name))}


def _record_types(holder) -> dict[str, type]:
    """The holder's lists of request records (``per_request``), by field, with their record type."""
    return {f.name: f.metadata[RECORD] for f in fields(holder) if RECORD in f.metadata}


def _plain(record) -> dict:
    """A request record (a dataclass or a named tuple) as JSON fields."""
    return asdict(record) if is_dataclass(record) else record._asdict()


def snapshot(holders: dict[str, object]) -> dict[str, dict]:
    """The carried counters and request records of every holder (a dataclass of counters, decoding/stats.py)."""
    return {key: {**{name: getattr(holder, name) for name in _rules(holder)},
                  **{name: [_plain(r) for r in getattr(holder, name)] for name in _record_types(holder)}}
            for key, holder in holders.items() if is_dataclass(holder)}


def _records(kind: type, saved) -> list | None:
    """The earlier sittings' records of type ``kind``, or None when they do not read as such."""
    if not isinstance(saved, list) or not all(isinstance(r, dict) for r in saved):
        return None
    try:
        return [kind(**r) for r in saved]
    except TypeError:
        return None


def add_into(holders: dict[str, object], saved: dict) -> None:
    """Join the counters of earlier sittings into the fresh holders (element by element for lists)."""
    for key, holder in holders.items():
        earlier = saved.get(key) if isinstance(saved, dict) else None
        if not isinstance(earlier, dict) or not is_dataclass(holder):
            continue
        for name, join in _rules(holder).items():
            value, before = getattr(holder, name), earlier.get(name)
            if isinstance(value, list) and isinstance(before, list) and len(before) == len(value) and \
                    _countable(before):
                setattr(holder, name, [join(a, b) for a, b in zip(value, before)])
            elif not isinstance(value, list) and not isinstance(before, list) and _countable(before):
                setattr(holder, name, join(value, before))
        for name, kind in _record_types(holder).items():
            records = _records(kind, earlier.get(name))
            if records is not None:
                setattr(holder, name, records + getattr(holder, name))


def resume_counts(holders: dict[str, object], db: Path) -> None:
    """Before a row computes anything: add the earlier sittings' counters when its cache holds their
    answers; a statistics file without its cache is removed (its answers are computed, and counted, anew)."""
    path = sittings_file(db)
    if not db.exists():
        path.unlink(missing_ok=True)
        return
    try:
        saved = parse_json(path)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as err:
        log.warning("%s: damaged (%s): the row's statistics count this sitting only", path, type(err).__name__)
        return
    add_into(holders, saved)


def save_counts(holders: dict[str, object], db: Path) -> None:
    """After a chunk's answers are cached: the counters so far (earlier sittings included)."""
    atomic_write_text(sittings_file(db), json.dumps(snapshot(holders)))
