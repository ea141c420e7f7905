"""GaC's full-union path (vocab/mixture.py, issue 28): the gather into the union's layout gives
the same bits as the scatter-add it replaced, in blocks of rows or all at once, with duplicate ids
and any weights; sampling draws the same tokens as a naive per-row reference under the same
generators, whatever the other rows of the batch."""

import pytest
import torch

import ensemble_bench.vocab.mixture as mixture_module
from ensemble_bench.decoding.sampling import Sampler, SamplingParams, draw_blocks, inverse_cdf
from ensemble_bench.methods.gac import Gac, GacParams
from ensemble_bench.vocab import VocabView, build_vocab_view
from ensemble_bench.vocab.fast_topk import block_argmax
from ensemble_bench.vocab.mixture import UnionMixture
from ensemble_bench.vocab.union import build_union
from tests.naive import naive_sample
from tests.tiny import outputs, sampled


def scatter_add_full(union, weights, logprobs):
    """Eq. 3 as it was computed before issue 28: a zero-initialised scatter-add per member."""
    weights = torch.tensor(weights, dtype=torch.float32)
    mixed = torch.zeros((logprobs[0].shape[0], union.size), dtype=torch.float32)
    for mapping, lp, weight in zip(union.maps, logprobs, weights):
        projected = torch.zeros((lp.shape[0], union.size), dtype=torch.float32)
        projected.index_add_(1, mapping.union_ids, lp.exp()[:, mapping.src_ids])
        mixed += weight * projected
    return mixed / weights.sum()


def triple_union():
    """Three members; the second spells ' Jam' with three ids, the third lacks most entries."""
    a = VocabView((b"<|im_end|>", b" James", b"a", b"es", b"\xc3", b"\xa9", None), frozenset({0}), "byte-level")
    b = VocabView((b"</s>", b" Jam", b"es", b" Jam", b"a", b" Jam", b"<unk>", b"es"), frozenset({0, 6}),
                  "sentencepiece")
    c = VocabView((b"<eos>", b"zz", b"a"), frozenset({0}), "byte-level")
    return build_union([a, b, c], [[0], [0], [0]]), (7, 8, 3)


def random_logprobs(rows, sizes, scale, generator):
    return [(torch.randn((rows, size), generator=generator) * scale).log_softmax(dim=-1) for size in sizes]


@pytest.fixture()
def tiny_pair(bpe_tokenizer, sp_tokenizer):
    views = [build_vocab_view(bpe_tokenizer, len(bpe_tokenizer)), build_vocab_view(sp_tokenizer, len(sp_tokenizer))]
    union = build_union(views, [[bpe_tokenizer.eos_token_id], [sp_tokenizer.eos_token_id]])
    return union, (len(bpe_tokenizer), len(sp_tokenizer))


@pytest.mark.parametrize("weights", [[1.0, 1.0, 1.0], [0.3, 1.7, 2.0], [1.0, 0.0, 5.0]])
@pytest.mark.parametrize("block_bytes", [1, 1 << 30])  # one row per block, and every row at once
def test_full_equals_the_scatter_add_bit_for_bit(weights, block_bytes, monkeypatch):
    monkeypatch.setattr(mixture_module, "CPU_BLOCK_BYTES", block_bytes)
    union, sizes = triple_union()
    mixture = UnionMixture(union, weights, sizes, top_k=2)
    assert mixture._cpu[1].width == 3
    generator = torch.Generator().manual_seed(0)
    for scale in (0.1, 1.0, 4.0, 30.0, 300.0):  # 30 and 300: probabilities below e^-80 (LOG_FLOOR)
        logprobs = random_logprobs(5, sizes, scale, generator)
        expected = scatter_add_full(union, weights, logprobs)
        assert torch.equal(mixture.full(logprobs), expected), scale
        assert mixture._argmax_full(logprobs).tolist() == expected.argmax(dim=-1).tolist(), scale
        assert mixture.greedy(logprobs) == expected.argmax(dim=-1).tolist(), scale


@pytest.mark.parametrize("block_bytes", [1, 1 << 30])
def test_full_and_fallback_equal_the_scatter_add_on_tiny_vocabularies(tiny_pair, block_bytes, monkeypatch):
    monkeypatch.setattr(mixture_module, "CPU_BLOCK_BYTES", block_bytes)
    union, sizes = tiny_pair
    mixture = UnionMixture(union, [1.0, 3.0], sizes)
    generator = torch.Generator().manual_seed(1)
    for scale in (0.1, 1.0, 3.0, 300.0):  # flat ones fall back to the full projection
        logprobs = random_logprobs(7, sizes, scale, generator)
        expected = scatter_add_full(union, [1.0, 3.0], logprobs)
        assert torch.equal(mixture.full(logprobs), expected)
        assert mixture._argmax_full(logprobs).tolist() == expected.argmax(dim=-1).tolist()
        assert mixture.greedy(logprobs) == expected.argmax(dim=-1).tolist()
    assert mixture.bound.rows_decided < mixture.bound.rows_total



