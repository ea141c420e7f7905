"""PackLLM — "Pack of LLMs: Model Fusion at Test-Time via Perplexity Optimization"
(Mavromatis, Karypis and Karypis, arXiv 2404.11531; docs/methods_after_seeds.md).

Each prompt P gets its own member weights lambda_k (sum 1) from how well each member knows it:

    log PPL_k(P) = -(1/t) sum_i log p_k(x_i | x_<i)              the prompt's perplexity
    PackLLM-sim:   lambda_k = softmax_k(-log PPL_k / tau)
    PackLLM-opt:   lambda = argmin_lambda PPL of P under the fused model, solved greedily: members
                   sorted by PPL_k, each next one mixed in as a*current + (1-a)*next with the best
                   a on the grid {0, 1/grid, ..., 1} (the paper's greedy algorithm, step 0.05)

Decoding fuses the members every step with the row's weights. The paper fuses logits over
vocabularies aligned to one reference tokenizer (MinED); here the fusion is the project's union
vocabulary by bytes, GaC Eq. 3 with per-row weights: q(u) = sum_k lambda_k P_k(u). PackLLM-opt's
objective is measured in the same space, on the prompt cut into segments that end where every
member's tokenisation of it has a boundary (each member's segment probability is exact there).

Log-likelihood of a continuation: sum_k lambda_k p_k(continuation) with lambda from the context,
as GaC scores (sequence level). Perplexity tasks (no prompt to weigh by): equal weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import Field, model_validator

from ensemble_bench.cache import cache_dir
from ensemble_bench.members.base import Member, Prompt, Score
from ensemble_bench.methods.base import (Generation, GenerationRequest, LoglikelihoodRequest, MethodParams,
                                         rolling_with_members, score_with_members)
from ensemble_bench.methods.concurrent import each
from ensemble_bench.methods.decode import STOP, Advance, DecodingMethod, RequestState, Round, decode_batch
from ensemble_bench.methods.feeding import give_text, text_appender
from ensemble_bench.union_cache import cached_union
from ensemble_bench.vocab.mixture import UnionMixture

SIM_ONLY, OPT_ONLY = ("tau",), ("grid",)
PROMPT_TOKENS = 2048  # prompt tokens scored in one forward (each keeps a distribution over the vocabulary)


class PackLLMParams(MethodParams):
    variant: Literal["sim", "opt"] = "sim"
    tau: float = Field(default=1.0, gt=0.0)        # PackLLM-sim temperature (paper: 1)
    grid: int = Field(default=20, ge=1, le=1000)   # PackLLM-opt: a in steps of 1/grid (paper: 0.05)
    ppl_unit: Literal["token", "byte"] = "token"   # log PPL per member token (paper) or per prompt byte
    window: int = Field(default=4, ge=0, le=64)    # look-behind tokens when re-tokenising new text

    @model_validator(mode="after")
    def _variant_fields(self):
        unused = OPT_ONLY if self.variant == "sim" else SIM_ONLY
        given = [name for name in unused if name in self.model_fields_set]
        if given:
            raise ValueError(f"'{given[0]}' does not apply to variant '{self.variant}'")
        return self


# --- the prompt's token log-probs, per member ------------------------------------------------------
@dataclass(frozen=True)
class PromptScore:
    """One member's reading of one prompt: the bytes each of its tokens ends at, and their log-probs."""

    ends: tuple[int, ...]
    logprobs: tuple[float, ...]

    @property
    def total(self) -> float:
        return sum(self.logprobs)


