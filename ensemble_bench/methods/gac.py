"""GaC — "Breaking the Ceiling of the LLM Community by Treating Token Generation as a
Classification for Ensembling" (arXiv 2406.12585).

Each step every member's next-token distribution is projected onto the union vocabulary and
averaged (Eq. 3, weighted as in Sec. 4.3); the chosen union entry's bytes are appended to every
member (Eq. 4; see vocab/append.py for how each member takes them). With a gate model and a
threshold t (Eq. 5) only steps where the gate's top probability is <= t are ensembled; other
steps take the gate's own token and the other members skip the forward pass, catching up in one
call the next time they are needed. KV caches stay warm for every member throughout.

Log-likelihood of a continuation (multiple-choice tasks): each member scores the continuation
with its own tokenisation, and the ensemble's probability is the weighted average of the
members' sequence probabilities, log(sum_i w_i exp(logp_i) / sum_i w_i); it is greedy when it is
greedy for every member. Thresholds do not apply to scoring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import Field, field_validator, model_validator

from ensemble_bench.cache import cache_dir
from ensemble_bench.decoding.concurrent import each
from ensemble_bench.decoding.decode import STOP, Advance, DecodingMethod, RequestState, Round
from ensemble_bench.decoding.feeding import FeedStats, Retokenize, make_feeders
from ensemble_bench.decoding.fused import checked_fusion
from ensemble_bench.decoding.method import (
    Generation,
    GenerationRequest,
    LoglikelihoodRequest,
    WindowParams,
    lead_field,
    resolve_member,
    rolling_with_members,
    score_with_members,
    weights_problem,
)
from ensemble_bench.decoding.sampling import Sampler, decide, decide_on, draw_blocks, rows_of
from ensemble_bench.decoding.speculative import Speculation, SpeculativeParams, SpeculativeSteps, resolve_proposer
from ensemble_bench.decoding.stats import MethodStats, spread
from ensemble_bench.errors import UserError
from ensemble_bench.members.base import Member, Score
from ensemble_bench.methods.core import CoreFusion, CoreParams
from ensemble_bench.vocab.fast_topk import block_argmax
from ensemble_bench.vocab.mixture import UnionMixture
from ensemble_bench.vocab.union import UnionVocab
from ensemble_bench.vocab.union_cache import cached_union

RETIRED = {"temperature": 0.0, "seed": 0}  # GaC's own sampling parameters before decoding/sampling.py, greedy


class GacParams(WindowParams, SpeculativeParams, CoreParams):
    weights: Literal["score", "score_minus_ece"] | list[float] | None = Field(default=None, description=(
        "null or average: equal; score or score_minus_ece: from scores (and ece), Sec. 4.3; or one value per "
        "member (a zero weight keeps a member for the gate only, GaC Table 5)"))
    scores: list[float] | None = Field(default=None, description="per-member benchmark score, for weights: score "
                                       "or score_minus_ece")
    ece: list[float] | None = Field(default=None, description="per-member expected calibration error, for "
                                    "score_minus_ece")
    lead: int | str = lead_field(0, "the member whose decode renders the text; with threshold, the gate of Eq. 5",
                                 "gate")
    threshold: float | None = Field(default=None, ge=0.0, le=1.0, description=(
        "Eq. 5: steps where the lead's top probability exceeds it take the lead's own token; null: every step "
        "is ensembled"))
    retokenize: Retokenize = Field(default="local", description=(
        "how members take the chosen token (docs/retokenize.md): local, as Eq. 4 and the official code"))

    @model_validator(mode="before")
    @classmethod
    def _sampling_moved(cls, data):
        """GaC's own temperature and seed became every method's sampling (docs/sampling.md)."""
        if isinstance(data, dict) and (moved := [key for key in RETIRED if key in data]):
            raise ValueError(f"'{moved[0]}' is no longer a GaC parameter: a row samples when its tasks ask "
                             "(do_sample, temperature) or its entry says so (sampling: {temperature: 0.7}); the "
                             "seed is the recipe's seed (docs/sampling.md)")
        return data

    @model_validator(mode="before")
    @classmethod
    def _gate_needs_a_threshold(cls, data):
        """The paper's ``gate`` names the lead as Eq. 5's gate: it needs a threshold (a stored null is no gate)."""
        if isinstance(data, dict) and "gate" in data:
            if data["gate"] is None:
                return {k: v for k, v in data.items() if k != "gate"}
            if data.get("threshold") is None:
                raise ValueError("a gate needs a threshold (0..1)")
        return data

    @field_validator("weights")
    @classmethod
    def _positive_sum(cls, value):
        if isinstance(value, list) and (problem := weights_problem(value)) is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _consistent(self):
        if self.weights in ("score", "score_minus_ece") and self.scores is None:
            raise ValueError(f"weights '{self.weights}' needs 'scores' (one per member)")
        if self.weights == "score_minus_ece" and self.ece is None:
            raise ValueError("weights 'score_minus_ece' needs 'ece' (one per member)")
        return self


def resolve_weights(params: GacParams, count: int) -> list[float]:
    if isinstance(params.weights, list):
        weights = params.weights
    elif params.weights is None:
        weights = [1.0] * count
    elif params.weights == "score":
        weights = list(params.scores or [])
    else:
        weights = [s - e for s, e in zip(params.scores or [], params.ece or [])]
    lists = [("weights", weights), ("scores", params.scores), ("ece", params.ece)]
    for name, values in lists:
        if values is not None and len(values) != count:
            raise UserError(f"method.{name}: expected {count} values (one per member), got {len(values)}")
    if (problem := weights_problem(weights)) is not None:
        raise UserError(f"method.weights: resolved {problem}, got {weights}")
    return weights


def resolve_lead(params: GacParams, labels: Sequence[str]) -> int:
    return resolve_member(params.lead, labels, params.lead_spelling)


@dataclass
class GacState(RequestState):
    """A request under GaC: its ids are the lead member's (``lead``)."""

    pending: dict[int, list[bytes]] = field(default_factory=dict)  # member -> chosen pieces it missed
    ensembled: list[int] = field(default_factory=list)       # step indices that were ensembled

    def copy(self) -> GacState:
        copied = super().copy()
        copied.pending = {index: list(pieces) for index, pieces in self.pending.items()}
        copied.ensembled = list(self.ensembled)
        return copied


