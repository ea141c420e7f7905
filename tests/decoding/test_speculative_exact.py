"""Speculative sampling's output distribution, computed exactly (issue 51, test 1): GaC over the two tiny
members, the probability of every 3-token continuation of a prompt, from every-token sampling and from
``speculative: 2`` sampling, must agree.

Nothing is re-derived: both sides are the real decode loop (``Gac.generate``). Each random decision it
takes (a draw from a distribution, ``inverse_cdf``; an acceptance, ``bernoulli`` with
``SamplingAcceptance.acceptance``'s probability) is enumerated instead of drawn: the loop is replayed once
per path of decisions, every outcome of positive probability of every decision taken in turn, and a
path's probability is the product of its decisions'. Every-token sampling's side is then the product of
the ensemble's shaped step distributions (GaC's own fused distribution); the speculative side sums over
the proposer's drafts, the acceptances min(1, p/q), the residual draws from max(0, p - q) normalised
and the draws past the draft. The generator a request gets is replaced by one that cannot draw, so a
random decision taken outside the enumeration fails the test instead of hiding in it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pytest
import torch

from ensemble_bench.decoding import acceptance, sampling, speculative_sampling
from ensemble_bench.decoding.acceptance import SamplingAcceptance
from ensemble_bench.decoding.sampling import RequestSampling, SamplingParams
from ensemble_bench.methods import GenerationRequest
from ensemble_bench.methods.gac import Gac, GacParams
from tests.tiny import REQUESTS
from tests.tolerances import CONTINUATION_PROBABILITY, FLOAT64_SUMS, assert_close

TOP_K = 2  # two entries a step: 8 continuations, 30-odd paths of the speculative loop (3: 27 and 200-400)
SETTINGS = SamplingParams(do_sample=True, temperature=1.0, top_k=TOP_K)
NEW_TOKENS = 3
DRAFT = 2  # a first round drafts 2 and draws the third past the draft: every kind of decision within 3 tokens


@dataclass
class Path:
    """One replay of the loop: the outcomes of the decisions a script fixes (the first outcome of any
    decision past it), the number of outcomes each decision had and the path's probability."""

    script: list[int]
    taken: list[int] = field(default_factory=list)
    outcomes: list[int] = field(default_factory=list)
    probability: float = 1.0
    partial_acceptances: int = 0  # acceptances with 0 < min(1, p/q) < 1 on this path

    def decide(self, outcomes: list[tuple[object, float]]) -> object:
        """One decision among (outcome, probability > 0) pairs: the script's, or the first."""
        position = len(self.taken)
        index = self.script[position] if position < len(self.script) else 0
        self.taken.append(index)
        self.outcomes.append(len(outcomes))
        outcome, probability = outcomes[index]
        self.probability *= probability
        return outcome


class Enumerator:
    """Stands in for the random decisions of ``decoding.sampling`` while a ``Path`` replays."""

    def __init__(self):
        self.path = Path([])

    def inverse_cdf(self, weights: torch.Tensor, generators) -> torch.Tensor:
        chosen = []
        for row in weights.double():
            kept = row.nonzero().flatten().tolist()
            total = float(row.sum())
            chosen.append(self.path.decide([(index, float(row[index]) / total) for index in kept]))
        return torch.tensor(chosen, dtype=torch.long)

    def bernoulli(self, probability: float, generator) -> bool:
        self.path.partial_acceptances += 0 < probability < 1
        return self.path.decide([(outcome, chance) for outcome, chance in ((True, probability),
                                                                           (False, 1 - probability)) if chance > 0])


def enumerating(patch: pytest.MonkeyPatch) -> Enumerator:
    """An ``Enumerator`` in place of every random decision, and generators that cannot draw."""
    replaced = Enumerator()
    for module in (sampling, acceptance, speculative_sampling):
        patch.setattr(module, "inverse_cdf", replaced.inverse_cdf)
    patch.setattr(acceptance, "bernoulli", replaced.bernoulli)
    patch.setattr(sampling, "request_generator", lambda *key: "no generator: every decision is enumerated")
    return replaced


