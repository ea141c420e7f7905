"""EVA (methods/eva.py, vocab/eva_map.py): the alignment's steps against naive computations, the
faithfulness filter, the projection, and the cache. The contract (identity, batch invariance, Ray)
is in test_method_contract.py, speculative == every-token in test_speculative.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ensemble_bench.eva_cache import cached_projection, projection_path
from ensemble_bench.members import LocalMember
from ensemble_bench.methods.eva import Eva, EvaParams, faithful, top_k_probs
from ensemble_bench.vocab import eva_map
from ensemble_bench.vocab.bytes_view import VocabView
from ensemble_bench.vocab.eva_map import AlignParams, VocabProjection, kept_scores, seed_pairs, similarity_map
from tests.tiny import REQUESTS, outputs
from tests.tolerances import FLOAT32_SUMS, assert_close


def view(pieces, special=()):
    return VocabView(tuple(pieces), frozenset(special), "byte-level")


def test_seed_pairs_are_the_shared_bytes_and_special_texts():
    aux = view([b"<s>", b"a", b" the", b"x", b"a", None], special=[0])
    lead = view([b" the", b"q", b"a", b"<s>", b"<t>"], special=[3, 4])
    src, trg = seed_pairs(aux, lead)
    assert list(zip(src.tolist(), trg.tolist())) == [(0, 3), (1, 2), (2, 0)]  # the duplicate 'a' (4): its first id


def test_supervised_mapping_recovers_a_rotation():
    generator = np.random.default_rng(0)
    x = generator.normal(size=(300, 12)).astype(np.float32)
    rotation, _ = np.linalg.qr(generator.normal(size=(12, 12)))
    z = (x @ rotation).astype(np.float32)
    seeds = np.arange(0, 300, 2)
    xw, zw = eva_map.supervised_mapping(x, z, seeds, seeds)
    xs, zs = eva_map._unit(xw), eva_map._unit(zw)
    assert (xs @ zs.T).argmax(axis=1).tolist() == list(range(300))  # unseen tokens too find their twin


def test_supervised_mapping_takes_members_of_different_widths():
    generator = np.random.default_rng(1)
    x = generator.normal(size=(80, 6)).astype(np.float32)
    z = np.concatenate([x, generator.normal(size=(80, 3)).astype(np.float32) * 0.01], axis=1)
    xw, zw = eva_map.supervised_mapping(x, z, np.arange(60), np.arange(60))
    assert xw.shape == zw.shape == (80, 6)


def naive_map(x, z, rows, params, excluded=()):
    """Dense CSLS, top-t, threshold and variance rule, one row at a time (the authors' loop)."""
    xs, zs = eva_map._unit(x), eva_map._unit(z)
    cos = xs @ zs.T
    hub = np.sort(cos.T, axis=1)[:, ::-1][:, :params.neighborhood].mean(axis=1)
    hub[list(excluded)] = np.inf
    found = []
    for row in rows:
        scores = 2 * cos[row] - hub
        top = np.argsort(-scores, kind="stable")[:params.top_t]
        kept = [(int(j), float(scores[j])) for j in top if scores[j] >= params.threshold]
        values = np.array([v for _, v in kept])
        if kept and not (values.std() <= params.variance and len(kept) > eva_map.CROWDED):
            found += [(int(row), j, v) for j, v in kept]
    return sorted(found)


@pytest.mark.parametrize("params", [AlignParams(), AlignParams(top_t=3, threshold=0.3, neighborhood=2),
                                    AlignParams(top_t=8, threshold=-5.0, variance=10.0)])
def test_similarity_map_equals_the_dense_computation(monkeypatch, params):
    monkeypatch.setattr(eva_map, "CHUNK_ROWS", 7)  # several chunks
    generator = np.random.default_rng(2)
    x, z = generator.normal(size=(40, 5)).astype(np.float32), generator.normal(size=(50, 5)).astype(np.float32)
    rows = np.arange(3, 40)
    src, dst, score = similarity_map(x, z, rows, params, excluded=[0, 1])
    got = sorted(zip(src.tolist(), dst.tolist(), score.tolist()))
    expected = naive_map(x, z, rows, params, excluded=[0, 1])
    assert [(a, b) for a, b, _ in got] == [(a, b) for a, b, _ in expected]
    assert_close([s for *_, s in got], [s for *_, s in expected], FLOAT32_SUMS)
    assert all(b not in (0, 1) for _, b, _ in got)


def test_variance_rule_drops_crowded_flat_rows_only():
    flat = torch.tensor([[0.5] * 6 + [0.0] * 4])          # 6 kept, spread 0: nothing
    few = torch.tensor([[0.5] * 5 + [0.0] * 5])           # 5 kept, spread 0: kept (the rule needs more than 5)
    spread = torch.tensor([[0.9, 0.7, 0.5, 0.4, 0.3, 0.2, 0.05, 0, 0, 0]])
    assert not kept_scores(flat, 0.1, 0.01).any()
    assert kept_scores(few, 0.1, 0.01).sum() == 5
    assert kept_scores(spread, 0.1, 0.01).sum() == 6


def test_projection_sums_weighted_probabilities():
    projection = VocabProjection(torch.tensor([0, 0, 2]), torch.tensor([1, 3, 1]), torch.tensor([0.5, 0.25, 1.0]), 4, 2)
    probs = torch.tensor([[0.2, 0.3, 0.5]])
    assert projection.project(probs)[0].tolist() == pytest.approx([0.0, 0.1 + 0.5, 0.0, 0.05])


def test_top_k_probs_renormalise_over_the_top_k():
    logprobs = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3]]))
    assert top_k_probs(logprobs, 2)[0].tolist() == pytest.approx([0.0, 4 / 7, 0.0, 3 / 7])


