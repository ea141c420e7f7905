"""A row's run statistics as one typed record: what every method reports (timing, tokens, its
parameters) and what some report (the fraction of steps ensembled, tokens manipulated per step),
with the method's own statistics (``MethodStats``, a dataclass each method declares) apart.

Its JSON form (``to_json``) is the dict the results files hold, in the row's ``timing.json`` and in the
``ensbench`` section of lm-eval's results: the shared keys, then the method's own statistics under the
method's name (``{"method": "gac", ..., "gac": {"union_size": ...}}``), so that no counter of a method can
shadow a shared key. ``from_json`` reads that dict back, and the flat form of runs stored before (the
method's counters beside the shared keys) too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

SHARED = ("ensembled_fraction", "tokens_manipulated_per_step")  # a method's statistics that RunStats shows


@dataclass(frozen=True)
class MethodStats:
    """What a method reports of its own (``Method.statistics``): a dataclass of JSON values that the method
    declares, e.g. GaC's union size and gated steps. A field that is a dict of a shared part's statistics
    (``spread()``: re-tokenisation, speculation) is written out key by key beside the others."""

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            found.update(value if f.metadata.get("spread") else {f.name: value})
        return found


def spread() -> Any:
    """A ``MethodStats`` field holding a shared part's statistics (a dict), written out key by key."""
    return field(default_factory=dict, metadata={"spread": True})


# The accumulators a method's statistics are made from (``Method.carried``) are dataclasses of counters:
# across the sittings of a resumed row (sittings.py) a counter field adds to the earlier sittings' unless
# it is marked as one of these.
JOINED = "joined"  # the field metadata naming how a counter joins the earlier sittings' (None: it does not)


def peak(default: int = 0) -> Any:
    """A counter that is the largest value seen: the earlier sittings' and this one's larger."""
    return field(default=default, metadata={JOINED: max})


RECORD = "record"  # the field metadata naming the type of a list's request records (``per_request``)


def per_request(record: type) -> Any:
    """A list of the requests' records (dataclasses or named tuples of ``record``), in the order computed: a
    resumed row's earlier sittings' records come first, as their batches did (sittings.py)."""
    return field(default_factory=list, metadata={JOINED: None, RECORD: record})

OPTIONAL = ("ensembled_fraction", "tokens_manipulated_per_step", "label", "members", "requests_computed",
            "loglikelihood_ms_per_request", "loglikelihood_ms_per_token", "requests_scored", "tokens_scored")


@dataclass(frozen=True)
class RunStats:
    """One row's statistics. Times in milliseconds; ``decode_ms_per_token`` is decode time per
    decoding step (the papers' ms/token at batch size 1)."""

    method: str
    params: dict[str, Any]
    batch_size: int = 1
    decode_ms_per_token: float | None = None
    time_to_first_token_ms: float | None = None
    first_round_ms_per_token: float | None = None  # a row done in its first round (one span) has no decode step
    tokens_generated: int = 0
    decode_steps: float = 0
    generation_batches: int = 0
    contexts_truncated: dict[str, int] = field(default_factory=dict)  # member -> requests cut from the left
    ensembled_fraction: float | None = None           # steps (or positions) ensembled / all, where a method gates
    tokens_manipulated_per_step: float | None = None  # tokens the combination reads per step (UniTE, DeePEn)
    method_stats: dict[str, Any] = field(default_factory=dict)  # the method's own (MethodStats), JSON values
    label: str | None = None                # the row, its members and its requests answered (written by the
    members: list[str] | None = None        # runner and the lm-eval adapter, not by the method)
    requests_computed: int | None = None
    loglikelihood_ms_per_request: float | None = None  # multiple choice: time to score one option (lm-eval adapter),
    loglikelihood_ms_per_token: float | None = None    # and per token of the options (the first member's tokens)
    requests_scored: int | None = None
    tokens_scored: int | None = None

    @classmethod
    def of_method(cls, shared: dict[str, Any], own: MethodStats | dict[str, Any]) -> RunStats:
        """The record of a method's run: the shared values, and its own statistics, of which those RunStats
        shows (``SHARED``) are taken out into their fields."""
        found = own.to_json() if isinstance(own, MethodStats) else dict(own)
        lifted = {key: found.pop(key) for key in SHARED if key in found}
        return cls(**shared, **lifted, method_stats=found)

    def to_json(self) -> dict[str, Any]:
        """The dict of the results files: the shared keys (an optional key only when it has a value), then
        the method's own statistics under its name (when it has any)."""
        shared = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "method_stats"}
        own = {self.method: self.method_stats} if self.method_stats else {}
        return {**{k: v for k, v in shared.items() if not (k in OPTIONAL and v is None)}, **own}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunStats:
        """The record of a results file's dict (``timing.json`` or the ``ensbench`` section); a run stored in
        the flat form (the method's counters beside the shared keys) reads as well."""
        known = {f.name for f in fields(cls)} - {"method_stats"}
        method = data.get("method", "")
        section = data.get(method) if method not in known and isinstance(data.get(method), dict) else {}
        flat = {k: v for k, v in data.items() if k not in known}
        return cls(**{"method": "", "params": {}, **{k: v for k, v in data.items() if k in known}},
                   method_stats=section if method in data else flat)
