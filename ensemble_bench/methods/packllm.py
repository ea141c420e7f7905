"""PackLLM — "Pack of LLMs: Model Fusion at Test-Time via Perplexity Optimization"
(Mavromatis, Karypis and Karypis, arXiv 2404.11531; docs/methods/token_level.md).

Each prompt P gets its own member weights lambda_k (sum 1) from how well each member knows it
(PackLLM-sim and PackLLM-opt, Sec. 3: methods/packllm_weights.py). Its top-1 expert is the member of
lowest prompt perplexity (ties to the lower index).

Decoding fuses the members every step with the row's weights, in one of two spaces (``alignment``):
- ``mined`` (the paper's tokenizer alignment and logit fusion): fusion is on the row's top-1 expert's
  vocabulary; every member's log-probs are carried there by MinED (vocab/mined.py) and fused as
  p(x) = softmax_x(sum_k lambda_k s_k(x)); greedy takes the expert's token at the argmax, the others
  take its text.
- ``union``: the project's union vocabulary by bytes, GaC Eq. 3 with per-row weights:
  q(u) = sum_k lambda_k P_k(u).
PackLLM-opt minimises the prompt perplexity of the model decoded: the logit fusion (mined) or the
arithmetic mixture (union).

Log-likelihood of a continuation: sum_k lambda_k p_k(continuation) with lambda from the context,
as GaC scores (sequence level). Perplexity tasks (no prompt to weigh by): equal weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field, model_validator

from ensemble_bench.cache import cache_dir
from ensemble_bench.decoding.concurrent import each
from ensemble_bench.decoding.decode import STOP, Advance, DecodingMethod, RequestState, Round
from ensemble_bench.decoding.feeding import FeedStats, make_feeders, text_lookup
from ensemble_bench.decoding.fused import checked_fusion
from ensemble_bench.decoding.method import (
    Generation,
    GenerationRequest,
    LoglikelihoodRequest,
    WindowParams,
    rolling_with_members,
    score_with_members,
)
from ensemble_bench.decoding.sampling import Sampler, decide, decide_on, draw_blocks, rows_of
from ensemble_bench.decoding.speculative import Speculation, SpeculativeParams, SpeculativeSteps, resolve_proposer
from ensemble_bench.decoding.stats import MethodStats, spread
from ensemble_bench.members.base import Member, Prompt, Score
from ensemble_bench.methods.core import CoreFusion, CoreParams
from ensemble_bench.methods.packllm_weights import (
    Carried,
    ExpertReading,
    PackStats,
    PromptWeights,
    common_segments,
    expert_token_ppl,
    fused_opt_weights,
    increasing_ppl,
    log_perplexity,
    opt_weights,
    score_prompts,
    sim_weights,
)
from ensemble_bench.vocab.bytes_view import VocabView
from ensemble_bench.vocab.fast_topk import block_argmax
from ensemble_bench.vocab.mined import cached_mined_map
from ensemble_bench.vocab.mixture import UnionMixture
from ensemble_bench.vocab.union_cache import cached_union

SIM_ONLY, OPT_ONLY = ("tau",), ("grid",)
LEAD = 0  # whose decode renders the text (the method has no parameter naming it)


class PackLLMParams(WindowParams, SpeculativeParams, CoreParams):
    variant: Literal["sim", "opt"] = Field(default="sim", description="PackLLM-sim or PackLLM-opt (Sec. 3)")
    tau: float = Field(default=1.0, gt=0.0, description="PackLLM-sim temperature (paper: 1)")
    grid: int = Field(default=20, ge=1, le=1000, description="PackLLM-opt: a in steps of 1/grid (paper: 0.05)")
    ppl_unit: Literal["token", "byte"] = Field(default="token", description=(
        "log perplexity per member token (paper) or per prompt byte"))
    alignment: Literal["union", "mined"] = Field(default="mined", description=(
        "fusion space: mined, the row's top-1 expert's vocabulary (paper); union, bytes"))
    score_from: Literal["prefix", "second_token"] = Field(default="prefix", description=(
        "the prompt's perplexity: prefix, every prompt token scored, the first after the member's prefix "
        "token (BOS); second_token, the paper's code: no prefix token, scoring starts at the second token"))
    ppl_reading: Literal["own", "expert_tokens"] = Field(default="own", description=(
        "whose tokens each member's prompt perplexity is read on: own, its own tokenisation; expert_tokens, "
        "the paper's code: the top-1 expert's tokens, MinED-mapped (mined alignment only)"))

    @model_validator(mode="after")
    def _expert_reading_needs_mined(self):
        if self.ppl_reading == "expert_tokens" and (self.alignment != "mined" or self.ppl_unit != "token"):
            raise ValueError("ppl_reading 'expert_tokens' needs alignment 'mined' and ppl_unit 'token'")
        return self

    @model_validator(mode="after")
    def _variant_fields(self):
        unused = OPT_ONLY if self.variant == "sim" else SIM_ONLY
        given = [name for name in unused if name in self.model_fields_set]
        if given:
            raise ValueError(f"'{given[0]}' does not apply to variant '{self.variant}'")
        return self


# --- the method ----------------------------------------------------------------------------------
@dataclass
class PackState(RequestState):
    weights: tuple[float, ...] = ()
    expert: int = 0  # the row's top-1 expert, whose vocabulary the fusion uses (mined alignment)
    token: int = -1  # mined: the top-1 expert's last chosen id (it takes its own token back)


@dataclass(frozen=True)
class PackReport(MethodStats):
    """What a PackLLM row reports besides the shared statistics."""

    alignment: str
    fusion: dict = spread()        # union_size with alignment union
    prompts: dict = spread()       # PackStats.summary(): each prompt's lambda, their mean, top-1 experts, scoring time
    retokenizing: dict = spread()
    speculation: dict = spread()
    core: dict = spread()          # CoRE's counters (methods/core.py) when core: true


class UnionFusion:
    """``alignment: union``: GaC's union by bytes with each row's weights; every member takes the bytes."""

    def __init__(self, members: Sequence[Member], core: CoreFusion | None = None):
        self.core = core
        self.union = cached_union([m.vocab for m in members], [sorted(m.stop_ids) for m in members],
                                  cache_dir() / "union")
        # equal weights here: each row's lambda enters as log lambda added to its log-probs, which
        # scales P_k(u) by lambda_k and keeps the mixture's exact greedy bound valid
        self.mixture = UnionMixture(self.union, [1.0] * len(members), [m.vocab.size for m in members])
        self.stop_entries = frozenset(self.union.stop_mask.nonzero().flatten().tolist())
        self.by_bytes = [m.by_bytes for m in self.union.maps]
        self.entries = {entry: index for index, entry in enumerate(self.union.entries)}

    def info(self) -> dict:
        return {"union_size": self.union.size}

    def choose(self, dists: list[torch.Tensor], states: list[PackState]) -> list[Advance]:
        """The union entry of each row: q's argmax, or a draw from q for a row that samples."""
        samplers = [s.sampler for s in states]
        if self.core is not None:  # CoRE (methods/core.py) on the members' union projections, lambda as base weights
            weights = torch.tensor([s.weights for s in states], dtype=torch.float32)
            fused = checked_fusion(self.core.fuse(self.mixture.projections(dists), weights, LEAD))
            chosen = decide_on(fused, samplers, lambda kept: block_argmax(kept).tolist(), probabilities=True)
            return [self._advance(u) for u in chosen]
        log_w = torch.tensor([s.weights for s in states], dtype=torch.float32).log()  # [rows, K]
        shifted = [lp + log_w[:, k:k + 1].to(lp.device) for k, lp in enumerate(dists)]
        chosen = decide(samplers, lambda rows: self.mixture.greedy([rows_of(lp, rows) for lp in shifted]),
                        lambda rows, drawing: draw_blocks(
                            self.mixture.log_blocks([rows_of(lp, rows) for lp in shifted]), drawing))
        return [self._advance(u) for u in chosen]

    def draft(self, state: PackState, data: bytes, token: int, proposer: int) -> Advance | None:
        """The advance for a drafted token's bytes (decoding/speculative.py): its union entry."""
        entry = self.entries.get(data)
        return None if entry is None else self._advance(entry)

    def _advance(self, entry: int) -> Advance:
        if entry in self.stop_entries:
            return STOP
        token = int(self.union.maps[LEAD].to_member[entry])
        return Advance(self.union.entries[entry], (token,) if token >= 0 else None, 1)

    def chunks(self, states: list[PackState], advances: list[Advance], member: int) -> tuple[list, list]:
        return [[a.data] for a in advances], [[] for _ in advances]


