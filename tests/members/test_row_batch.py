"""RowBatch (members/rows.py): the batch bookkeeping every member composes, and the padding and
batching helpers of ensemble_bench/members/batching.py."""

import math

import pytest
import torch

from ensemble_bench.members import LocalMember
from ensemble_bench.members.batching import in_batches, left_padded, positions_of, right_padded
from ensemble_bench.members.rows import RowBatch
from ensemble_bench.members.seq2seq import SOURCE_END, Seq2SeqMember
from tests.tiny_seq2seq import nllb_style_tokenizer, tiny_m2m100
from tests.tolerances import TINY_MODEL, assert_close

VOCAB = 6


def batch_of(rows: list[list[int]]) -> RowBatch:
    """A batch whose rows hold ``rows`` and whose distributions are the row index, everywhere."""
    batch = RowBatch(VOCAB, torch.device("cpu"))
    batch.start(len(rows))
    active = batch.take(rows)
    batch.set_last(active, torch.arange(len(active), dtype=torch.float32)[:, None].expand(-1, VOCAB).clone())
    return batch


def test_a_row_kept_twice_gets_its_own_ids():
    batch = batch_of([[1, 2], [3]])
    batch.keep([0, 0])
    batch.take([[7], []])
    assert batch.row_ids() == [[1, 2, 7], [1, 2]]
    assert batch.last[:, 0].tolist() == [0.0, 0.0]


def test_set_last_replaces_only_the_rows_that_moved_and_never_writes_a_returned_tensor():
    batch = batch_of([[1], [2], [3]])
    returned = batch.last
    active = batch.take([[], [4], []])
    batch.set_last(active, torch.full((1, VOCAB), 9.0))
    assert batch.last[:, 0].tolist() == [0.0, 9.0, 2.0]
    assert returned[:, 0].tolist() == [0.0, 1.0, 2.0]


def test_set_last_of_takes_the_moved_rows_from_a_whole_batch_and_never_writes_a_returned_tensor():
    batch = batch_of([[1], [2], [3]])
    returned = batch.last
    active = batch.take([[4], [], [5]])
    batch.set_last_of(active, torch.full((3, VOCAB), 9.0))
    assert batch.last[:, 0].tolist() == [9.0, 1.0, 9.0]
    assert returned[:, 0].tolist() == [0.0, 1.0, 2.0]


def test_crop_checks_every_row_first_then_rolls_back_and_blanks_the_cropped_rows():
    batch = batch_of([[1, 2, 3], [4, 5]])
    with pytest.raises(ValueError, match="row 1: cannot crop 2 tokens to 3"):
        batch.crop([1, 3])
    assert batch.row_ids() == [[1, 2, 3], [4, 5]]  # the bad call changed nothing
    assert batch.crop([1, 2]) == [2, 0]
    assert batch.row_ids() == [[1], [4, 5]]
    assert math.isnan(batch.last[0, 0]) and batch.last[1, 0] == 1.0


def test_a_step_must_name_every_row():
    batch = batch_of([[1], [2]])
    with pytest.raises(ValueError, match="extend got 1 rows, the batch has 2"):
        batch.check([[3]])


def test_padding_puts_real_tokens_at_the_end_or_at_the_start():
    ids, mask = left_padded([[5, 6], [7], []], pad_id=0)
    assert ids.tolist() == [[5, 6], [0, 7], [0, 0]] and mask.tolist() == [[1, 1], [0, 1], [0, 0]]
    assert positions_of(mask).tolist() == [[0, 1], [0, 0], [0, 0]]
    ids, mask = right_padded([[5, 6], [7]], pad_id=0)
    assert ids.tolist() == [[5, 6], [7, 0]] and mask.tolist() == [[1, 1], [1, 0]]
    assert right_padded([[], []], pad_id=9)[0].tolist() == [[9], [9]]  # at least one column


def test_in_batches_runs_longest_first_and_answers_in_request_order():
    seen = []

    def run(batch):
        seen.append(batch)
        return [f"answer {i}" for i in batch]

    assert in_batches([1, 5, 3], 2, run) == ["answer 0", "answer 1", "answer 2"]
    assert seen == [[1, 2], [0]]


def local_member(bpe_tokenizer, bpe_model):
    member = LocalMember(bpe_model, bpe_tokenizer, "causal")
    return member, [member.encode("The quick brown"), member.encode("Caf")]


def seq2seq_member():
    tokenizer = nllb_style_tokenizer()
    member = Seq2SeqMember(tiny_m2m100(tokenizer), tokenizer, "seq2seq")
    return member, [tokenizer.encode(text) + [SOURCE_END, member.start_id] for text in ("Hello there", "Hi")]


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_a_repeated_row_forks_into_two_rows_that_decode_apart(request, kind):
    """keep([0, 0]) then different tokens per copy: each copy holds its own ids and cache, and gives
    what a fresh prefill of its ids gives."""
    if kind == "causal":
        member, rows = local_member(request.getfixturevalue("bpe_tokenizer"), request.getfixturevalue("bpe_model"))
    else:
        member, rows = seq2seq_member()
    member.prefill(rows)
    member.keep([0, 0])
    forked = member.extend([[5], [6, 7]])
    prompt_ids = member.row_ids()[0][:-1]
    assert member.row_ids() == [prompt_ids + [5], prompt_ids + [6, 7]]
    source = rows[0][:rows[0].index(SOURCE_END) + 1] if kind == "seq2seq" else []
    fresh = member.prefill([source + ids for ids in ([*prompt_ids, 5], [*prompt_ids, 6, 7])])
    assert_close(forked, fresh, TINY_MODEL)
