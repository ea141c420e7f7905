"""PackLLM's per-prompt member weights lambda_k (Mavromatis et al., arXiv 2404.11531, Sec. 3;
docs in methods/packllm.py).

    log PPL_k(P) = -(1/t) sum_i log p_k(x_i | x_<i)              the prompt's perplexity
    PackLLM-sim:   lambda_k = softmax_k(-log PPL_k / tau)
    PackLLM-opt:   lambda = argmin_lambda PPL of P under the fused model, solved greedily: members
                   sorted by PPL_k, each next one mixed in as a*current + (1-a)*next with the best
                   a on the grid {0, 1/grid, ..., 1} (the paper's greedy algorithm, step 0.05)

The fused model whose perplexity PackLLM-opt minimises is the model the method decodes with:
- ``alignment: mined`` (the paper): the logit fusion softmax(sum_k lambda_k s_k) on the top-1 expert's
  vocabulary (the member of lowest PPL). Its perplexity is read on the expert's tokens of the prompt;
  every other member reads the MinED images of those tokens (as the paper's code does), and its
  log-probs are carried onto the expert's vocabulary (``fused_opt_weights``).
- ``alignment: union``: the arithmetic mixture sum_k lambda_k P_k. Its perplexity is measured on the
  prompt cut into segments that end where every member's tokenisation has a boundary (each member's
  segment probability is exact there; ``opt_weights``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ensemble_bench.decoding.stats import per_request
from ensemble_bench.members.base import BLOCK_READS, Member, require

PROMPT_TOKENS = 2048  # prompt tokens scored in one forward (each keeps a distribution over the vocabulary)
FUSED_BLOCK = 256     # prompt positions whose full distributions one fused-objective block holds per member


# --- the prompt's token log-probs, per member ------------------------------------------------------
@dataclass(frozen=True)
class PromptScore:
    """One member's reading of one prompt: the bytes each of its tokens ends at, and their log-probs."""

    ends: tuple[int, ...]
    logprobs: tuple[float, ...]

    @property
    def total(self) -> float:
        return sum(self.logprobs)


def split_prefix(member: Member, ids: Sequence[int], score_from: str = "prefix") -> tuple[list[int], list[int]]:
    """(context, scored tokens). ``prefix``: a leading prefix token (BOS) conditions the rest, else one
    is added; ``second_token`` (the paper's code): no prefix token, the first token is the context. The
    prompt's end is kept so that both fit the member's context."""
    ids = list(ids)
    if ids and ids[0] == member.prefix_token_id:
        ids = ids[1:]
    if score_from == "second_token" and ids:
        ids = ids[-member.max_length:]
        return ids[:1], ids[1:]
    return [member.prefix_token_id], ids[-(member.max_length - 1):]


def token_ends(member: Member, ids: Sequence[int]) -> tuple[int, ...]:
    """Byte offset where each token ends in the text (a SentencePiece dummy-prefix space dropped)."""
    ends, offset = [], -1 if member.vocab.strips_leading_space else 0
    for token in ids:
        offset += len(member.vocab.pieces[token] or b"")
        ends.append(max(offset, 0))
    return tuple(ends)


def score_prompts(member: Member, prompts: Sequence[Sequence[int]], score_from: str = "prefix") -> list[PromptScore]:
    """Each prompt's per-token log-probs, in batches of the member of at most ``PROMPT_TOKENS`` tokens
    (every position's distribution is kept for one forward)."""
    split = [split_prefix(member, ids, score_from) for ids in prompts]
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


# --- PackLLM-sim, and PackLLM-opt for the arithmetic mixture (union alignment) ----------------------
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