def split_prefix(member: Member, ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """(context, scored tokens): a leading prefix token (BOS) conditions the rest, else one is added;
    the prompt's end is kept so that both fit the member's context."""
    ids = list(ids)
    if ids and ids[0] == member.prefix_token_id:
        ids = ids[1:]
    return [member.prefix_token_id], ids[-(member.max_length - 1):]


def token_ends(member: Member, ids: Sequence[int]) -> tuple[int, ...]:
    """Byte offset where each token ends in the text (a SentencePiece dummy-prefix space dropped)."""
    ends, offset = [], -1 if member.vocab.strips_leading_space else 0
    for token in ids:
        offset += len(member.vocab.pieces[token] or b"")
        ends.append(max(offset, 0))
    return tuple(ends)


def score_prompts(member: Member, prompts: Sequence[Sequence[int]]) -> list[PromptScore]:
    """Each prompt's per-token log-probs, in batches of the member of at most ``PROMPT_TOKENS`` tokens
    (every position's distribution is kept for one forward)."""
    split = [split_prefix(member, ids) for ids in prompts]
    scores: list[PromptScore] = []
    for chunk in token_chunks([len(tokens) for _, tokens in split], PROMPT_TOKENS):
        first = member.prefill([split[i][0] for i in chunk])
        _, rest = member.extend_scored([split[i][1] for i in chunk])
        for row, i in enumerate(chunk):
            tokens = split[i][1]
            head = [float(first[row, tokens[0]])] if tokens else []
            scores.append(PromptScore(token_ends(member, tokens), tuple(head + list(rest[row]))))
    return scores


def token_chunks(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive indices grouped so that each group's lengths add up to at most ``budget`` (or one row)."""
    chunks: list[list[int]] = []
    total = budget + 1
    for i, length in enumerate(lengths):
        if total + length > budget:
            chunks.append([])
            total = 0
        chunks[-1].append(i)
        total += length
    return chunks


# --- the weights ---------------------------------------------------------------------------------
def log_perplexity(score: PromptScore, unit: str) -> float:
    """log PPL of the prompt: mean negative log-prob per member token, or per byte of the prompt."""
    count = len(score.logprobs) if unit == "token" else (score.ends[-1] if score.ends else 0)
    return -score.total / count if count else 0.0


def sim_weights(log_ppl: Sequence[float], tau: float) -> list[float]:
    """PackLLM-sim: lambda_k = softmax_k(-log PPL_k / tau)."""
    return torch.softmax(-torch.tensor(log_ppl, dtype=torch.float64) / tau, 0).tolist()


def common_segments(scores: Sequence[PromptScore]) -> list[list[float]]:
    """Each member's log-prob of each segment of the prompt between byte offsets where every member's
    tokens end ([member][segment]); one segment (the whole prompt) when the members read different texts."""
    lengths = {s.ends[-1] if s.ends else 0 for s in scores}
    cuts = sorted(set.intersection(*(set(s.ends) for s in scores))) if len(lengths) == 1 else []
    if not cuts:
        return [[s.total] for s in scores]
    segments = []
    for score in scores:
        sums, total, position = [], 0.0, 0
        for end, logprob in zip(score.ends, score.logprobs):
            total += logprob
            if position < len(cuts) and end == cuts[position]:
                sums.append(total)
                total, position = 0.0, position + 1
        segments.append(sums)
    return segments


def mixed_in(current: torch.Tensor, nxt: torch.Tensor, a: float) -> torch.Tensor:
    """log(a * exp(current) + (1 - a) * exp(nxt)) per segment."""
    none = torch.full_like(current, -math.inf)
    return torch.logaddexp(current + math.log(a) if a > 0 else none, nxt + math.log(1 - a) if a < 1 else none)


def opt_weights(segments: Sequence[Sequence[float]], log_ppl: Sequence[float], grid: int) -> list[float]:
    """PackLLM-opt's greedy solution: members in increasing PPL; each next member is mixed in with the
    a on the grid that gives the fused model the lowest prompt perplexity (ties keep the larger a)."""
    order = sorted(range(len(log_ppl)), key=lambda k: (log_ppl[k], k))
    seg = torch.tensor(segments, dtype=torch.float64)
    weights = [0.0] * len(order)
    weights[order[0]] = 1.0
    current = seg[order[0]]  # log of the fused segment probabilities so far
    for k in order[1:]:
        candidates = [mixed_in(current, seg[k], step / grid) for step in range(grid, -1, -1)]
        losses = [float(-c.mean()) for c in candidates]  # log PPL of the prompt, per segment
        best = min(range(len(losses)), key=lambda j: (losses[j], j))
        a = (grid - best) / grid
        current = candidates[best]
        weights = [w * a for w in weights]
        weights[k] = 1 - a
    return weights


def prompt_weights(params: PackLLMParams, scores: Sequence[PromptScore]) -> list[float]:
    """One prompt's lambda from every member's score of it ([member])."""
    log_ppl = [log_perplexity(s, params.ppl_unit) for s in scores]
    if params.variant == "sim":
        return sim_weights(log_ppl, params.tau)
    return opt_weights(common_segments(scores), log_ppl, params.grid)


# --- the method ----------------------------------------------------------------------------------
@dataclass
class PackState(RequestState):
    weights: tuple[float, ...] = ()


@dataclass
class PackStats:
    weights: list[list[float]] = field(default_factory=list)  # per prompt (request or scoring context), as read
    scoring_seconds: float = 0.0  # reading the prompts for the weights (generation; not in the loop's timing)

    def summary(self) -> dict:
        mean = [sum(col) / len(col) for col in zip(*self.weights)] if self.weights else None
        top = [0] * (len(self.weights[0]) if self.weights else 0)
        for w in self.weights:
            top[max(range(len(w)), key=lambda k: (w[k], -k))] += 1
        per_request = 1000 * self.scoring_seconds / len(self.weights) if self.weights else None
        return {"packllm_weights_mean": mean, "packllm_top_member_counts": top,
                "packllm_prompt_scoring_ms_per_request": per_request,
                "packllm_prompt_weights": [[round(x, 6) for x in w] for w in self.weights]}


class PackLLM(DecodingMethod):
    name = "packllm"
    Params = PackLLMParams
    min_members = 2
    writer = 0  # whose decode renders the text

    def __init__(self, members: Sequence[Member], params: PackLLMParams, batch_size: int = 1):
        super().__init__(members, params, batch_size)
        self.union = cached_union([m.vocab for m in members], [sorted(m.stop_ids) for m in members],
                                  cache_dir() / "union")
        # equal weights here: each row's lambda enters as log lambda added to its log-probs, which
        # scales P_k(u) by lambda_k and keeps the mixture's exact greedy bound valid
        self.mixture = UnionMixture(self.union, [1.0] * len(members), [m.vocab.size for m in members])
        self.stop_entries = frozenset(self.union.stop_mask.nonzero().flatten().tolist())
        self.appenders = [text_appender(m, params.window, self.union.maps[i].by_bytes) for i, m in enumerate(members)]
        self.stats = PackStats()

    def info(self) -> dict:
        return {**super().info(), "union_size": self.union.size, **self.stats.summary()}

    def weights_for(self, prompts: list[list[list[int]]]) -> list[list[float]]:
        """lambda of each prompt ([row][member]); ``prompts[member][row]`` in each member's ids."""
        scores = each(self.members, score_prompts, prompts)
        return [prompt_weights(self.params, [s[row] for s in scores]) for row in range(len(prompts[0]))]

    # --- generation: the loop's steps -------------------------------------------------------------
    def _generate_batch(self, prompts: list[list[list[int]]], requests: list[GenerationRequest]) -> list[Generation]:
        start = time.perf_counter()
        weights = self.weights_for(prompts)  # before the loop: it reuses the members' batch state
        self.stats.scoring_seconds += time.perf_counter() - start
        states = [PackState.of(r, weights=tuple(w)) for r, w in zip(requests, weights)]
        decode_batch(self, prompts, states, self.timing)
        return [self.result(s, r) for s, r in zip(states, requests)]

    def choose(self, dists: list[torch.Tensor], states: list[PackState]) -> Round:
        log_w = torch.tensor([s.weights for s in states], dtype=torch.float32).log()  # [rows, K]
        shifted = [lp + log_w[:, k:k + 1].to(lp.device) for k, lp in enumerate(dists)]
        return Round([self._advance(u) for u in self.mixture.greedy(shifted)], dists)

    def _advance(self, entry: int) -> Advance:
        if entry in self.stop_entries:
            return STOP
        token = int(self.union.maps[self.writer].to_member[entry])
        return Advance(self.union.entries[entry], (token,) if token >= 0 else None, 1)

    def feed(self, dists, states, advances: list[Advance]) -> list[torch.Tensor]:
        return each(self.members, lambda member, appender: give_text(member, appender, [[a.data] for a in advances]),
                    self.appenders)

    def result(self, state: PackState, request: GenerationRequest) -> Generation:
        self.stats.weights.append(list(state.weights))
        return super().result(state, request)

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
            self.stats.weights.extend(weights)
            found.update(zip(chunk, weights))
        return [found[p] for p in prompts]

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        per_member = rolling_with_members(self.members, texts, self.batch_size)
        equal = [1.0 / len(self.members)] * len(self.members)
        return [mix(list(values), equal) for values in zip(*per_member)]


def mix(logprobs: Sequence[float], weights: Sequence[float]) -> float:
    """log sum_k lambda_k exp(logp_k) (members with lambda_k = 0 left out)."""
    terms = [lp + math.log(w) for lp, w in zip(logprobs, weights) if w > 0]
    return float(torch.logsumexp(torch.tensor(terms, dtype=torch.float64), 0))