def test_faithfulness_filter():
    a = torch.tensor([[0.6, 0.3, 0.1, 0.0]])   # top 0
    b = torch.tensor([[0.1, 0.2, 0.3, 0.4]])   # top 3: in nobody's top-2
    c = torch.tensor([[0.5, 0.4, 0.0, 0.1]])   # top 0
    assert faithful([a, b, c], 2)[:, 0].tolist() == [True, False, True]
    assert faithful([a, b, c], 4)[:, 0].tolist() == [True, True, True]
    assert faithful([a, b, c], None)[:, 0].tolist() == [True, True, True]


@pytest.fixture
def pair(bpe_model, bpe_tokenizer, sp_model, sp_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("ENSBENCH_CACHE", str(tmp_path))
    return lambda: [LocalMember(bpe_model, bpe_tokenizer, "bpe"), LocalMember(sp_model, sp_tokenizer, "sp")]


def test_fuse_averages_the_faithful_members_and_keeps_all_when_none_is(pair):
    method = Eva(pair(), EvaParams(n=1, lead=0))
    lead, aux = torch.tensor([[0.7, 0.3, 0.0]]), torch.tensor([[0.2, 0.0, 0.8]])
    assert method.fuse([lead, aux])[0].tolist() == pytest.approx([0.45, 0.15, 0.4])  # neither top in the other's top-1
    agree = torch.tensor([[0.6, 0.0, 0.4]])
    assert method.fuse([lead, agree])[0].tolist() == pytest.approx([0.65, 0.15, 0.2])
    assert method.info()["eva"]["eva_no_faithful_member_steps"] == 1


def test_the_filter_is_counted_with_core_too(pair):
    """With ``core: true`` the filter's members are CoRE's base weights: its counters still count them."""
    method = Eva(pair(), EvaParams(n=1, lead=0, core=True))
    lead, aux = torch.tensor([[0.7, 0.3, 0.0]]), torch.tensor([[0.2, 0.0, 0.8]])
    method.core_fuse([lead, aux])
    assert method.info()["eva"]["eva_steps"] == 1
    assert method.info()["eva"]["eva_no_faithful_member_steps"] == 1


def test_the_projection_is_built_once_and_cached(pair, tmp_path, monkeypatch):
    first = Eva(pair(), EvaParams(lead=0))
    files = list((tmp_path / "eva").glob("eva-*.pt"))
    assert len(files) == 1
    monkeypatch.setattr("ensemble_bench.eva_cache.build_projection", lambda *a: pytest.fail("rebuilt"))
    second = Eva(pair(), EvaParams(lead=0))
    assert torch.equal(first.projections[1].weight, second.projections[1].weight)
    assert outputs(first, REQUESTS) == outputs(second, REQUESTS)


def test_a_damaged_cache_file_is_rebuilt(pair, tmp_path):
    members = pair()
    Eva(members, EvaParams(lead=1))
    (path,) = (tmp_path / "eva").glob("eva-*.pt")
    path.write_bytes(b"not a tensor file")
    assert len(Eva(members, EvaParams(lead=1)).projections[0].src) > 0
    assert path.stat().st_size > 100


def test_other_parameters_are_another_cache_entry(pair, tmp_path):
    members = pair()
    aux, lead = members[1], members[0]
    key = [[aux.vocab, lead.vocab], [sorted(aux.stop_ids), sorted(lead.stop_ids)],
           [aux.output_embeddings(), lead.output_embeddings()]]
    assert projection_path(*key, AlignParams(), tmp_path) != projection_path(*key, AlignParams(top_t=3), tmp_path)


def test_stop_ids_map_to_the_leads_stop(pair):
    members = pair()
    method = Eva(members, EvaParams(lead=0))
    projection = method.projections[1]
    aux_stops = sorted(members[1].stop_ids)
    for stop in aux_stops:
        targets = projection.dst[projection.src == stop].tolist()
        assert len(targets) == 1 and targets[0] in members[0].stop_ids


def test_vocabularies_with_nothing_shared_are_refused(tmp_path):
    aux, lead = view([b"a", b"b"]), view([b"c", b"d"])
    with pytest.raises(ValueError, match="share 0 tokens"):
        cached_projection(aux, lead, [], [], torch.eye(2), torch.eye(2), AlignParams(), tmp_path)
