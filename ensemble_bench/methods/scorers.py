"""Scorers of the ``rerank`` method: each picks one of the members' complete answers to a request.

- ``perplexity``: every member scores every answer; lowest mean perplexity wins (Cool-Fusion Eq. 1-3).
- ``reward``: a sequence-classification reward model scores each (prompt, answer); highest wins
  (GaC Table 3's OAssistRM and UltraRM rows).
- ``pairwise``: a ranker compares every pair of answers in both orders; most wins wins
  (GaC Table 3's PairRanker row, LLM-Blender).

Ties go to the ``lead`` member (the first member unless the recipe says otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ensemble_bench.decoding.concurrent import each
from ensemble_bench.decoding.method import LoglikelihoodRequest, check_finite, continuation_scores
from ensemble_bench.errors import UserError
from ensemble_bench.members.base import Member, Prompt, flatten_messages

DEFAULT_REWARD_TEMPLATE = None  # None: the scorer's chat template, else a (prompt, answer) text pair
DEFAULT_PAIR_TEMPLATE = "{prompt}\n\nResponse A: {a}\n\nResponse B: {b}"


def best_by_score(scores: Sequence[float], lead: int) -> int:
    """Index of the highest score; among tied highest the lead member's, else the first."""
    top = max(scores)
    return lead if scores[lead] == top else list(scores).index(top)


def most_wins(count: int, beats: Callable[[int, int], bool], lead: int) -> int:
    """Round robin: every pair compared once; the candidate with most wins, ties to ``lead``.

    ``beats(i, j)`` says candidate i is preferred to j. In a cycle (a > b > c > a) every candidate
    has one win and ``lead`` is chosen.
    """
    wins = [0] * count
    for i in range(count):
        for j in range(i + 1, count):
            wins[i if beats(i, j) else j] += 1
    return best_by_score(wins, lead)


def prompt_text(prompt: Prompt) -> str:
    return flatten_messages(prompt.messages) if prompt.is_chat else prompt.text


def mean_perplexity(logprob: float, tokens: int) -> float:
    """Cool-Fusion Eq. 2: exp(-(1/n) sum log p); an empty answer has no perplexity (inf, never chosen)."""
    return math.exp(-logprob / tokens) if tokens else math.inf


def perplexity(logprobs: Sequence[float]) -> float:
    """exp(-(1/n) sum log p) over a segment's tokens (Cool-Fusion Eq. 1-2, SweetSpan Sec. 2.2)."""
    return mean_perplexity(sum(logprobs), len(logprobs))


@dataclass(frozen=True)
class PerplexityScorer:
    members: Sequence[Member]
    batch_size: int

    def choose(self, prompt: Prompt, texts: list[str], lead: int) -> int:
        return best_by_score([-p for p in self.average_perplexities(prompt, texts)], lead)

    def average_perplexities(self, prompt: Prompt, texts: list[str]) -> list[float]:
        """Eq. 3's objective for each candidate: the mean over members of its perplexity."""
        scored = [k for k, text in enumerate(texts) if text]
        requests = [LoglikelihoodRequest(prompt, texts[k]) for k in scored]
        per_member = each(self.members, lambda m: continuation_scores(m, requests, self.batch_size))
        totals = [0.0] * len(texts)
        for scores, lengths in per_member:
            for k, score, length in zip(scored, scores, lengths):
                totals[k] += mean_perplexity(score.logprob, length) / len(self.members)
        return [total if k in scored else math.inf for k, total in enumerate(totals)]


