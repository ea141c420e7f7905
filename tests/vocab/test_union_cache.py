"""GaC's union cache (vocab/union_cache.py): plain tensors read with weights_only=True give back exactly
what build_union builds, and a damaged file is rebuilt instead of failing the run."""

import pytest
import torch

from ensemble_bench.vocab import build_vocab_view
from ensemble_bench.vocab.union import build_union
from ensemble_bench.vocab.union_cache import cached_union, union_path


@pytest.fixture()
def vocabularies(bpe_tokenizer, sp_tokenizer):
    views = [build_vocab_view(bpe_tokenizer, len(bpe_tokenizer)), build_vocab_view(sp_tokenizer, len(sp_tokenizer))]
    return views, [[bpe_tokenizer.eos_token_id], [sp_tokenizer.eos_token_id]]


def assert_same_union(got, expected):
    assert got.entries == expected.entries
    assert torch.equal(got.stop_mask, expected.stop_mask)
    assert len(got.maps) == len(expected.maps)
    for mine, theirs in zip(got.maps, expected.maps):
        assert torch.equal(mine.src_ids, theirs.src_ids) and torch.equal(mine.union_ids, theirs.union_ids)
        assert torch.equal(mine.to_member, theirs.to_member)
        assert mine.by_bytes == theirs.by_bytes


def test_round_trip_equals_build_union(vocabularies, tmp_path):
    views, stops = vocabularies
    expected = build_union(views, stops)
    assert_same_union(cached_union(views, stops, tmp_path), expected)  # built and written
    path = union_path(views, stops, tmp_path)
    assert path.exists() and list(tmp_path.iterdir()) == [path]
    torch.load(path, weights_only=True)  # plain tensors only
    assert_same_union(cached_union(views, stops, tmp_path), expected)  # read back


@pytest.mark.parametrize("damage", [b"", b"not a torch file", "truncated", "wrong tensors"])
def test_a_damaged_file_is_rebuilt(vocabularies, tmp_path, damage):
    views, stops = vocabularies
    expected = cached_union(views, stops, tmp_path)
    path = union_path(views, stops, tmp_path)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    elif damage == "wrong tensors":
        torch.save({"entry_bytes": torch.zeros(3, dtype=torch.uint8), "entry_offsets": torch.tensor([0, 5]),
                    "stop_mask": torch.zeros(1, dtype=torch.bool), "src_ids": [], "union_ids": []}, path)
    else:
        path.write_bytes(damage)
    assert_same_union(cached_union(views, stops, tmp_path), expected)
    assert_same_union(cached_union(views, stops, tmp_path), expected)  # the rewritten file reads back
