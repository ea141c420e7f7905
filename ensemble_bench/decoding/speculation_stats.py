"""What a speculative decoding measures while it runs (decoding/speculative.py): each row's recent
acceptance (``Rate``), the members' forward costs of a proposer step and of a verifier block
(``Costs``), the wall time per token of rounds that draft and of plain rounds (``Pace``), and the
per-row and per-run statistics written to timing.json."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from ensemble_bench.decoding.params import AUTO
from ensemble_bench.decoding.stand_ins import StandIn
from ensemble_bench.decoding.stats import per_request

DECAY = 0.8  # weight of the past in a row's acceptance rate and in the measured costs
PACE_DECAY = 0.8  # weight of the past in the wall time and tokens summed per round (Pace)
BLOCK_SLOPE = 0.1  # a block's extra cost per token over one token, until two widths are measured (CPU: 0.05-0.2)


@dataclass
class Rate:
    """A row's recent rate of drafted tokens taken (each round's observations weigh DECAY times the last's)."""

    taken: float = 0.0
    trials: float = 0.0

    def observe(self, accepted: int, drafted: int, agreed_after: bool) -> None:
        """Drafted tokens taken, the first one refused, and the proposer's agreement at the next position."""
        self.taken = DECAY * self.taken + accepted + (accepted == drafted and agreed_after)
        self.trials = DECAY * self.trials + accepted + 1

    @property
    def value(self) -> float:
        return (self.taken + 1) / (self.trials + 2)


@dataclass
class Costs:
    """Forward seconds (the members' clocks) of one proposer step, and of one round's verifier
    blocks by their width in tokens, each averaged with the same decay; None / empty until measured."""

    step: float | None = None
    blocks: dict[int, float] = field(default_factory=dict)

    @contextmanager
    def timing(self, *members: StandIn, name: str) -> Iterator[None]:
        """Time the members' reads in the block: a proposer ``step`` or the verifiers' ``block``."""
        before = sum(m.member.clock.decode_seconds for m in members)
        calls = [m.calls for m in members]
        yield
        read = [m for m, count in zip(members, calls) if m.calls > count]
        if not read:
            return
        spent = sum(m.member.clock.decode_seconds for m in members) - before
        if name == "step":
            self.step = spent if self.step is None else DECAY * self.step + (1 - DECAY) * spent
            return
        width = max(m.width for m in read)
        old = self.blocks.get(width)
        self.blocks[width] = spent if old is None else DECAY * old + (1 - DECAY) * spent

    def block(self, width: int) -> float:
        """The verifiers' block of ``width`` tokens: measured, else a least-squares line through the
        widths measured, else the one measured width grown by BLOCK_SLOPE per token."""
        if width in self.blocks:
            return self.blocks[width]
        widths, seconds = list(self.blocks), list(self.blocks.values())
        if len(widths) == 1:
            return seconds[0] * max(0.1, 1 + BLOCK_SLOPE * (width - widths[0]))
        mean_w, mean_s = sum(widths) / len(widths), sum(seconds) / len(seconds)
        slope = (sum((w - mean_w) * (t - mean_s) for w, t in zip(widths, seconds))
                 / sum((w - mean_w) ** 2 for w in widths))
        return max(0.1 * min(seconds), mean_s + slope * (width - mean_w))


@dataclass
class Spent:
    """Wall seconds and tokens per row, each summed over rounds with PACE_DECAY on the past."""

    seconds: float = 0.0
    tokens: float = 0.0

    def add(self, seconds: float, tokens: float) -> None:
        self.seconds = PACE_DECAY * self.seconds + seconds
        self.tokens = PACE_DECAY * self.tokens + tokens

    @property
    def per_token(self) -> float:
        return self.seconds / self.tokens


