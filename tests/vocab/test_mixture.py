"""GaC's Eq. 3 as batched tensors (vocab/mixture.py): the top-k bound's greedy choice equals the
argmax of the full union projection, on hand-built, tiny and real vocabularies."""

import pytest
import torch

from ensemble_bench.vocab import VocabView, build_vocab_view
from ensemble_bench.vocab.mixture import UnionMixture, member_tables
from ensemble_bench.vocab.union import build_union


def hand_union():
    # B has two ids spelling ' Jam' (1 and 5): their probabilities add in the union.
    a = VocabView((b"<|im_end|>", b" James", b"a", b"es", b"\xc3", b"\xa9", None), frozenset({0}), "byte-level")
    b = VocabView((b"</s>", b" Jam", b"es", b"a", b"\xc3", b" Jam", b"<unk>"), frozenset({0, 6}), "sentencepiece")
    return build_union([a, b], [[0], [0]]), (7, 7)


def test_member_tables_list_every_id_of_an_entry():
    union, sizes = hand_union()
    tables = member_tables(union.maps[1], sizes[1], union.size)
    at = {e: k for k, e in enumerate(union.entries)}
    assert tables.width == 2
    assert tables.entry_ids[at[b" Jam"]].tolist() == [1, 5]
    assert tables.entry_ids[at[b"es"]].tolist() == [2, -1]
    assert tables.to_union[6] == -1 and tables.to_union[5] == at[b" Jam"]


def test_duplicate_ids_add_up_and_an_unseparated_row_falls_back():
    """' Jam' is two ids of 0.26 each in B: neither is B's top token, together they win. B's
    bound counts two ids per entry (2 x 0.26), so the bound cannot decide and the full path does."""
    union, sizes = hand_union()
    pa = torch.tensor([[0.02, 0.30, 0.08, 0.10, 0.20, 0.20, 0.10]])
    pb = torch.tensor([[0.01, 0.26, 0.05, 0.30, 0.06, 0.26, 0.06]])
    mixture = UnionMixture(union, [1.0, 1.0], sizes, top_k=2)
    logprobs = [pa.log(), pb.log()]
    assert union.entries[mixture.greedy(logprobs)[0]] == b" Jam"
    assert mixture.greedy(logprobs) == mixture.full(logprobs).argmax(dim=-1).tolist()
    assert mixture.bound.rows_decided == 0 and mixture.bound.rows_total == 2


def random_logprobs(rows, size, scale, generator):
    return (torch.randn((rows, size), generator=generator) * scale).log_softmax(dim=-1)


def check_greedy_equals_full(union, sizes, weights, scales, rows=64, seed=0):
    """Over flat and peaked random distributions: same choice; returns the share decided by the bound."""
    generator = torch.Generator().manual_seed(seed)
    mixture = UnionMixture(union, weights, sizes)
    for scale in scales:
        logprobs = [random_logprobs(rows, size, scale, generator) for size in sizes]
        assert mixture.greedy(logprobs) == mixture.full(logprobs).argmax(dim=-1).tolist(), scale
    return mixture.bound.rows_decided / mixture.bound.rows_total


def test_greedy_equals_full_on_tiny_vocabularies(bpe_tokenizer, sp_tokenizer):
    views = [build_vocab_view(bpe_tokenizer, len(bpe_tokenizer)), build_vocab_view(sp_tokenizer, len(sp_tokenizer))]
    union = build_union(views, [[bpe_tokenizer.eos_token_id], [sp_tokenizer.eos_token_id]])
    decided = check_greedy_equals_full(union, [len(bpe_tokenizer), len(sp_tokenizer)], [1.0, 3.0],
                                       scales=[0.1, 1.0, 3.0, 6.0])
    assert 0.0 < decided < 1.0  # both paths were taken: flat rows fall back, peaked ones do not


def test_identity_mixture_picks_the_members_own_argmax(bpe_tokenizer):
    view = build_vocab_view(bpe_tokenizer, len(bpe_tokenizer))
    union = build_union([view, view], [[0], [0]])
    generator = torch.Generator().manual_seed(3)
    logprobs = random_logprobs(32, len(bpe_tokenizer), 4.0, generator)
    chosen = UnionMixture(union, [1.0, 1.0], [len(bpe_tokenizer)] * 2).greedy([logprobs, logprobs])
    to_member = union.maps[0].to_member
    assert [int(to_member[c]) for c in chosen] == logprobs.argmax(dim=-1).tolist()


@pytest.mark.integration
@pytest.mark.parametrize("pair", [("llama3", "qwen2"), ("llama2", "llama3")])
def test_greedy_equals_full_on_real_vocabularies(pair):
    """Llama-3 (128k) + Qwen2 (152k, padded head), and Llama-2 (32k, duplicate byte strings)."""
    from ensemble_bench.members.local import stop_ids_of
    from ensemble_bench.members.vocab_files import load_vocab_tokenizer

    tokenizers = [load_vocab_tokenizer(name) for name in pair]
    sizes = [151936 if name == "qwen2" else len(t) for name, t in zip(pair, tokenizers)]
    views = [build_vocab_view(t, size) for t, size in zip(tokenizers, sizes)]
    stops = [sorted(stop_ids_of(t, None, v)) for t, v in zip(tokenizers, views)]
    union = build_union(views, stops)
    decided = check_greedy_equals_full(union, sizes, [1.0, 1.0], scales=[1.0, 3.0, 5.0, 8.0], rows=32)
    assert decided > 0.0