def test_the_bound_rests_after_deciding_nothing_and_outputs_stay_exact(tiny_pair, monkeypatch):
    """A call where the bound decides no row makes the next 1, then 3, 7, 15 calls skip it; a
    decided row resets that. Every call still returns the full projection's argmax."""
    union, sizes = tiny_pair
    mixture = UnionMixture(union, [1.0, 3.0], sizes)
    bounded_calls = []
    original = mixture._bounded
    monkeypatch.setattr(mixture, "_bounded", lambda lps: bounded_calls.append(call) or original(lps))
    generator = torch.Generator().manual_seed(2)
    kinds = ["flat", "peaked", "peaked", "flat", "flat", "flat", "peaked", "peaked", "peaked", "peaked"]
    for call, kind in enumerate(kinds):
        logprobs = random_logprobs(4, sizes, 0.0 if kind == "flat" else 300.0, generator)  # flat: uniform
        expected = scatter_add_full(union, [1.0, 3.0], logprobs).argmax(dim=-1).tolist()
        decided_before = mixture.bound.rows_decided
        assert mixture.greedy(logprobs) == expected, call
        if call in (2, 9):
            assert mixture.bound.rows_decided > decided_before, call
    assert bounded_calls == [0, 2, 3, 5, 9]


@pytest.mark.parametrize("size", [100, 1024, 1025, 5000, 128257])
def test_block_argmax_is_torch_argmax_with_ties_nan_and_infinities(size):
    generator = torch.Generator().manual_seed(size)
    values = torch.randint(0, 7, (6, size), generator=generator).float()  # many ties at the maximum
    values[1] = float("-inf")
    values[2, size // 2] = float("nan")
    values[2, size - 1] = float("nan")
    values[3, size - 1] = 9.0  # the maximum in the last (partial) block
    values[4] = torch.randn(size, generator=generator)
    values[5, :] = 1.0
    assert block_argmax(values).tolist() == values.argmax(dim=-1).tolist()
    assert block_argmax(values[2:4]).tolist() == values[2:4].argmax(dim=-1).tolist()

# ------------------------------------------------------------------ sampling
@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
@pytest.mark.parametrize("scale", [1.5, 30.0])
def test_sampling_equals_naive_sampling_whatever_the_batch(temperature, scale):
    union, sizes = triple_union()
    weights = [0.5, 1.0, 2.0]
    mixture = UnionMixture(union, weights, sizes)
    rows = random_logprobs(6, sizes, scale, torch.Generator().manual_seed(4))
    params = SamplingParams(do_sample=True, temperature=temperature)
    for seed in (0, 1, 2, 3):
        expected = {}
        generators = {k: torch.Generator().manual_seed(100 * seed + k) for k in range(6)}
        for step in range(5):  # each request's generator advances once per step
            expected[step] = [naive_sample(union, weights, [lp[k] for lp in rows], temperature, generators[k])
                              for k in range(6)]
        for batch in ([0, 1, 2, 3, 4, 5], [5, 3, 1], [2], [4, 0]):
            generators = {k: torch.Generator().manual_seed(100 * seed + k) for k in batch}
            for step in range(5):
                drawn = draw_blocks(mixture.log_blocks([lp[batch] for lp in rows]),
                                    [Sampler(params, generators[k]) for k in batch])
                assert drawn == [expected[step][k] for k in batch], (seed, batch, step)


def test_sampling_in_blocks_equals_sampling_at_once(tiny_pair, monkeypatch):
    union, sizes = tiny_pair
    mixture = UnionMixture(union, [1.0, 2.0], sizes)
    logprobs = random_logprobs(9, sizes, 2.0, torch.Generator().manual_seed(5))
    draws = []
    for block_bytes in (1, 1 << 30):
        monkeypatch.setattr(mixture_module, "CPU_BLOCK_BYTES", block_bytes)
        samplers = [Sampler(SamplingParams(do_sample=True, temperature=0.8), torch.Generator().manual_seed(k))
                    for k in range(9)]
        draws.append([draw_blocks(mixture.log_blocks(logprobs), samplers) for _ in range(4)])
    assert draws[0] == draws[1]


def test_draw_never_takes_an_entry_of_weight_zero():
    weights = torch.tensor([[0.0, 1.0, 0.0, 3.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    generators = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)]
    seen = [set(), set()]
    for _ in range(400):
        for row, index in enumerate(inverse_cdf(weights, generators).tolist()):
            seen[row].add(index)
    assert seen == [{1, 3}, {0}]


def test_gated_sampling_is_seeded_and_batch_invariant(pair):
    """The gate's own tokens are drawn on the device too (Eq. 5 with a temperature)."""
    def run(seed, batch_size):
        members = pair()
        params = GacParams(gate=0, threshold=0.05)
        return outputs(Gac(members, params, batch_size=batch_size), sampled(seed=seed, temperature=0.9))
    first = run(3, 3)
    assert run(3, 3) == first and run(3, 1) == first
    assert run(4, 3) != first