@dataclass
class Pace:
    """Wall seconds per token of each row, by the number of live rows, for rounds that drafted and for
    plain rounds: the rounds' seconds over the tokens a row advanced in them on average, both summed
    with PACE_DECAY on the past (``Spent``). A ratio of sums, not an average of each round's ratio: a
    rejected draft's round (one token in a long round) weighs as one token, not as a whole round. The
    members' clocks (``Costs``) leave out what a round spends besides forward passes (a crop
    re-submitting a vLLM row, the rehearsal and the replay); this is what the user waits for."""

    drafting: dict[int, Spent] = field(default_factory=dict)
    plain: dict[int, Spent] = field(default_factory=dict)

    def observe(self, rows: int, drafted: bool, seconds: float, tokens: int) -> None:
        """A round of ``rows`` live rows that advanced ``tokens`` in all in ``seconds``."""
        paces = self.drafting if drafted else self.plain
        paces.setdefault(rows, Spent()).add(seconds, tokens / rows)

    def drafting_loses(self, rows: int) -> bool:
        """Whether rounds that drafted took longer per token than plain ones, each at this many live rows
        or, where not measured, at the nearest number measured (a batch whose rows finish meets new ones)."""
        if not self.drafting or not self.plain:
            return False
        return nearest(self.drafting, rows) > nearest(self.plain, rows)


class SteadyPace(Pace):
    """A pace on which drafting never loses and plain rounds count as measured from the start, so draft
    lengths follow the members' costs alone: for checks whose rounds must draft whatever the wall clock
    says (``make bench-speculative-check`` compares drafted outputs; tests)."""

    def __init__(self):
        super().__init__(plain={1: Spent(0.0, 1.0)})

    def drafting_loses(self, rows: int) -> bool:
        return False


class SteadyCosts(Costs):
    """Costs fixed as an idle machine measures them (a proposer step a tenth of a one-token block, a
    block 10% dearer per token) and never re-measured: with ``SteadyPace``, the rounds draft the same
    lengths whatever the machine's load (tests of drafted rounds: a loaded CI machine, or members in
    Ray actors whose clocks include the wire, can otherwise price drafting out)."""

    def __init__(self):
        super().__init__(step=0.01, blocks={1: 0.1})

    @contextmanager
    def timing(self, *members: StandIn, name: str) -> Iterator[None]:
        yield


def nearest(paces: dict[int, Spent], rows: int) -> float:
    """The seconds per token at ``rows`` live rows, or at the nearest number measured (the larger of two as near)."""
    return paces[min(paces, key=lambda measured: (abs(measured - rows), -measured))].per_token


@dataclass
class RowRecord:
    """One request's speculative decoding, for its results."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    forwards: list[int] = field(default_factory=list)

    def summary(self) -> dict:
        return {"rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted, "tokens": self.tokens,
                "acceptance_rate": self.accepted / self.drafted if self.drafted else None,
                "tokens_per_round": self.tokens / self.rounds if self.rounds else None,
                "forwards_per_token": [f / self.tokens if self.tokens else None for f in self.forwards]}


@dataclass
class SpeculationStats:
    """The row's speculative decoding: counters summed over its requests (numbers and per-member lists, so
    that a resumed row carries them across its sittings: ``Method.carried``, sittings.py), and each request's
    record (``speculative_rows``, carried too)."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    forwards: list[int] = field(default_factory=list)  # per member: forward passes taken part in
    agreed: list[int] = field(default_factory=list)    # per member: positions where its argmax was the choice
    positions: int = 0
    rows: list[RowRecord] = per_request(RowRecord)

    def add(self, records: Sequence[RowRecord]) -> None:
        """Finished requests into the counters and the records."""
        for record in records:
            self.rounds += record.rounds
            self.drafted += record.drafted
            self.accepted += record.accepted
            self.tokens += record.tokens
            self.forwards = [total + own for total, own in zip(self.forwards, record.forwards)]
        self.rows.extend(records)

    def summary(self, names: Sequence[str], proposer: int | None) -> dict:
        return {"speculative_proposer": AUTO if proposer is None else names[proposer],
                "speculative_acceptance_rate": self.accepted / self.drafted if self.drafted else None,
                "speculative_tokens_per_round": self.tokens / self.rounds if self.rounds else None,
                "speculative_draft_length_mean": self.drafted / self.rounds if self.rounds else None,
                "speculative_forwards_per_token": {n: f / self.tokens if self.tokens else None
                                                   for n, f in zip(names, self.forwards)},
                "speculative_agreement": {n: a / self.positions if self.positions and proposer in (None, m) else None
                                          for m, (n, a) in enumerate(zip(names, self.agreed))},  # counted members
                "speculative_rows": [r.summary() for r in self.rows]}
