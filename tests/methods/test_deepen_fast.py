"""DeePEn's bounded greedy step (vocab/relative.py ``bounded_choice``) against the dense transform.

The naive reference is the dense implementation: R^ for every token at once by
F.cosine_similarity (Eq. 2) and a row softmax (Eq. 4), the target of Eq. 5 and T dense steps of
Eq. 7 on the main model's support. Wherever the bounds decide a row, their token must be the
dense argmax; the rows they leave go to the exact path, so generation is unchanged.
"""

import copy

import pytest
import torch

from ensemble_bench.members import LocalMember
from ensemble_bench.methods import deepen as deepen_module
from ensemble_bench.methods.deepen import Deepen, DeepenParams
from ensemble_bench.vocab.relative import MemberSlice, RelativeSpace, Scratch, bounded_choice
from tests.naive import dense_argmax, dense_relative
from tests.tiny import REQUESTS


def make_slice(space: RelativeSpace, probs: torch.Tensor, supports: torch.Tensor, head: int) -> MemberSlice:
    heads, tails = supports[:, :head], supports[:, head:]
    rows = space.compute_rows(heads.flatten()).view(*heads.shape, space.size)
    return MemberSlice(heads, probs.gather(1, heads), rows, probs.gather(1, tails),
                       space.entry_low[tails], space.entry_high[tails])


def random_members(seed: int, sizes=(70, 55), dim=6, common=40):
    generator = torch.Generator().manual_seed(seed)
    embeddings = [torch.randn(size, dim, generator=generator) for size in sizes]
    anchors = [list(range(common)), list(range(sizes[1] - common, sizes[1]))]
    return embeddings, anchors, generator


def random_probs(generator, rows: int, size: int, sharpness: float) -> torch.Tensor:
    return (torch.randn(rows, size, generator=generator) * sharpness).softmax(dim=-1)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("support,head", [(None, 4), (20, 4), (12, 1), (6, 6)])
@pytest.mark.parametrize("eta,steps", [(0.15, 5), (0.3, 8), (0.05, 1), (0.2, 0)])
def test_decided_rows_are_the_dense_argmax(seed, support, head, eta, steps):
    embeddings, anchors, generator = random_members(seed)
    spaces = [RelativeSpace(e, a) for e, a in zip(embeddings, anchors)]
    dense = [dense_relative(e, a) for e, a in zip(embeddings, anchors)]
    weights, main = [0.6, 0.4], seed % 2
    decided_total = 0
    for sharpness in (0.5, 2.0, 6.0, 12.0):  # flat to peaked
        probs = [random_probs(generator, 16, e.shape[0], sharpness) for e in embeddings]
        supports = [p.topk(e.shape[0] if support is None else support, dim=-1).indices
                    for p, e in zip(probs, embeddings)]
        slices = [make_slice(s, p, ids, head) for s, p, ids in zip(spaces, probs, supports)]
        winner, decided = bounded_choice(slices, weights, main, eta, steps, Scratch())
        chosen = slices[main].head_ids.gather(1, winner[:, None])[:, 0]
        for row in range(16):
            if decided[row]:
                expected = dense_argmax(dense, [p[row] for p in probs], [s[row] for s in supports],
                                        weights, main, eta, steps)
                assert int(chosen[row]) == expected, (sharpness, row)
        decided_total += int(decided.sum())
    if head == 4 and steps <= 5:
        assert decided_total > 0  # the peaked rows are decided: the test compares something


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_entry_bounds_hold_every_entry(dtype):
    generator = torch.Generator().manual_seed(3)
    embeddings = (torch.randn(90, 5, generator=generator) + torch.tensor([1.5, 0, 0, 0, 0])).to(dtype)
    embeddings[7] = 0  # a zero embedding: a uniform row
    space = RelativeSpace(embeddings, list(range(0, 90, 2)))
    rows = space.compute_rows(torch.arange(90))
    assert bool((rows >= space.entry_low[:, None]).all()) and bool((rows <= space.entry_high[:, None]).all())


def bounds_off(monkeypatch):
    """Deepen with every row left undecided: the exact path alone."""
    def nothing_decided(members, *args, **kwargs):
        rows = members[0].head_probs.shape[0]
        return torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.bool)
    monkeypatch.setattr(deepen_module, "bounded_choice", nothing_decided)


def peaked(model, scale: float):
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


@pytest.mark.parametrize("support,main,scale", [(None, 0, 1.0), (8, 1, 1.0), (16, 0, 30.0), (None, 1, 30.0)])
def test_generation_with_bounds_equals_the_exact_path(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, monkeypatch,
                                                      support, main, scale):
    models = [peaked(bpe_model, scale), peaked(sp_model, scale)]

    def pair():
        return [LocalMember(models[0], bpe_tokenizer, "a"), LocalMember(models[1], sp_tokenizer, "b")]
    params = DeepenParams(retokenize="local", support=support, main=main, eta=0.3)
    fast = Deepen(pair(), params, batch_size=3)
    bounded = [g.text for g in fast.generate(REQUESTS)]
    if scale > 1:
        assert fast.info()[fast.name]["bound_decided_fraction"] > 0
    bounds_off(monkeypatch)
    assert bounded == [g.text for g in Deepen(pair(), params, batch_size=3).generate(REQUESTS)]
