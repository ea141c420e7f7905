"""The optimised member step (issue 28) gives the plain step's log-probs.

The plain step is the reference: the forward pass with every position's logits, upcast, an
out-of-place float32 log-softmax, the cache re-aligned after every call and the next-token rows
copied into a new tensor. The optimised one keeps only the needed positions' logits, writes the
log-softmax over them and skips the re-alignment and the copy where they change nothing. Both
run the same calls (batched and unbatched, with and without padding, ragged extends, crop, keep,
the few-rows path, scored extends); every returned distribution must be bit-identical.
"""

import pytest
import torch

from ensemble_bench.members import LocalMember
from ensemble_bench.members.kv import CachedRows
from ensemble_bench.members.local import log_probs_of
from ensemble_bench.members.seq2seq import Seq2SeqMember
from tests.tiny_seq2seq import nllb_style_tokenizer, tiny_m2m100, tiny_t5
from tests.tolerances import TINY_MODEL, assert_close

PROMPTS = ["The quick brown", "Question: What is 12 plus 30?", "Caf", "def add(a, b):\n    return a + b\nJames and"]


def plain_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """The reference: upcast, then a new float32 log-softmax tensor."""
    return logits.float().log_softmax(dim=-1)


class RealignedRows(CachedRows):
    """The plain step's batch: the cache re-aligned after every call."""

    def realign(self, evenly):
        super().realign(evenly=False)


class PlainLocal(LocalMember):
    """LocalMember with the plain step (the one before issue 28): the needed positions through the
    head, out-of-place log-softmax, re-alignment after every call."""

    full_head = False  # True: every position through the head (not bit-identical: other matmul shapes)

    def _forward(self, cache, mask, ids, new_mask, phase, keep=1):
        mask = torch.cat([mask, new_mask.to(self.device)], dim=1)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, -ids.shape[1]:]
        with torch.no_grad():
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask, position_ids=positions, use_cache=True,
                             logits_to_keep=0 if self.full_head else keep, **{self.cache_argument: cache})
        return plain_logprobs(out.logits)[:, -keep:], mask


class FullHeadLocal(PlainLocal):
    full_head = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch = RealignedRows(self.vocab.size, self.device)


