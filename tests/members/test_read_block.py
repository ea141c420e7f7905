"""``read_block`` (a block of tokens per row in one forward pass) leaves a member as one-token
``extend`` calls would, and returns the distributions those calls return, for every member kind.

The reference is a fresh member of the same model fed the same blocks one token per ``extend``.
After the block read, ``extend([[]...])``, then a crop of every row to a prefix inside its block
and a different token (how a method keeps the agreeing prefix of a draft), must match it too.
"""

import pytest
import torch

from ensemble_bench.members import LocalMember
from ensemble_bench.members.seq2seq import SOURCE_END, Seq2SeqMember
from tests.tiny import CORPUS
from tests.tiny_seq2seq import nllb_style_tokenizer, tiny_m2m100, tiny_t5
from tests.tolerances import TINY_MODEL, assert_close

# (blocks, positions asked): ragged blocks with an empty and a one-token one; one row moving alone
# (LocalMember's few-rows path: its cache rows are copied out, extended and written back)
CASES = {"ragged": ([[5, 6, 7, 8], [], [9]], [[0, 2, 3], [], [0]]),
         "one row": ([[10, 11, 12], [], []], [[1, 2], [], []])}


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == torch.float32
    assert_close(got, want, TINY_MODEL, same_argmax=True)


def one_by_one(member, blocks, at) -> list[torch.Tensor]:
    """The reference read: one token per row per ``extend``; the distributions after the tokens ``at`` names."""
    after: list[list[torch.Tensor]] = [[] for _ in blocks]
    for i in range(max(len(block) for block in blocks)):
        logprobs = member.extend([block[i:i + 1] for block in blocks])
        for r, block in enumerate(blocks):
            if i < len(block):
                after[r].append(logprobs[r])
    empty = torch.empty((0, member.vocab.size))
    return [torch.stack([after[r][i] for i in wanted]) if wanted else empty for r, wanted in enumerate(at)]


def keep_prefix(member, blocks) -> list:
    """Crop every row to a prefix inside its block, give it a token other than the block's next
    one, then one greedy step; every distribution returned, and the rows' ids."""
    kept = [len(block) // 2 for block in blocks]
    lengths = [len(ids) - len(block) + k for ids, block, k in zip(member.row_ids(), blocks, kept)]
    member.crop(lengths)
    other = [[block[k] + 1 if k < len(block) else 3] for block, k in zip(blocks, kept)]
    first = member.extend(other)
    second = member.extend([[t] for t in first.argmax(-1).tolist()])
    return [first, second, member.row_ids()]


def check_block_read(member, reference, rows, blocks, at) -> None:
    member.prefill(rows)
    reference.prefill(rows)
    calls = member.clock.decode_calls
    got = member.read_block(blocks, at)
    assert member.clock.decode_calls == calls + 1  # one forward pass for the whole batch
    want = one_by_one(reference, blocks, at)
    assert len(got) == len(rows)
    for block, wanted in zip(got, want):
        assert_same(block, wanted)
    assert_same(member.extend([[] for _ in rows]), reference.extend([[] for _ in rows]))
    assert member.row_ids() == reference.row_ids()
    kept, kept_reference = keep_prefix(member, blocks), keep_prefix(reference, blocks)
    for got_step, want_step in zip(kept[:2], kept_reference[:2]):
        assert_same(got_step, want_step)
    assert kept[2] == kept_reference[2]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", ["bpe", "sp"])
def test_local_block_read_equals_one_token_extends(request, kind, case):
    tokenizer, model = request.getfixturevalue(f"{kind}_tokenizer"), request.getfixturevalue(f"{kind}_model")
    member, reference = LocalMember(model, tokenizer, "block"), LocalMember(model, tokenizer, "one by one")
    rows = [member.encode(CORPUS[i][:12 + 7 * i]) for i in range(3)]
    assert len({len(row) for row in rows}) == 3  # left padding
    check_block_read(member, reference, rows, *CASES[case])


@pytest.fixture(scope="module")
def s2s_tokenizer():
    return nllb_style_tokenizer()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("build", [tiny_m2m100, tiny_t5])
def test_seq2seq_block_read_equals_one_token_extends(s2s_tokenizer, build, case):
    model = build(s2s_tokenizer)
    member, reference = Seq2SeqMember(model, s2s_tokenizer, "block"), Seq2SeqMember(model, s2s_tokenizer, "one by one")
    start = member.start_id
    decoders = [[start], [start, 9, 10], [start, 9]]  # decoder prefixes of different lengths
    rows = [s2s_tokenizer.encode(CORPUS[i][:15 + 6 * i]) + [SOURCE_END] + d for i, d in enumerate(decoders)]
    check_block_read(member, reference, rows, *CASES[case])


def test_remote_block_read_equals_one_token_extends(ray_members):
    local, remote = ray_members
    loc, rem = local[0], remote[0]
    rows = [loc.encode(CORPUS[i][:12 + 7 * i]) for i in range(3)]
    calls = rem.traffic["step_calls"]
    check_block_read(rem, loc, rows, *CASES["ragged"])
    assert rem.traffic["step_calls"] == calls + 4  # prefill, the block read, two extends (an empty one sends nothing)
    assert rem.row_ids() == rem.remote_row_ids()


def test_a_block_read_returns_new_float32_rows_and_refuses_bad_positions(bpe_tokenizer, bpe_model):
    member = LocalMember(bpe_model, bpe_tokenizer, "m")
    member.prefill([member.encode(CORPUS[0][:20]), member.encode(CORPUS[1][:9])])
    got = member.read_block([[5, 6], []], [[1], []])
    last = member.extend([[], []])
    assert [tuple(block.shape) for block in got] == [(1, member.vocab.size), (0, member.vocab.size)]
    assert got[0].data_ptr() != last.data_ptr() and torch.equal(got[0][0], last[0])
    for bad in ([[2], []], [[1, 0], []], [[], [0]], [[0]]):
        with pytest.raises(ValueError):
            member.read_block([[5, 6], []], bad)
    calls = member.clock.decode_calls
    assert [tuple(b.shape) for b in member.read_block([[], []], [[], []])] == [(0, member.vocab.size)] * 2
    assert member.clock.decode_calls == calls and member.row_ids()[0][-2:] == [5, 6]  # nothing read, nothing lost