def choosable(view: VocabView, stop_ids: frozenset[int]) -> torch.Tensor:
    """[V] bool: ids greedy may pick: text tokens and stop ids (as in the union; not other special tokens)."""
    return torch.tensor([(p is not None and i not in view.special_ids) or i in stop_ids
                         for i, p in enumerate(view.pieces)], dtype=torch.bool)


class MinedFusion:
    """``alignment: mined`` (the paper): fusion on the row's top-1 expert's vocabulary, members carried there by
    MinED."""

    def __init__(self, members: Sequence[Member], core: CoreFusion | None = None):
        self.members = members
        self.core = core
        folder = cache_dir() / "mined"
        self.carried = [[None if k == r else Carried.of(cached_mined_map(ref.vocab, sorted(ref.stop_ids), m.vocab,
                                                                           sorted(m.stop_ids), folder))
                         for k, m in enumerate(members)] for r, ref in enumerate(members)]  # [expert][member]
        self.choosable = [choosable(m.vocab, m.stop_ids) for m in members]
        self.lead_ids = text_lookup(members[LEAD])
        self.by_text: list[dict[bytes, int] | None] = [None] * len(members)  # made when a draft needs them
        self.by_bytes = None  # members take text by their own lowest id with the bytes

    def info(self) -> dict:
        return {}

    def choose(self, dists: list[torch.Tensor], states: list[PackState]) -> list[Advance]:
        advances: list[Advance | None] = [None] * len(states)
        for expert in sorted({s.expert for s in states}):
            rows = [i for i, s in enumerate(states) if s.expert == expert]
            for i, token in zip(rows, self._argmax(dists, [states[i] for i in rows], rows, expert)):
                states[i].token = token
                advances[i] = self._advance(expert, token)
        return advances

    def _argmax(self, dists: list[torch.Tensor], states: list[PackState], rows: list[int], expert: int) -> list[int]:
        """The expert's id at argmax_x sum_k lambda_k s_k(x) (the paper's logit fusion; softmax keeps the argmax, and
        log-probs differ from logits by one constant per member and row) for these rows; a row that samples
        draws from softmax_x of that sum."""
        device = dists[expert].device
        weights = torch.tensor([s.weights for s in states], dtype=torch.float32, device=device)  # [rows, K]
        aligned = [self._aligned(lp, rows, k, expert, device) for k, lp in enumerate(dists)]
        samplers = [s.sampler for s in states]
        if self.core is not None:
            return self._core_argmax(aligned, weights, expert, rows, samplers)
        fused = torch.zeros((len(rows), dists[expert].shape[-1]), device=device)
        for k, member_aligned in enumerate(aligned):
            w = weights[:, k:k + 1]
            fused += torch.where(w > 0, w * member_aligned, 0.0)  # lambda_k = 0 adds nothing (not 0 * -inf)
        fused = fused.masked_fill(~self.choosable[expert].to(device), -math.inf)
        # ties: the lowest id
        return decide_on(checked_fusion(fused, rows), samplers, lambda kept: block_argmax(kept).tolist())

    def _aligned(self, logprobs: torch.Tensor, rows: list[int], k: int, expert: int, device) -> torch.Tensor:
        """Member k's log-probs of these rows on the expert's vocabulary (its own, or carried by MinED)."""
        picked = logprobs[torch.tensor(rows, device=logprobs.device)]
        return picked.float().to(device) if k == expert else self.carried[expert][k].carry(picked, device)

    def _core_argmax(self, aligned: list[torch.Tensor], weights: torch.Tensor, expert: int,
                     rows: list[int], samplers: list[Sampler | None]) -> list[int]:
        """CoRE (methods/core.py) in probability space: each member's carried distribution renormalised over the
        expert's choosable ids, fused with lambda as base weights and the expert as the lead."""
        allowed = self.choosable[expert].to(weights.device)
        probs = torch.stack([torch.softmax(a.masked_fill(~allowed, -math.inf), dim=-1).nan_to_num(0.0)
                             for a in aligned])
        fused = self.core.fuse(probs, weights, expert).masked_fill(~allowed, -1.0)
        return decide_on(checked_fusion(fused, rows), samplers, lambda kept: block_argmax(kept).tolist(),
                         probabilities=True)

    def draft(self, state: PackState, data: bytes, token: int, proposer: int) -> Advance | None:
        """The advance for a drafted token (decoding/speculative.py): the row's expert's token with
        its bytes (the token itself when the proposer is the expert; none: the draft ends)."""
        expert = state.expert
        if expert != proposer:
            if self.by_text[expert] is None:
                self.by_text[expert] = text_lookup(self.members[expert])
            token = self.by_text[expert].get(data, -1)
            if token < 0:
                return None
        state.token = token
        return self._advance(expert, token)

    def _advance(self, expert: int, token: int) -> Advance:
        member = self.members[expert]
        if token in member.stop_ids:
            return STOP
        data = member.vocab.pieces[token]
        if expert == LEAD:
            return Advance(data, (token,), 1)
        own = self.lead_ids.get(data)
        return Advance(data, (own,) if own is not None else None, 1)

    def chunks(self, states: list[PackState], advances: list[Advance], member: int) -> tuple[list, list]:
        """The top-1 expert takes its own token back; the other members take its bytes."""
        mine = [s.expert == member for s in states]
        return ([[] if own else [a.data] for own, a in zip(mine, advances)],
                [[s.token] if own else [] for own, s in zip(mine, states)])