class PlainSeq2Seq(Seq2SeqMember):
    """Seq2SeqMember with the plain step: out-of-place log-softmax, the next-token rows always
    copied into a new tensor, re-alignment after every call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch = RealignedRows(self.vocab.size, self.device)

    def _forward(self, ids, new_mask, phase):
        mask = self.batch.mask = torch.cat([self.batch.mask, new_mask.to(self.device)], dim=1)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, -ids.shape[1]:]
        if self._positions is not None:
            self._positions.positions = positions
        try:
            with torch.no_grad():
                out = self.model(encoder_outputs=(self._encoded,), attention_mask=self._encoder_mask,
                                 decoder_input_ids=ids.to(self.device), decoder_attention_mask=mask,
                                 use_cache=True, **{self.cache_argument: self._cache})
        finally:
            if self._positions is not None:
                self._positions.positions = None
        return plain_logprobs(out.logits)

    def _next_logprobs(self, logprobs, rows, active, evenly):
        index = torch.tensor(active, dtype=torch.long)
        ends = torch.tensor([len(rows[r]) - 1 for r in active], dtype=torch.long)
        return logprobs[index, ends]


def greedy(logprobs: torch.Tensor) -> list[list[int]]:
    return [[t] for t in logprobs.argmax(dim=-1).tolist()]


def drive(member, rows: list[list[int]]) -> list:
    """A fixed run of calls; every distribution returned (and each scored list), in order."""
    seen = [member.prefill(rows)]
    for _ in range(3):
        seen.append(member.extend(greedy(seen[-1])))
    if len(rows) == 1:
        logprobs, scored = member.extend_scored([[4, 5, 6]])
        return seen + [logprobs, scored, member.extend([[7]]), member.row_ids()]
    ragged = [[5, 6], [7], [], [8, 9, 10]][:len(rows)]
    seen.append(member.extend(ragged))
    seen.append(member.extend([[9]] + [[]] * (len(rows) - 1)))  # the few-rows path
    lengths = [len(ids) for ids in member.row_ids()]
    member.crop([lengths[0] - 1] + lengths[1:])
    seen.append(member.extend([[11]] + [[12]] * (len(rows) - 1)))
    member.keep(list(range(len(rows)))[::-1][:2])
    seen.append(member.extend([[3], [4]]))
    logprobs, scored = member.extend_scored([[4, 5, 6], [7]])
    seen += [logprobs, scored]
    for _ in range(2):
        logprobs = member.extend(greedy(logprobs))
        seen.append(logprobs)
    return seen + [member.row_ids()]


def assert_same_run(fast: list, plain: list, exact: bool = True) -> None:
    """Bit-identical distributions (``exact``: the same matmul shapes), else within TINY_MODEL with the
    same argmax; the same scored lists (exact, else within TINY_MODEL) and row ids."""
    assert len(fast) == len(plain)
    for got, want in zip(fast, plain):
        if isinstance(want, torch.Tensor):
            assert got.dtype == torch.float32 and got.shape == want.shape and torch.equal(got.isnan(), want.isnan())
            if exact:
                assert torch.equal(got.nan_to_num(), want.nan_to_num())
            else:
                assert_close(got, want, TINY_MODEL, same_argmax=True)
        else:  # scored lists or row ids: lists of lists
            if exact or not want or isinstance(want[0][0], int):  # row ids are exact on every path
                assert got == want
            else:
                assert_close(got, want, TINY_MODEL)


def causal_rows(member, shape: str) -> list[list[int]]:
    ids = [member.encode(p) for p in PROMPTS]
    if shape == "unbatched":
        return ids[3:]
    if shape == "unpadded":
        width = min(len(i) for i in ids)
        return [i[:width] for i in ids]
    assert len({len(i) for i in ids}) == 4  # different lengths: left padding
    return ids


@pytest.mark.parametrize("kind", ["bpe", "sp"])
@pytest.mark.parametrize("shape", ["unbatched", "unpadded", "padded"])
def test_local_step_equals_the_plain_step(request, kind, shape):
    tokenizer, model = request.getfixturevalue(f"{kind}_tokenizer"), request.getfixturevalue(f"{kind}_model")
    fast, plain = LocalMember(model, tokenizer, "fast"), PlainLocal(model, tokenizer, "plain")
    rows = causal_rows(fast, shape)
    assert_same_run(drive(fast, rows), drive(plain, rows))
    full_head = drive(FullHeadLocal(model, tokenizer, "full head"), rows)
    assert_same_run(drive(LocalMember(model, tokenizer, "again"), rows), full_head, exact=False)


@pytest.fixture(scope="module")
def s2s_tokenizer():
    return nllb_style_tokenizer()


@pytest.mark.parametrize("build", [tiny_m2m100, tiny_t5])
@pytest.mark.parametrize("shape", ["unbatched", "unpadded", "padded"])
def test_seq2seq_step_equals_the_plain_step(s2s_tokenizer, build, shape):
    model = build(s2s_tokenizer)
    fast, plain = Seq2SeqMember(model, s2s_tokenizer, "fast"), PlainSeq2Seq(model, s2s_tokenizer, "plain")
    sources = [s2s_tokenizer.encode(p) for p in PROMPTS]
    decoders = {"unbatched": [[fast.start_id]], "unpadded": [[fast.start_id, 9]] * 4,
                "padded": [[fast.start_id], [fast.start_id, 9, 10], [fast.start_id, 9], [fast.start_id]]}[shape]
    rows = [source + [-1] + decoder for source, decoder in zip(sources[len(sources) - len(decoders):], decoders)]
    assert_same_run(drive(fast, rows), drive(plain, rows))


def test_a_scored_extend_of_most_rows_equals_the_plain_step(bpe_tokenizer, bpe_model):
    """Three of four rows take tokens: the forward pass runs every row and the waiting row keeps its
    distribution (``RowBatch.set_last_of``), with no copy of the moving rows."""
    runs = []
    for member in (LocalMember(bpe_model, bpe_tokenizer, "fast"), PlainLocal(bpe_model, bpe_tokenizer, "plain")):
        first = member.prefill(causal_rows(member, "padded"))
        logprobs, scored = member.extend_scored([[4, 5, 6], [7], [], [8, 9]])
        assert torch.equal(logprobs[2], first[2])  # the waiting row keeps its distribution
        runs.append([first, logprobs, scored, member.extend(greedy(logprobs)), member.row_ids()])
    assert_same_run(*runs)


def test_returned_distributions_are_never_changed_later(bpe_tokenizer, bpe_model):
    member = LocalMember(bpe_model, bpe_tokenizer, "m")
    rows = causal_rows(member, "padded")
    first = member.prefill(rows)
    kept = first.clone()
    second = member.extend(greedy(first))
    member.extend(greedy(second))
    member.crop([len(ids) - 1 for ids in member.row_ids()])
    assert torch.equal(first, kept)
    assert not second.is_inference()  # ordinary tensors: a method may write into them (span_level does)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_in_place_log_softmax_is_bit_identical(dtype):
    torch.manual_seed(0)
    for scale in (1.0, 30.0, 300.0):  # flat to very peaked (most exps underflow)
        logits = (torch.randn(5, 3, 4099) * scale).to(dtype)
        want = plain_logprobs(logits)
        with torch.inference_mode():
            got = log_probs_of(logits.clone())
            sliced = log_probs_of(logits.clone()[:, -1:, :])  # a non-contiguous slice
        assert got.dtype == torch.float32 and torch.equal(got, want)
        assert torch.equal(sliced, want[:, -1:, :])
