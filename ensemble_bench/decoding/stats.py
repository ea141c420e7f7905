"""A row's run statistics as one typed record: what every method reports (timing, tokens, its
parameters) and what some report (the fraction of steps ensembled, tokens manipulated per step),
with each method's own counters under ``counters``.

Its JSON form (``to_json``) is the flat dict the results files hold, in the row's ``timing.json``
and in the ``ensbench`` section of lm-eval's results: the shared keys, then the counters beside
them. ``from_json`` reads that dict back (any extra key becomes a counter).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

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
    counters: dict[str, Any] = field(default_factory=dict)  # the method's own, JSON values
    label: str | None = None                # the row, its members and its requests answered (written by the
    members: list[str] | None = None        # runner and the lm-eval adapter, not by the method)
    requests_computed: int | None = None
    loglikelihood_ms_per_request: float | None = None  # multiple choice: time to score one option (lm-eval adapter),
    loglikelihood_ms_per_token: float | None = None    # and per token of the options (the first member's tokens)
    requests_scored: int | None = None
    tokens_scored: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The flat dict of the results files (an optional key only when it has a value)."""
        shared = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "counters"}
        return {**{k: v for k, v in shared.items() if not (k in OPTIONAL and v is None)}, **self.counters}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunStats:
        """The record of a results file's dict (``timing.json`` or the ``ensbench`` section)."""
        known = {f.name for f in fields(cls)} - {"counters"}
        return cls(**{"method": "", "params": {}, **{k: v for k, v in data.items() if k in known}},
                   counters={k: v for k, v in data.items() if k not in known})
