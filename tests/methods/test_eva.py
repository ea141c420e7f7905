"""EVA (methods/eva.py, vocab/eva_map.py, vocab/csls.py): the alignment's steps against naive computations,
the faithfulness filter, the projection, and the cache. The contract (identity, batch invariance, Ray)
is in test_method_contract.py, speculative == every-token in test_speculative.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ensemble_bench.members import LocalMember, Prompt, load_listener
from ensemble_bench.members.loading import Stage
from ensemble_bench.methods import LoglikelihoodRequest
from ensemble_bench.methods.eva import Eva, EvaParams, faithful, top_k_probs
from ensemble_bench.vocab import csls, eva_map
from ensemble_bench.vocab.bytes_view import VocabView
from ensemble_bench.vocab.csls import CslsParams, kept_scores, similarity_map
from ensemble_bench.vocab.eva_cache import cached_projection, projection_path
from ensemble_bench.vocab.eva_map import AlignParams, VocabProjection, seed_pairs
from tests.tiny import CORPUS, REQUESTS, outputs
from tests.tolerances import FLOAT32_SUMS, assert_close

SCORED = [LoglikelihoodRequest(Prompt(text=CORPUS[i][:30]), CORPUS[i][30:30 + n]) for i in range(3) for n in (1, 7)]


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
    xs, zs = unit(xw), unit(zw)
    assert (xs @ zs.T).argmax(axis=1).tolist() == list(range(300))  # unseen tokens too find their twin


def test_supervised_mapping_takes_members_of_different_widths():
    generator = np.random.default_rng(1)
    x = generator.normal(size=(80, 6)).astype(np.float32)
    z = np.concatenate([x, generator.normal(size=(80, 3)).astype(np.float32) * 0.01], axis=1)
    xw, zw = eva_map.supervised_mapping(x, z, np.arange(60), np.arange(60))
    assert xw.shape == zw.shape == (80, 6)


def unit(matrix):
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def unit_rows(generator, rows: int, width: int) -> np.ndarray:
    return unit(generator.normal(size=(rows, width)).astype(np.float32))


def naive_map(x, z, rows, params, excluded=()):
    """Dense CSLS, top-t, threshold and variance rule, one row at a time (the authors' loop); unit rows."""
    cos = x @ z.T
    hub = np.sort(cos.T, axis=1)[:, ::-1][:, :params.neighborhood].mean(axis=1)
    hub[list(excluded)] = np.inf
    found = []
    for row in rows:
        scores = 2 * cos[row] - hub
        top = np.argsort(-scores, kind="stable")[:params.top_t]
        kept = [(int(j), float(scores[j])) for j in top if scores[j] >= params.threshold]
        values = np.array([v for _, v in kept])
        if kept and not (values.std() <= params.variance and len(kept) > csls.CROWDED):
            found += [(int(row), j, v) for j, v in kept]
    return sorted(found)


@pytest.mark.parametrize("params", [CslsParams(), CslsParams(top_t=3, threshold=0.3, neighborhood=2),
                                    CslsParams(top_t=8, threshold=-5.0, variance=10.0)])
@pytest.mark.parametrize("kept", [32, 1])
def test_similarity_map_equals_the_dense_computation(monkeypatch, params, kept):
    """One pass with the running hubness equals the dense two-pass computation, both for the rows its
    kept tokens settle and for those scored again (few kept tokens: many rows)."""
    monkeypatch.setattr(csls, "CHUNK_ROWS", 7)  # several chunks, the first with a poor running hubness
    monkeypatch.setattr(csls, "KEPT", kept)
    rescored = []
    monkeypatch.setattr(csls, "_rescored", lambda xs, zs, rows, *rest, rescore=csls._rescored: (
        rescored.extend(rows.tolist()) or rescore(xs, zs, rows, *rest)))
    generator = np.random.default_rng(2)
    x, z = unit_rows(generator, 60, 5), unit_rows(generator, 80, 5)
    rows = np.arange(3, 60)
    src, dst, score = similarity_map(x, z, rows, params, excluded=[0, 1])
    got = sorted(zip(src.tolist(), dst.tolist(), score.tolist()))
    expected = naive_map(x, z, rows, params, excluded=[0, 1])
    assert [(a, b) for a, b, _ in got] == [(a, b) for a, b, _ in expected]
    assert_close([s for *_, s in got], [s for *_, s in expected], FLOAT32_SUMS)
    assert all(b not in (0, 1) for _, b, _ in got)
    if kept < 32:
        assert 0 < len(rescored) < len(rows)  # both ways taken


def test_a_tie_at_the_last_place_kept_is_scored_the_direct_way(monkeypatch):
    """Lead tokens 1 and 2 are the same vector: auxiliary row 0 ties them at its 2nd and 3rd places (which one
    is kept is the direct computation's choice), row 1 at its 1st and 2nd (both kept either way)."""
    rescored = []
    monkeypatch.setattr(csls, "_rescored", lambda xs, zs, rows, *rest, rescore=csls._rescored: (
        rescored.extend(rows.tolist()) or rescore(xs, zs, rows, *rest)))
    x = np.array([[1, 0, 0], [0, 1, 0]], dtype=np.float32)
    z = unit(np.array([[1, 0, 0], [0.6, 0.8, 0], [0.6, 0.8, 0], [0, 0, 1]], dtype=np.float32))
    src, dst, _ = similarity_map(x, z, np.array([0, 1]), CslsParams(top_t=2, threshold=-10.0, variance=0.0))
    assert rescored == [0]
    pairs = sorted(zip(src.tolist(), dst.tolist()))
    assert pairs[0] == (0, 0) and pairs[1] in ((0, 1), (0, 2)) and pairs[2:] == [(1, 1), (1, 2)]


def test_similarity_map_reports_its_progress():
    heard = []
    x, z = unit_rows(np.random.default_rng(3), 30, 4), unit_rows(np.random.default_rng(4), 20, 4)
    similarity_map(x, z, np.arange(30), CslsParams(), report=lambda stage, done: heard.append((stage, done)))
    assert heard and heard[-1] == ("similarity", 1.0)
    assert [done for _, done in heard] == sorted(done for _, done in heard)


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


def dense(projection: VocabProjection, aux_size: int) -> torch.Tensor:
    matrix = torch.zeros((aux_size, projection.lead_size), dtype=torch.float64)
    matrix[projection.src, projection.dst] = projection.weight.double()
    return matrix


def test_a_target_outside_every_top_k_is_scored_by_the_whole_distributions(pair):
    """top_k 1: the step keeps one token per member, yet every target gets its share of the members' whole
    distributions averaged in the lead's space (not the floor -1e30), and the greedy flag is the step's."""
    method = Eva(pair(), EvaParams(lead=0, top_k=1, n=None))
    generator = torch.Generator().manual_seed(0)
    lead_size, aux_size = method.members[0].vocab.size, method.members[1].vocab.size
    logprobs = [torch.randn((2, lead_size), generator=generator).log_softmax(-1),
                torch.randn((2, aux_size), generator=generator).log_softmax(-1)]
    targets = [int(logprobs[0][0].argsort()[3]), int(logprobs[0][1].argmax())]  # a low token, the lead's best
    step = method._step(logprobs, targets)
    projected = logprobs[1].double().exp() @ dense(method.projections[1], aux_size)
    fused, total = logprobs[0].double().exp() + projected, 1 + projected.sum(dim=1)  # the lead's sums to 1
    expected = [math.log(fused[row, t] / total[row]) for row, t in enumerate(targets)]
    assert step.target_logprobs == pytest.approx(expected, abs=1e-9)
    assert step.choices == method._step(logprobs, None).choices


def test_scores_are_finite_and_rank_continuations_whatever_the_top_k(pair):
    method = Eva(pair(), EvaParams(lead=0, top_k=1))
    scores = [s.logprob for s in method.loglikelihood(SCORED)]
    assert all(-1e3 < score < 0 for score in scores)
    assert len(set(scores)) == len(scores)


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
    monkeypatch.setattr("ensemble_bench.vocab.eva_cache.build_projection", lambda *a: pytest.fail("rebuilt"))
    second = Eva(pair(), EvaParams(lead=0))
    assert torch.equal(first.projections[1].weight, second.projections[1].weight)
    assert outputs(first, REQUESTS) == outputs(second, REQUESTS)


def test_learning_the_map_says_its_stages_to_the_load_listeners_and_a_cached_one_nothing(pair):
    heard = []
    with load_listener(lambda member, event: heard.append((member, event))):
        Eva(pair(), EvaParams(lead=0))
        learned = len(heard)
        Eva(pair(), EvaParams(lead=0))
    stages = [event for _, event in heard[:learned]]
    assert {member for member, _ in heard} == {"sp"} and all(isinstance(e, Stage) for e in stages)
    assert [e.what.rpartition(", ")[2] for e in stages if e.done == 1] == ["mapping", "similarity"]
    assert stages[0].what == "learning EVA's map sp -> bpe (first use; cached after), mapping" and stages[0].done == 0
    assert len(heard) == learned  # read from the cache: nothing to say


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