def greedy_mix(order: Sequence[int], grid: int, losses) -> list[float]:
    """PackLLM-opt's greedy solution: members in increasing PPL (``order``); each next member k is mixed
    in as a*current + (1-a)*k with the a of the lowest ``losses(weights, k)`` (the fused model's loss
    for a = 1, (grid-1)/grid, ..., 0; ties keep the larger a)."""
    weights = [0.0] * len(order)
    weights[order[0]] = 1.0
    for k in order[1:]:
        found = losses(weights, k)
        best = min(range(len(found)), key=lambda j: (found[j], j))
        a = (grid - best) / grid
        weights = [w * a for w in weights]
        weights[k] = 1 - a
    return weights


def increasing_ppl(log_ppl: Sequence[float]) -> list[int]:
    """Members by increasing prompt perplexity, ties to the lower index; the first is the top-1 expert."""
    return sorted(range(len(log_ppl)), key=lambda k: (log_ppl[k], k))


def opt_weights(segments: Sequence[Sequence[float]], log_ppl: Sequence[float], grid: int) -> list[float]:
    """PackLLM-opt for the arithmetic mixture: the loss is the log PPL of sum_k lambda_k P_k per segment."""
    seg = torch.tensor(segments, dtype=torch.float64)

    def losses(weights: list[float], k: int) -> list[float]:
        current = torch.logsumexp(torch.stack([seg[j] + math.log(w) for j, w in enumerate(weights) if w > 0]), 0)
        return [float(-mixed_in(current, seg[k], step / grid).mean()) for step in range(grid, -1, -1)]

    return greedy_mix(increasing_ppl(log_ppl), grid, losses)


# --- PackLLM-opt for the logit fusion (mined alignment) ---------------------------------------------
@dataclass(frozen=True)
class Carried:
    """One member's log-probs carried onto one expert's vocabulary: gather ``index``; ``missing`` ids get -inf."""

    index: torch.Tensor    # [V_ref] member ids (0 where missing)
    missing: torch.Tensor  # [V_ref] bool

    @classmethod
    def of(cls, mapped: torch.Tensor) -> Carried:
        return cls(mapped.clamp(min=0), mapped < 0)

    def carry(self, logprobs: torch.Tensor, device: torch.device) -> torch.Tensor:
        carried = logprobs[:, self.index.to(logprobs.device)].float().to(device)
        return carried.masked_fill(self.missing.to(device), -math.inf)


def weighted(logprobs: torch.Tensor, weight: float) -> torch.Tensor:
    """lambda * s, where a member with lambda = 0 adds nothing (not 0 * -inf)."""
    return logprobs * weight if weight > 0 else torch.zeros_like(logprobs)


class ExpertReading:
    """Every member's next-token log-probs along the top-1 expert's tokens of one prompt, carried onto the
    expert's vocabulary, in blocks of ``FUSED_BLOCK`` positions. Each other member reads the MinED images
    of the expert's tokens (``carried[k].index``), so that all members predict the same positions."""

    def __init__(self, members: Sequence[Member], carried: Sequence[Carried | None], expert: int,
                 prompts: Sequence[Sequence[int]], score_from: str):
        require(members, BLOCK_READS, "packllm's weights (each member reads the prompt in blocks)")
        self.members, self.carried, self.expert = members, carried, expert
        context, targets = split_prefix(members[expert], prompts[expert], score_from)
        self.labels = targets[-(min(m.max_length for m in members) - len(context)):] if targets else []
        self.contexts = [context if k == expert else self.mapped(k, context) if score_from == "second_token"
                         else [m.prefix_token_id] for k, m in enumerate(members)]

    def mapped(self, k: int, ids: Sequence[int]) -> list[int]:
        return ids if k == self.expert else self.carried[k].index[list(ids)].tolist()

    def blocks(self):
        """(labels [b], each member's carried log-probs [b, V_expert]) per block of positions."""
        inputs = [self.mapped(k, self.labels) for k in range(len(self.members))]
        device = torch.device("cpu")
        for start in range(0, len(self.labels), FUSED_BLOCK):
            end = min(start + FUSED_BLOCK, len(self.labels))
            read = [self._read(k, inputs[k], start, end) for k in range(len(self.members))]
            yield (torch.tensor(self.labels[start:end]),
                   [lp.float().to(device) if k == self.expert else self.carried[k].carry(lp, device)
                    for k, lp in enumerate(read)])

    def _read(self, k: int, ids: list[int], start: int, end: int) -> torch.Tensor:
        """Member k's distributions predicting positions start..end-1 (its state holds ids[:start-1])."""
        member = self.members[k]
        parts = [member.prefill([self.contexts[k]])] if start == 0 else []
        block = ids[max(start - 1, 0):end - 1]
        if block:
            parts.extend(member.read_block([block], [list(range(len(block)))]))
        return torch.cat(parts)


