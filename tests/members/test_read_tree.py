"""LocalMember.read_tree: a tree of tokens read in one forward pass equals extending each node's
path step by step, and leaves the rows as they were."""

import pytest
import torch

from ensemble_bench.members import LocalMember
from ensemble_bench.members.local import tree_visibility
from tests.tolerances import TINY_MODEL, assert_close


def test_tree_visibility_marks_ancestors_and_depths():
    seen, depths = tree_visibility([[-1, 0, 0, 2], [-1, -1]], 4)
    assert seen[0, 3].tolist() == [True, False, True, True]
    assert seen[0, 1].tolist() == [True, True, False, False]
    assert depths.tolist() == [[0, 1, 1, 2], [0, 0, 0, 0]]
    assert seen[1, 1].tolist() == [False, True, False, False] and seen[1, 3].tolist() == [False, False, False, True]
    with pytest.raises(ValueError, match="parent 1"):
        tree_visibility([[-1, 1]], 2)


def path_of(parents, tokens, n):
    path = []
    while n >= 0:
        path.append(tokens[n])
        n = parents[n]
    return path[::-1]


def test_tree_equals_extending_each_path(bpe_tokenizer, bpe_model):
    member = LocalMember(bpe_model, bpe_tokenizer, "m")
    prompts = [member.encode("The quick brown"), member.encode("Hi"), member.encode("Once upon a time there")]
    tokens = [[5, 9, 11, 9, 30], [], [7, 8]]
    parents = [[-1, 0, 0, -1, 3], [], [-1, 0]]
    first = member.prefill(prompts).clone()
    read = member.read_tree(tokens, parents)
    assert [r.shape[0] for r in read] == [5, 0, 2]
    assert member.row_ids() == prompts
    assert_close(member.extend([[], [], []]), first, TINY_MODEL)
    again = member.extend([[3], [4], [6]])
    member.prefill(prompts)
    assert_close(member.extend([[3], [4], [6]]), again, TINY_MODEL)  # the cache was left as it was
    for r, prompt in enumerate(prompts):
        for n in range(len(tokens[r])):
            member.prefill([prompt + path_of(parents[r], tokens[r], n)])
            assert_close(read[r][n], member.extend([[]])[0], TINY_MODEL)


def test_rows_of_different_lengths_after_crops(bpe_tokenizer, bpe_model):
    """Left padding inside the cache (a cropped row) is masked from the tree's nodes."""
    member = LocalMember(bpe_model, bpe_tokenizer, "m")
    prompts = [member.encode("The quick brown fox jumps"), member.encode("A cat")]
    member.prefill(prompts)
    member.crop([3, 2])
    member.extend([[12, 13], [14]])
    held = member.row_ids()
    read = member.read_tree([[20, 21], [22]], [[-1, 0], [-1]])
    for r, (row, expect) in enumerate(zip(held, [[20, 21], [22]])):
        member.prefill([row + expect])
        assert_close(read[r][-1], member.extend([[]])[0], TINY_MODEL)


def test_a_remote_member_reads_the_same_tree(ray_members):
    local, remote = ray_members
    for near, far in zip(local, remote):
        prompts = [near.encode("The quick brown"), near.encode("Hi there")]
        tokens, parents = [[5, 9, 11], [7]], [[-1, 0, -1], [-1]]
        near.prefill(prompts)
        far.prefill(prompts)
        for a, b in zip(near.read_tree(tokens, parents), far.read_tree(tokens, parents)):
            assert torch.equal(a, b)
        assert far.row_ids() == far.remote_row_ids() == prompts
        assert far.reads_trees