@pytest.fixture
def enumerator(monkeypatch) -> Enumerator:
    return enumerating(monkeypatch)


def continuations(method: Gac, enumerator: Enumerator) -> tuple[dict[tuple[str, int], float], int]:
    """The probability of every (text, new tokens) the method can generate for the request, and how many
    of its paths took an acceptance that could go either way."""
    request = REQUESTS[1]
    request = GenerationRequest(request.prompt, (), NEW_TOKENS, RequestSampling(SETTINGS, 0, "exact", 0))
    probabilities: dict[tuple[str, int], float] = defaultdict(float)
    scripts, partial = [[]], 0
    while scripts:
        enumerator.path = path = Path(scripts.pop())
        (generation,) = method.generate([request])
        probabilities[(generation.text, generation.new_tokens)] += path.probability
        partial += path.partial_acceptances > 0
        scripts += [path.taken[:position] + [other] for position in range(len(path.script), len(path.taken))
                    for other in range(1, path.outcomes[position])]
    assert_close(sum(probabilities.values()), 1.0, FLOAT64_SUMS, what="total probability")
    return dict(probabilities), partial


def agree(speculative: dict, every_token: dict) -> bool:
    """Whether two continuation distributions agree within CONTINUATION_PROBABILITY (a continuation one
    lacks has probability 0 there)."""
    return all(CONTINUATION_PROBABILITY.holds(speculative.get(key, 0.0), every_token.get(key, 0.0))
               for key in {*every_token, *speculative})


@pytest.fixture(scope="module")
def every_token_distribution(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    from ensemble_bench.members import LocalMember

    with pytest.MonkeyPatch.context() as patch:
        replaced = enumerating(patch)
        members = [LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(sp_model, sp_tokenizer, "b")]
        return continuations(Gac(members, GacParams()), replaced)[0]


@pytest.mark.parametrize("proposer", [0, 1])
def test_speculative_sampling_gives_every_continuation_its_every_token_probability(
        pair, enumerator, every_token_distribution, proposer):
    method = Gac(pair(), GacParams(speculative=DRAFT, proposer=proposer))
    speculative, partial = continuations(method, enumerator)
    assert len(every_token_distribution) >= TOP_K ** (NEW_TOKENS - 1)  # many continuations, not one likely text
    assert partial > 0  # drafts accepted and rejected at random: both the acceptance and the residual ran
    assert set(speculative) == set(every_token_distribution)
    assert_close([speculative[key] for key in sorted(speculative)],
                 [every_token_distribution[key] for key in sorted(speculative)], CONTINUATION_PROBABILITY,
                 what="P(continuation), speculative against every-token")


def inverted_acceptance(p: torch.Tensor, q: torch.Tensor, drafted: int) -> float:
    """min(1, q(u) / p(u)): the ratio upside down."""
    if drafted < 0:
        return 0.0
    return min(1.0, float(q[drafted] / p[drafted])) if bool(p[drafted] > 0) else 1.0


BROKEN_RULES = {
    "acceptance min(1, q/p)": ("acceptance", inverted_acceptance),
    "residual p (no subtraction of q)": ("residual", lambda p, q: p),
    "accept every draft": ("acceptance", lambda p, q, drafted: 0.0 if drafted < 0 else 1.0),
}


@pytest.mark.parametrize("broken", sorted(BROKEN_RULES))
def test_a_broken_rule_gives_other_probabilities(pair, enumerator, every_token_distribution, monkeypatch, broken):
    name, rule = BROKEN_RULES[broken]
    monkeypatch.setattr(SamplingAcceptance, name, staticmethod(rule))
    speculative, _ = continuations(Gac(pair(), GacParams(speculative=DRAFT, proposer=1)), enumerator)
    assert not agree(speculative, every_token_distribution)