def expert_token_ppl(reading: ExpertReading) -> list[float]:
    """Each member's log PPL on the expert's tokens of the prompt, its log-probs renormalised over the
    expert's vocabulary (the paper's code: the cross-entropy of its logits carried there)."""
    totals = [0.0] * len(reading.members)
    for labels, carried in reading.blocks():
        for k, logprobs in enumerate(carried):
            totals[k] -= float(logprobs.log_softmax(-1).gather(1, labels[:, None]).double().sum())
    return [total / len(reading.labels) if reading.labels else 0.0 for total in totals]


def fused_opt_weights(reading: ExpertReading, order: Sequence[int], grid: int) -> list[float]:
    """PackLLM-opt for the logit fusion (the paper's objective): the loss is the cross-entropy of
    softmax(sum_k lambda_k s_k) on the expert's tokens of the prompt. The members read the prompt again for
    each next member mixed in, so that only one block of distributions is held at a time."""
    def losses(weights: list[float], k: int) -> list[float]:
        totals = torch.zeros(grid + 1, dtype=torch.float64)
        for labels, carried in reading.blocks():
            current = sum(weighted(lp, w) for lp, w in zip(carried, weights))
            for j, step in enumerate(range(grid, -1, -1)):
                fused = weighted(current, step / grid) + weighted(carried[k], 1 - step / grid)
                picked = fused.log_softmax(-1).gather(1, labels[:, None])
                totals[j] -= picked.double().sum()
        return totals.tolist()

    return greedy_mix(order, grid, losses) if reading.labels else [float(k == order[0]) for k in range(len(order))]


# --- the row's statistics ------------------------------------------------------------------------
class PromptWeights(NamedTuple):
    """One prompt's lambda ([member]) and its top-1 expert (the member of lowest perplexity)."""

    weights: tuple[float, ...]
    expert: int


@dataclass
class PackStats:
    """Over the requests and scoring contexts: lambda summed per member, how often each member was the top-1
    expert, the seconds spent reading prompts; and each one's lambda (``prompts``, in order)."""

    weight_sums: list[float] = field(default_factory=list)
    top_counts: list[int] = field(default_factory=list)
    count: int = 0
    scoring_seconds: float = 0.0  # reading the prompts for the weights (generation; not in the loop's timing)
    prompts: list[PromptWeights] = per_request(PromptWeights)

    @classmethod
    def of(cls, members: int) -> PackStats:
        return cls([0.0] * members, [0] * members)

    def add(self, found: Sequence[PromptWeights]) -> None:
        for prompt in found:
            self.count += 1
            self.weight_sums = [total + weight for total, weight in zip(self.weight_sums, prompt.weights)]
            self.top_counts[prompt.expert] += 1
        self.prompts.extend(found)

    def summary(self) -> dict:
        per_request = 1000 * self.scoring_seconds / self.count if self.count else None
        return {"packllm_weights_mean": [total / self.count for total in self.weight_sums] if self.count else None,
                "packllm_top_member_counts": self.top_counts,
                "packllm_prompt_scoring_ms_per_request": per_request,
                "packllm_prompt_weights": [[round(x, 6) for x in p.weights] for p in self.prompts]}
