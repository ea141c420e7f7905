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

import functools
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


def saved_counts(db: Path) -> dict:
    """The earlier sittings' counters of a row (``snapshot``'s form), when its cache holds their answers; a
    statistics file without its cache is removed (its answers are computed, and counted, anew)."""
    path = sittings_file(db)
    if not db.exists():
        path.unlink(missing_ok=True)
        return {}
    try:
        saved = parse_json(path)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        log.warning("%s: damaged (%s): the row's statistics count this sitting only", path, type(err).__name__)
        return {}
    return saved if isinstance(saved, dict) else {}


def resume_counts(holders: dict[str, object], db: Path) -> None:
    """Before a row computes anything: add the earlier sittings' counters (``saved_counts``)."""
    add_into(holders, saved_counts(db))


def save_counts(holders: dict[str, object], db: Path) -> None:
    """After a chunk's answers are cached: the counters so far (earlier sittings included)."""
    write_counts(snapshot(holders), db)


def write_counts(counts: dict, db: Path) -> None:
    """A row's counters so far, in ``snapshot``'s form, beside its response cache."""
    atomic_write_text(sittings_file(db), json.dumps(counts))


# --- the replicas of a row (run/replicas.py): their counters joined as one process would hold them -----------
def joins(holders: dict[str, object]) -> dict[str, dict[str, str]]:
    """How each carried field of each holder joins another part's: "add", "max" (``peak``) or "records"."""
    return {key: {**{name: "max" if rule is max else "add" for name, rule in _rules(holder).items()},
                  **dict.fromkeys(_record_types(holder), "records")}
            for key, holder in holders.items() if is_dataclass(holder)}


def _join(rule: str, a, b):
    join = max if rule == "max" else operator.add
    return [join(x, y) for x, y in zip(a, b)] if isinstance(a, list) else join(a, b)


def joined(how: dict[str, dict[str, str]], parts: list[dict], records: dict[str, dict[str, list]]) -> dict:
    """One snapshot of several parts' counters (earlier sittings, each replica), in ``snapshot``'s form:
    numbers added (element by element for lists) or the largest kept; the request records are ``records``,
    put in request order by the caller."""
    found: dict[str, dict] = {}
    for key, fields_ in how.items():
        found[key] = {}
        for name, rule in fields_.items():
            if rule == "records":
                found[key][name] = records.get(key, {}).get(name, [])
                continue
            values = [part[key][name] for part in parts
                      if isinstance(part.get(key), dict) and _countable(part[key].get(name))]
            if values:
                found[key][name] = functools.reduce(functools.partial(_join, rule), values)
    return found


def overwrite(holders: dict[str, object], counts: dict) -> None:
    """Set the holders' carried counters and records to ``counts`` (``snapshot``'s form)."""
    for key, holder in holders.items():
        given = counts.get(key) if is_dataclass(holder) else None
        if not isinstance(given, dict):
            continue
        for name in _rules(holder):
            if _countable(given.get(name)):
                setattr(holder, name, given[name])
        for name, kind in _record_types(holder).items():
            records = _records(kind, given.get(name))
            if records is not None:
                setattr(holder, name, records)


def record_counts(holders: dict[str, object]) -> dict[str, dict[str, int]]:
    """How many request records each holder's ``per_request`` lists hold now."""
    return {key: {name: len(getattr(holder, name)) for name in _record_types(holder)}
            for key, holder in holders.items() if is_dataclass(holder)}


def records_since(holders: dict[str, object], counts: dict[str, dict[str, int]]) -> dict[str, dict[str, list]]:
    """The request records added since ``record_counts`` gave ``counts``, as JSON fields."""
    return {key: {name: [_plain(r) for r in getattr(holder, name)[counts[key][name]:]] for name in fields_}
            for key, fields_ in counts.items() for holder in [holders[key]]}


def counters(holders: dict[str, object]) -> dict[str, dict]:
    """``snapshot`` without the request records."""
    return {key: {name: getattr(holder, name) for name in _rules(holder)}
            for key, holder in holders.items() if is_dataclass(holder)}