class PackLLM(SpeculativeSteps, DecodingMethod):
    name = "packllm"
    Params = PackLLMParams
    choice_scoring = ("PackLLM scores an option by its members' sequence probabilities mixed with the prompt's "
                      "perplexity weights")
    inert_on_choices = frozenset({*CoreParams.model_fields, *SpeculativeParams.model_fields,
                                  *WindowParams.model_fields})
    min_members = 2
    samples = True
    lead = LEAD

    @classmethod
    def packages(cls, params: PackLLMParams) -> dict[str, str]:
        return {"rapidfuzz": "rapidfuzz"} if params.alignment == "mined" else {}  # MinED's edit distances

    def __init__(self, members: Sequence[Member], params: PackLLMParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        self.core = CoreFusion.of(params, len(members))
        self.fusion = (UnionFusion if params.alignment == "union" else MinedFusion)(members, self.core)
        self.feed_stats = FeedStats()
        self.feeders = make_feeders(members, "local", self.feed_stats, params.window, self.fusion.by_bytes)
        self.stats = PackStats.of(len(members))
        self.speculation = Speculation.of(self, params)

    @classmethod
    def check_members(cls, params: PackLLMParams, labels: Sequence[str]) -> None:
        resolve_proposer(params, labels, LEAD)

    def statistics(self) -> PackReport:
        return PackReport(alignment=self.params.alignment, fusion=self.fusion.info(), prompts=self.stats.summary(),
                          retokenizing=self.feed_stats.summary("local"),
                          speculation=self.speculation.summary() if self.speculation else {},
                          core=self.core.counters() if self.core else {})

    def carried(self) -> dict[str, object]:
        return {**super().carried(), **(self.core.carried() if self.core else {})}

    def weights_for(self, prompts: list[list[list[int]]]) -> list[PromptWeights]:
        """lambda and the top-1 expert of each prompt ([row]); ``prompts[member][row]`` in each member's ids."""
        scores = each(self.members, lambda m, rows: score_prompts(m, rows, self.params.score_from), prompts)
        return [self._prompt_weights([s[row] for s in scores], [p[row] for p in prompts])
                for row in range(len(prompts[0]))]

    def _prompt_weights(self, scores: list, prompt: list[list[int]]) -> PromptWeights:
        params = self.params
        log_ppl = [log_perplexity(s, params.ppl_unit) for s in scores]
        expert = increasing_ppl(log_ppl)[0]
        reading = None
        if params.alignment == "mined":
            reading = ExpertReading(self.members, self.fusion.carried[expert], expert, prompt, params.score_from)
            if params.ppl_reading == "expert_tokens":
                log_ppl = expert_token_ppl(reading)
        if params.variant == "sim":
            weights = sim_weights(log_ppl, params.tau)
        elif reading is None:
            weights = opt_weights(common_segments(scores), log_ppl, params.grid)
        else:
            weights = fused_opt_weights(reading, increasing_ppl(log_ppl), params.grid)
        return PromptWeights(tuple(weights), expert)

    # --- generation: the loop's steps -------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """The loop's batches (longest prompts first); the prompts' weights are recorded in the requests' order."""
        self._batch_weights: dict[int, PromptWeights] = {}
        generations = super().generate(requests)
        self.stats.add([self._batch_weights[id(r)] for r in requests])
        return generations

    def _generate_batch(self, prompts: list[list[list[int]]], requests: list[GenerationRequest]) -> list[Generation]:
        start = time.perf_counter()
        found = self.weights_for(prompts)  # before the loop: it reuses the members' batch state
        self.stats.scoring_seconds += time.perf_counter() - start
        self._batch_weights.update((id(r), w) for r, w in zip(requests, found))
        states = [PackState.of(r, weights=w.weights, expert=w.expert) for r, w in zip(requests, found)]
        self.decode(prompts, states)
        return [self.result(s, r) for s, r in zip(states, requests)]

    def choose(self, dists: list[torch.Tensor], states: list[PackState]) -> Round:
        return Round(self.fusion.choose(dists, states), dists)

    def feed(self, dists, states, advances: list[Advance]) -> list[torch.Tensor]:
        def give(member, k: int):
            return self.feeders[k].give(states, *self.fusion.chunks(states, advances, k))

        return each(self.members, give, list(range(len(self.members))))

    def draft_advance(self, state: PackState, token: int, proposer: int, dist: torch.Tensor) -> Advance | None:
        """What the fusion would take if it chose the proposer's token (decoding/speculative.py)."""
        data = self.members[proposer].vocab.pieces[token]
        return None if data is None else self.fusion.draft(state, data, token, proposer)

    # --- scoring --------------------------------------------------------------------------------
    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Score]:
        per_member = score_with_members(self.members, requests, self.batch_size)
        weights = self._context_weights([r.prompt for r in requests])
        return [Score(mix([scores[k].logprob for scores in per_member], weights[k]),
                      all(scores[k].is_greedy for scores in per_member)) for k in range(len(requests))]

    def _context_weights(self, prompts: Sequence[Prompt]) -> list[list[float]]:
        """lambda of each distinct context, scored in batches of ``batch_size``."""
        distinct = list(dict.fromkeys(prompts))
        found: dict[Prompt, list[float]] = {}
        for start in range(0, len(distinct), self.batch_size):
            chunk = distinct[start:start + self.batch_size]
            rendered = [[m.render(p) for p in chunk] for m in self.members]
            weights = self.weights_for(rendered)
            self.stats.add(weights)
            found.update(zip(chunk, [list(w.weights) for w in weights]))
        return [found[p] for p in prompts]

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        per_member = rolling_with_members(self.members, texts, self.batch_size)
        equal = [1.0 / len(self.members)] * len(self.members)
        return [mix(list(values), equal) for values in zip(*per_member)]


def mix(logprobs: Sequence[float], weights: Sequence[float]) -> float:
    """log sum_k lambda_k exp(logp_k) (members with lambda_k = 0 left out)."""
    terms = [lp + math.log(w) for lp, w in zip(logprobs, weights) if w > 0]
    return float(torch.logsumexp(torch.tensor(terms, dtype=torch.float64), 0))