@dataclass(frozen=True)
class GacPick(Advance):
    """A row's choice: the gate's own token (Eq. 5, ``by_gate``) or a union entry (Eq. 3)."""

    by_gate: bool = False
    chosen: int = -1  # the gate's id, or the union index


@dataclass
class GacStats:
    steps: int = 0
    ensembled: int = 0
    position_deciles: list[int] = field(default_factory=lambda: [0] * 10)  # where ensembled steps fall

    def summary(self) -> dict:
        return {"tokens_ensembled": self.ensembled, "ensemble_steps_total": self.steps,
                "ensembled_fraction": self.ensembled / self.steps if self.steps else None,
                "ensembled_position_deciles": self.position_deciles}


@dataclass(frozen=True)
class GacReport(MethodStats):
    """What a GaC row reports besides the shared statistics."""

    union_size: int
    lead_index: int
    gate_index: int | None           # Eq. 5's gate member; None when every step is ensembled
    weights_resolved: list[float]
    bound_decided_fraction: float | None  # rows the top-k bound decided without the full union
    steps: dict = spread()           # GacStats.summary(): steps gated and ensembled
    retokenizing: dict = spread()
    speculation: dict = spread()
    core: dict = spread()            # CoRE's counters (methods/core.py) when core: true


class Gac(SpeculativeSteps, DecodingMethod):
    name = "gac"
    Params = GacParams
    choice_scoring = "GaC scores an option by the weighted average of its members' sequence probabilities"
    inert_on_choices = frozenset({*CoreParams.model_fields, *SpeculativeParams.model_fields, *WindowParams.model_fields,
                                  "lead", "threshold", "retokenize"})
    min_members = 2
    samples = True
    retired = RETIRED
    lead_param = "lead"

    def __init__(self, members: Sequence[Member], params: GacParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        self.weights = torch.tensor(resolve_weights(params, len(members)), dtype=torch.float32)
        self.lead = resolve_lead(params, [m.name for m in members])
        self.gate = self.lead if params.threshold is not None else None  # Eq. 5's gate, or none
        self.union: UnionVocab = cached_union([m.vocab for m in members], [sorted(m.stop_ids) for m in members],
                                              cache_dir() / "union")
        self.mixture = UnionMixture(self.union, self.weights.tolist(), [m.vocab.size for m in members])
        self.stop_entries = frozenset(self.union.stop_mask.nonzero().flatten().tolist())
        self.feed_stats = FeedStats()
        self.feeders = make_feeders(members, params.retokenize, self.feed_stats, params.window,
                                    [self.union.maps[i].by_bytes for i in range(len(members))])
        self.stats = GacStats()
        self._entries: dict[bytes, int] | None = None
        self.speculation = Speculation.of(self, params)
        self.core = CoreFusion.of(params, len(members))

    @classmethod
    def check_members(cls, params: GacParams, labels: Sequence[str]) -> None:
        resolve_weights(params, len(labels))
        resolve_proposer(params, labels, resolve_lead(params, labels))

    def carried(self) -> dict[str, object]:
        """Besides the timing, ensembled steps, re-tokenisation and speculation counters
        (``SpeculativeSteps.carried``): the greedy bound's and CoRE's counters."""
        return {**super().carried(), "bound": self.mixture.bound, **(self.core.carried() if self.core else {})}

    def statistics(self) -> GacReport:
        bound = self.mixture.bound
        decided = bound.rows_decided / bound.rows_total if bound.rows_total else None
        return GacReport(union_size=self.union.size, lead_index=self.lead, gate_index=self.gate,
                         weights_resolved=self.weights.tolist(), bound_decided_fraction=decided,
                         steps=self.stats.summary(), retokenizing=self.feed_stats.summary(self.params.retokenize),
                         speculation=self.speculation.summary() if self.speculation else {},
                         core=self.core.counters() if self.core else {})

    # --- generation: the loop's steps -------------------------------------------------------------
    def start(self, request: GenerationRequest) -> GacState:
        return GacState.of(request)

    def choose(self, dists: list[torch.Tensor], states: list[GacState]) -> Round:
        """Eq. 5's gate, lazy catch-up of skipped members, then Eq. 3 (or the gate's token) per row."""
        confident = self._gate_confident(dists)
        dists = self._catch_up(states, confident, dists)
        picks = self._choose(dists, confident, [state.sampler for state in states])
        advances = [self._advance(state, gated, pick) for state, gated, pick in zip(states, confident.tolist(), picks)]
        return Round(advances, dists)

    def _gate_confident(self, logprobs: list[torch.Tensor]) -> torch.Tensor:
        """Eq. 5: rows whose gate max probability exceeds t take the gate's token alone."""
        rows = logprobs[0].shape[0]
        if self.gate is None:
            return torch.zeros(rows, dtype=torch.bool)
        return (logprobs[self.gate].max(dim=-1).values.exp() > self.params.threshold).cpu()

    def _catch_up(self, states: list[GacState], confident, logprobs) -> list[torch.Tensor]:
        """Members that skipped steps are given the pieces they missed, once a row needs them.

        When a member must run for some row anyway, every row with missed pieces catches up in the
        same call (the pieces are applied one by one, so the result does not depend on when).
        """
        updated = list(logprobs)
        needed = [index for index in range(len(self.members))
                  if any(not confident[k] and state.pending.get(index) for k, state in enumerate(states))]
        chunks = [[state.pending.pop(index, []) for state in states] for index in needed]
        results = each([self.members[index] for index in needed],
                       lambda member, index, member_chunks: self._give(index, states, member_chunks), needed, chunks)
        for index, result in zip(needed, results):
            updated[index] = result
        return updated

    def _choose(self, logprobs, confident, samplers: list[Sampler | None]) -> list[tuple[int, bytes | None]]:
        """(union index or gate id, bytes or None for stop) per live row."""
        picks: list[tuple[int, bytes | None]] = [(-1, None)] * confident.shape[0]
        gate_rows = confident.nonzero().flatten().tolist()
        if gate_rows:
            gate_member = self.members[self.gate]
            gate_samplers = [samplers[k] for k in gate_rows]
            for k, token in zip(gate_rows, self._pick_rows(logprobs[self.gate], gate_rows, gate_samplers)):
                picks[k] = (token, None if token in gate_member.stop_ids else (gate_member.vocab.pieces[token] or b""))
        ensemble_rows = (~confident).nonzero().flatten().tolist()
        if ensemble_rows:
            ensemble_samplers = [samplers[k] for k in ensemble_rows]
            for k, index in zip(ensemble_rows, self._mix_and_pick(logprobs, ensemble_rows, ensemble_samplers)):
                picks[k] = (index, None if index in self.stop_entries else self.union.entries[index])
        return picks

    def _pick_rows(self, logprobs: torch.Tensor, rows: list[int], samplers: list[Sampler | None]) -> list[int]:
        """The gate's own token for these rows: greedy in one batched argmax, or drawn from the gate's
        distribution (shaped by the row's settings) on its device, each row with its own generator."""
        return decide_on(rows_of(logprobs, rows), samplers, lambda chosen: block_argmax(chosen).tolist())

    def _mix_and_pick(self, logprobs, rows: list[int], samplers: list[Sampler | None]) -> list[int]:
        """Union entries for these rows: the exact greedy argmax of Eq. 3 (vocab/mixture.py), or a
        draw from q (shaped by the row's settings: q^(1/T) with a temperature) on the device, each row
        with its own generator (Eq. 3, Sec. 4.3)."""
        chosen = [rows_of(lp, rows) for lp in logprobs]
        if self.core is not None:
            return self._core_pick(chosen, rows, samplers)
        return decide(samplers, lambda kept: self.mixture.greedy([rows_of(lp, kept) for lp in chosen]),
                      lambda drawn, drawing: draw_blocks(
                          self.mixture.log_blocks([rows_of(lp, drawn) for lp in chosen]), drawing))

    def _core_pick(self, logprobs, rows: list[int], samplers: list[Sampler | None]) -> list[int]:
        """Eq. 3 under CoRE (methods/core.py): the members' union projections fused by consistency,
        the method's weights as base weights; greedy or a draw from the fused distribution (a NaN or
        infinite fusion stops the row: decoding/fused.py)."""
        fused = checked_fusion(self.core.fuse(self.mixture.projections(logprobs), self.weights, self.lead), rows)
        return decide_on(fused, samplers, lambda kept: block_argmax(kept).tolist(), probabilities=True)

    def _advance(self, state: GacState, gated: bool, pick: tuple[int, bytes | None]) -> Advance:
        """What the row takes: the chosen bytes, and the lead member's id for them if it has one."""
        chosen, data = pick
        if not gated:
            state.ensembled.append(state.count)
        if data is None:
            return STOP
        token = chosen if gated else int(self.union.maps[self.lead].to_member[chosen])
        return GacPick(data, (token,) if token >= 0 else None, 1, by_gate=gated, chosen=chosen)

    def feed(self, dists, states: list[GacState], picks: list[GacPick]) -> list[torch.Tensor]:
        """Eq. 4: every member takes the chosen bytes; at a gated step the gate takes its own token
        and the others skip (their pieces wait in ``pending``)."""
        updated = list(dists)
        calls = []  # (member index, chunks, direct): built here, run side by side below
        for index in range(len(self.members)):
            chunks: list[list[bytes]] = []
            direct: list[list[int]] = []
            for state, pick in zip(states, picks):
                if pick.by_gate and index == self.gate:
                    direct.append([pick.chosen])  # the gate's own token, as the gate would continue alone
                    chunks.append([])
                elif pick.by_gate:
                    state.pending.setdefault(index, []).append(pick.data)  # this member skips the step
                    direct.append([])
                    chunks.append([])
                else:
                    direct.append([])
                    chunks.append([pick.data])
            if any(chunks) or any(direct):
                calls.append((index, chunks, direct))
        results = each([self.members[index] for index, _, _ in calls], lambda member, call: (
            self._give(call[0], states, call[1], call[2])), calls)
        for (index, _, _), result in zip(calls, results):
            updated[index] = result
        return updated

    def _give(self, index: int, states: list[GacState], chunks: list[list[bytes]],
              direct: list[list[int]] | None = None) -> torch.Tensor:
        """Member ``index`` takes each row's pieces (or its own ids in ``direct``), by the retokenize policy."""
        return self.feeders[index].give(states, chunks, direct)

    # --- speculative decoding (decoding/speculative.py) ------------------------------------------------
    def draft_advance(self, state: GacState, token: int, proposer: int, dist: torch.Tensor) -> GacPick | None:
        """The pick a step would make if it chose the proposer's token: the gate's own token when the
        proposer is the gate and is confident there (Eq. 5), else the union entry of its bytes (Eq. 3)."""
        data = self.members[proposer].vocab.pieces[token]
        if data is None:
            return None
        if proposer == self.gate and bool(dist.max().exp() > self.params.threshold):
            return GacPick(data, (token,), 1, by_gate=True, chosen=token)
        if self._entries is None:
            self._entries = {entry: index for index, entry in enumerate(self.union.entries)}
        entry = self._entries.get(data)
        if entry is None:
            return None
        lead_token = int(self.union.maps[self.lead].to_member[entry])
        return GacPick(data, (lead_token,) if lead_token >= 0 else None, 1, chosen=entry)

    def rehearse(self, states: list[GacState], picks: list[GacPick]) -> None:
        """What a step that took ``picks`` gives the members: the lazy catch-up before an ensembled
        pick, then Eq. 4's feeding."""
        nothing = [None] * len(self.members)
        self._catch_up(states, torch.tensor([pick.by_gate for pick in picks], dtype=torch.bool), nothing)
        self.feed(nothing, states, picks)

    def result(self, state: GacState, request: GenerationRequest) -> Generation:
        self.stats.steps += state.count + (state.finish == "stop_id")
        self.stats.ensembled += len(state.ensembled)
        for position in state.ensembled:
            self.stats.position_deciles[min(9, 10 * position // max(1, state.count + 1))] += 1
        return super().result(state, request)

    # --- scoring --------------------------------------------------------------------------------
    def _combine(self, per_member: list[list[float]]) -> list[float]:
        # a zero weight (a member kept for the gate only; GaC Table 5) is log 0 = -inf: no share
        log_w = [math.log(w) if w > 0 else -math.inf for w in self.weights.tolist()]
        log_total = math.log(sum(self.weights.tolist()))
        return [float(torch.logsumexp(torch.tensor([lp + lw for lp, lw in zip(values, log_w)]), 0)) - log_total
                for values in zip(*per_member)]

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Score]:
        per_member = score_with_members(self.members, requests, self.batch_size)
        combined = self._combine([[s.logprob for s in scores] for scores in per_member])
        return [Score(lp, all(scores[k].is_greedy for scores in per_member)) for k, lp in enumerate(combined)]

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        return self._combine(rolling_with_members(self.members, texts, self.batch_size))

