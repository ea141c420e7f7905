"""Lossless vocabulary reduction (methods/lvr.py, vocab/common.py), what is specific to the paper.

Exactness, the identity tested: take a model that gives mass only to canonical tokenisations (the
paper's p_V(x) = p_text(a) when x = [a]_V, else 0), here a table over every text of up to four
characters of {a, b, c} tokenised by MaxMatch over a small vocabulary V. Reduce it to the common
vocabulary C of V and a second vocabulary W. For every text a with y = dec(canonical(a)):

    prod_s M(y_s | y_<s) * M(end | y) == p_text(a),

M the reduced next-common-token distribution from the covering branches at common-token
boundaries (vocab/covering.py over C symbols). Both sides are computed independently (the right
from the text table alone); the identity fails when the covers across common-token boundaries
are cut (only the newest branch kept: checked below).
"""

from __future__ import annotations

import math
import random
from itertools import product

import pytest
import torch

from ensemble_bench.members import LocalMember
from ensemble_bench.methods.lvr import Lvr, LvrParams
from ensemble_bench.vocab.common import CommonSpeller, common_vocabulary
from ensemble_bench.vocab.covering import SortedVocab, branch_at, next_byte_distribution
from tests import tiny
from tests.tolerances import FLOAT32_SUMS, assert_close

V = [b"a", b"b", b"c", b"ab", b"bc", b"ca", b"abc", b"cab"]
W = [b"a", b"b", b"c", b"ab", b"ba", b"cc"]
STOP = len(V)
PIECES = [*V, None]  # the stop id has no piece


def maxmatch(text: bytes) -> list[int]:
    """V's canonical tokenisation: the longest token first (prefix-stable at its boundaries)."""
    ids, at = [], 0
    while at < len(text):
        size = max(len(p) for p in V if text.startswith(p, at))
        ids.append(V.index(text[at:at + size]))
        at += size
    return ids


class TableModel:
    """p_V over V + stop from a text distribution: mass only on canonical tokenisations."""

    def __init__(self, seed: int = 0):
        rng = random.Random(seed)
        texts = [bytes(t) for n in range(1, 5) for t in product(b"abc", repeat=n)]
        weights = [rng.random() ** 3 for _ in texts]
        self.p_text = {t: w / sum(weights) for t, w in zip(texts, weights)}
        self.canonical = {t: tuple(maxmatch(t)) for t in texts}

    def prefix_mass(self, ids: tuple[int, ...]) -> float:
        return sum(p for t, p in self.p_text.items() if self.canonical[t][:len(ids)] == ids)

    def next_logprobs(self, ids: tuple[int, ...]) -> torch.Tensor:
        total = self.prefix_mass(ids)
        probs = [self.prefix_mass((*ids, t)) / total for t in range(len(V))]
        probs.append(sum(p for t, p in self.p_text.items() if self.canonical[t] == ids) / total)
        return torch.tensor(probs, dtype=torch.float64).log()


def reduced_logprob(model: TableModel, speller: CommonSpeller, text: bytes, newest_only: bool = False) -> float:
    """log of the product of the reduced model's steps over dec(canonical(text)), then the end."""
    spellings = speller.nested(PIECES, frozenset({STOP}))
    vocab = SortedVocab(spellings, frozenset({STOP}), end=len(speller.common))
    y = [s for token in model.canonical[text] for s in spellings[token]]
    branches, total = [], 0.0
    for s in range(len(y) + 1):
        trunk = tuple(maxmatch(b"".join(speller.common[c] for c in y[:s])))
        mass = model.prefix_mass(trunk)
        if speller.spells(spellings, trunk, y[:s]) and mass > 0:
            opened = branch_at(vocab, math.log(mass), model.next_logprobs(trunk), [STOP])
            branches = [opened] if newest_only else [*branches, opened]
        chance = float(next_byte_distribution(vocab, branches)[y[s] if s < len(y) else vocab.end])
        total += math.log(chance) if chance > 0 else -math.inf
        if s < len(y):
            branches = [g for b in branches if (g := b.grow(vocab, tuple(y[s - b.depth:s + 1])))]
    return total


@pytest.fixture(scope="module")
def reduction():
    common = common_vocabulary([PIECES, W], [frozenset({STOP}), frozenset()])
    assert common == [b"a", b"ab", b"b", b"c"]
    return TableModel(), CommonSpeller(common)


def test_nested_tokenisation_spells_every_token_in_common_tokens(reduction):
    _, speller = reduction
    spelled = speller.nested(PIECES, frozenset({STOP}))
    assert [b"".join(speller.common[s] for s in symbols) for symbols in spelled[:STOP]] == V
    assert spelled[V.index(b"abc")] == (1, 3) and spelled[STOP] is None  # "ab" "c"


def test_reduced_model_gives_every_text_the_models_probability(reduction):
    model, speller = reduction
    for text, p in model.p_text.items():
        got = math.exp(reduced_logprob(model, speller, text))
        assert_close(got, p, FLOAT32_SUMS, what=text)  # float32 probabilities


def test_the_identity_needs_the_covers_across_common_token_boundaries(reduction):
    """With only the newest branch (a token spanning two common tokens left out), it fails."""
    model, speller = reduction
    wrong = [text for text, p in model.p_text.items()
             if abs(math.exp(reduced_logprob(model, speller, text, newest_only=True)) / p - 1) > 1e-3]
    assert wrong


# ------------------------------------------------------------------ the method on tiny models
@pytest.fixture(scope="module")
def pair():
    bt, st = tiny.byte_bpe_tokenizer(), tiny.sentencepiece_tokenizer()
    return [LocalMember(tiny.tiny_llama(len(bt), seed=0), bt, "a"),
            LocalMember(tiny.tiny_llama(len(st), seed=1), st, "b")]


def test_common_vocabulary_and_statistics_are_reported(pair):
    method = Lvr(pair, LvrParams(), batch_size=3)
    tiny.outputs(method)
    info = method.info()[method.name]
    shared = {p for p in pair[0].vocab.pieces if p} & {p for p in pair[1].vocab.pieces if p}
    assert 0 < info["common_vocabulary"] <= len(shared)
    assert info["common_token_steps"] > 0 and info["covering_tree_branches_max"] >= 2


def test_a_text_with_a_byte_no_common_token_starts_is_not_spelled():
    speller = CommonSpeller([b"a", b"ab", b"b"])
    assert speller.spell(b"abab") == (1, 1) and speller.spell(b"aba") == (1, 0)
    assert speller.spell(b"abc") is None and speller.nested([b"ca", b"ba"], frozenset()) == [None, (2, 0)]