class Classifier:
    """A sequence-classification model whose last label's logit is the score of one input."""

    def __init__(self, location: str, device: str = "cpu", dtype: str = "float32", max_length: int = 4096):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(location)
            self.model, info = AutoModelForSequenceClassification.from_pretrained(
                location, dtype=getattr(torch, dtype), output_loading_info=True)
        except (OSError, ValueError, ImportError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise UserError(f"cannot load scorer model '{location}': {first}") from None
        untrained = [k for k in info.get("missing_keys", []) if k.split(".")[0] in ("score", "classifier")]
        if untrained:
            raise UserError(f"scorer model '{location}' has no trained classification head (missing "
                            f"{untrained[0]}); it is not a sequence-classification reward model")
        self.model.to(device).eval()
        self.device = device
        self.max_length = min(max_length, getattr(self.tokenizer, "model_max_length", max_length))
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id

    @torch.inference_mode()
    def __call__(self, inputs: Sequence[str | tuple[str, str]]) -> list[float]:
        """One score per input, each encoded alone (no padding, so batch order cannot change it)."""
        scores = []
        for item in inputs:
            first, second = (item, None) if isinstance(item, str) else item
            encoded = self.tokenizer(first, second, return_tensors="pt", truncation=True, max_length=self.max_length)
            logits = self.model(**encoded.to(self.device)).logits.float()
            scores.append(float(logits[0, -1]))
        return scores


@dataclass(frozen=True)
class ClassifierReward:
    """A reward model's score of each answer, on its own input format (see ``format``)."""

    classifier: Classifier
    template: str | None = DEFAULT_REWARD_TEMPLATE

    def scores(self, prompt: Prompt, texts: list[str]) -> list[float]:
        return self.classifier([self.format(prompt, text) for text in texts])

    def format(self, prompt: Prompt, answer: str) -> str | tuple[str, str]:
        """The reward model's own input: a template, its chat template, or a (prompt, answer) pair."""
        question = prompt_text(prompt)
        if self.template is not None:
            return self.template.format(prompt=question, response=answer)
        tokenizer = self.classifier.tokenizer
        if tokenizer.chat_template:
            messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            return tokenizer.apply_chat_template(messages, tokenize=False)
        return question, answer


class Reward(Protocol):
    def scores(self, prompt: Prompt, texts: list[str]) -> list[float]: ...


@dataclass(frozen=True)
class RewardScorer:
    """The answer with the highest reward wins (an empty answer never does)."""

    reward: Reward

    def choose(self, prompt: Prompt, texts: list[str], lead: int) -> int:
        scores = self.reward.scores(prompt, texts)
        check_finite(scores, "the reward model", "scoring the members' answers", [prompt] * len(texts), texts)
        return best_by_score([s if text else -math.inf for s, text in zip(scores, texts)], lead)


Comparator = Callable[[str, list[tuple[str, str]]], list[bool]]  # (prompt, [(a, b)]) -> a is better


@dataclass(frozen=True)
class ClassifierComparator:
    """A sequence-classification ranker scores "A is better than B" for a templated (prompt, A, B);
    both orders are asked to cancel position bias: A wins when score(A, B) >= score(B, A)."""

    classifier: Classifier
    template: str = DEFAULT_PAIR_TEMPLATE

    def __call__(self, question: str, pairs: list[tuple[str, str]]) -> list[bool]:
        texts = [self.template.format(prompt=question, a=a, b=b) for pair in pairs for a, b in (pair, pair[::-1])]
        scores = self.classifier(texts)
        check_finite(scores, "the ranker", "comparing two answers", [Prompt(text=question)] * len(texts),
                     [answer for pair in pairs for answer in pair])
        return [scores[2 * k] >= scores[2 * k + 1] for k in range(len(pairs))]


class BlenderRanker:
    """A ranker loaded by the llm-blender package (its ``Blender.loadranker`` knows LLM-Blender's
    ``llm-blender/pair-ranker`` and ``PairRM`` and UltraRM's custom head): ``compare`` in its
    "[A,B]+[B,A]" mode (both orders) for ``pairwise``, ``rank`` scores for ``reward``."""

    def __init__(self, location: str, device: str = "cpu"):
        try:
            import llm_blender
        except ImportError:
            raise UserError(f"scorer_backend llm-blender (scorer_model '{location}') needs the llm-blender "
                            "package: pip install llm-blender") from None
        self.blender = llm_blender.Blender()
        self.blender.loadranker(location, device=device)

    def __call__(self, question: str, pairs: list[tuple[str, str]]) -> list[bool]:
        firsts, seconds = [a for a, _ in pairs], [b for _, b in pairs]
        return [bool(x) for x in self.blender.compare([question] * len(pairs), firsts, seconds,
                                                      mode="[A,B]+[B,A]", disable_tqdm=True)]

    def scores(self, prompt: Prompt, answers: list[str]) -> list[float]:
        ranked = self.blender.rank([prompt_text(prompt)], [answers], return_scores=True, disable_tqdm=True)
        return [float(x) for x in ranked[0]]


@dataclass(frozen=True)
class PairwiseScorer:
    """Every pair of answers compared once (round robin); the answer with most wins is chosen."""

    compare: Comparator

    def choose(self, prompt: Prompt, texts: list[str], lead: int) -> int:
        pairs = [(i, j) for i in range(len(texts)) for j in range(i + 1, len(texts))]
        verdicts = dict(zip(pairs, self.compare(prompt_text(prompt), [(texts[i], texts[j]) for i, j in pairs])))
        return most_wins(len(texts), lambda i, j: verdicts[i, j], lead)
