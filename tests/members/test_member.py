"""LocalMember: the cached, batched path equals a slow uncached loop; crop/keep; scoring."""

import pytest
import torch

from ensemble_bench.members import LocalMember, Prompt
from tests.tiny import tiny_llama
from tests.tolerances import TINY_MODEL, assert_close

PROMPTS = ["The quick brown", "Question: What is 12 plus 30?", "Caf", "def add(a, b):\n    return a + b\nJames and"]


def full_logprobs(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def slow_greedy(model, prompt_ids, steps):
    """Reference: no cache, one prompt at a time, the whole sequence recomputed every step."""
    seq, out = list(prompt_ids), []
    for _ in range(steps):
        token = int(full_logprobs(model, seq)[-1].argmax())
        out.append(token)
        seq.append(token)
    return out


def fast_greedy(member, prompts_ids, steps):
    logprobs = member.prefill(prompts_ids)
    out = [[] for _ in prompts_ids]
    for _ in range(steps):
        picks = logprobs.argmax(-1).tolist()
        for row, token in enumerate(picks):
            out[row].append(token)
        logprobs = member.extend([[t] for t in picks])
    return out


@pytest.fixture(params=["bpe", "sp"])
def member_and_model(request):
    tokenizer = request.getfixturevalue(f"{request.param}_tokenizer")
    model = request.getfixturevalue(f"{request.param}_model")
    return LocalMember(model, tokenizer, request.param), model


def test_batched_cached_decode_equals_slow_loop(member_and_model):
    member, model = member_and_model
    ids = [member.encode(p) for p in PROMPTS]
    assert len({len(i) for i in ids}) == 4  # different prompt lengths -> left padding
    fast = fast_greedy(member, ids, steps=16)
    assert fast == [slow_greedy(model, i, 16) for i in ids]


def test_variable_extend_crop_and_keep_match_recomputation(member_and_model):
    member, model = member_and_model
    ids = [member.encode(p) for p in PROMPTS]
    member.prefill(ids)
    member.extend([[5, 6], [7], [], [8, 9, 10]])
    member.crop([len(ids[0]) + 1, len(ids[1]), len(ids[2]), len(ids[3]) + 2])
    logprobs = member.extend([[11], [12, 13], [14], [15]])
    rows = member.row_ids()
    assert rows[0] == ids[0] + [5, 11] and rows[1] == ids[1] + [12, 13]
    assert rows[2] == ids[2] + [14] and rows[3] == ids[3] + [8, 9, 15]
    for r, row in enumerate(rows):
        assert_close(logprobs[r], full_logprobs(model, row)[-1], TINY_MODEL)
    member.keep([3, 1])
    logprobs = member.extend([[1], []])
    assert member.row_ids()[0] == rows[3] + [1] and member.row_ids()[1] == rows[1]
    assert_close(logprobs[0], full_logprobs(model, rows[3] + [1])[-1], TINY_MODEL)
    assert_close(logprobs[1], full_logprobs(model, rows[1])[-1], TINY_MODEL)


def test_repeated_prompts_are_prefilled_once_and_then_go_their_own_ways(member_and_model):
    """Rows 0, 2 and 3 hold one prompt (a request's repeats): the forward pass sees two rows, every
    row gets its own cache row, and each, given its own tokens, matches recomputation."""
    member, model = member_and_model
    same, other = member.encode(PROMPTS[1]), member.encode(PROMPTS[0])
    seen = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(kwargs["input_ids"].shape[0]),
                                           with_kwargs=True)
    try:
        first = member.prefill([same, other, same, same])
    finally:
        hook.remove()
    assert seen == [2]
    assert torch.equal(first[0], first[2]) and torch.equal(first[0], first[3])
    assert_close(first[1], full_logprobs(model, other)[-1], TINY_MODEL)
    logprobs = member.extend([[5], [6], [7, 8], [9]])
    for r, row in enumerate(member.row_ids()):
        assert_close(logprobs[r], full_logprobs(model, row)[-1], TINY_MODEL)
    assert member.row_ids()[2] == same + [7, 8]


def test_extend_after_crop_without_tokens_is_an_error_state(member_and_model):
    member, model = member_and_model
    ids = [member.encode(p) for p in PROMPTS[:2]]
    member.prefill(ids)
    member.extend([[3], [4]])
    member.crop([len(ids[0]), len(ids[1]) + 1])
    assert torch.isnan(member.extend([[], []])[0]).all()
    with pytest.raises(ValueError):
        member.crop([len(ids[0]) + 5, 1])  # cannot grow a row by cropping
    member.crop([0, len(ids[1])])  # a row may be emptied and refilled
    logprobs = member.extend([ids[0][:2], []])
    assert member.row_ids()[0] == ids[0][:2]
    assert_close(logprobs[0], full_logprobs(model, ids[0][:2])[-1], TINY_MODEL)


def test_score_matches_direct_computation(member_and_model):
    member, model = member_and_model
    context, continuation = member.encode(PROMPTS[1]), [7, 8, 9]
    direct = full_logprobs(model, context + continuation)
    expected = sum(float(direct[len(context) - 1 + k, t]) for k, t in enumerate(continuation))
    greedy = slow_greedy(model, context, 3)
    scores = member.score([(context, continuation), (member.encode(PROMPTS[0]), [4])], batch_size=2)
    assert_close(scores[0].logprob, expected, TINY_MODEL)
    assert scores[0].is_greedy == (greedy == continuation)
    assert member.score([(context, greedy)])[0].is_greedy


def test_stop_ids_and_padded_head(bpe_tokenizer):
    model = tiny_llama(len(bpe_tokenizer), seed=3, head_size=len(bpe_tokenizer) + 24)
    member = LocalMember(model, bpe_tokenizer, "padded")
    assert member.vocab.size == len(bpe_tokenizer) + 24
    ends = {bpe_tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    assert ends <= member.stop_ids
    assert member.prefill([member.encode("hi")]).shape == (1, len(bpe_tokenizer) + 24)


def test_render_uses_chat_template_or_plain_text(bpe_tokenizer, sp_tokenizer, bpe_model, sp_model):
    chat = Prompt(messages=(("user", "Q: 1+1?\nA:"),))
    bpe = LocalMember(bpe_model, bpe_tokenizer, "bpe")
    assert bpe.render_text(chat) == "<|im_start|>user\nQ: 1+1?\nA:<|im_end|>\n<|im_start|>assistant\n"
    sp = LocalMember(sp_model, sp_tokenizer, "sp")  # no chat template: the contents as plain text
    assert sp.render_text(chat) == "Q: 1+1?\nA:"
    assert LocalMember(bpe_model, bpe_tokenizer, "off", chat_template=False).render_text(chat) == "Q: 1+1?\nA:"


def test_encode_pair_follows_hflm_convention(bpe_tokenizer, bpe_model):
    member = LocalMember(bpe_model, bpe_tokenizer, "bpe")
    context, continuation = member.encode_pair("Question: what? Answer: ", "forty two")
    assert member.decode(context) == "Question: what? Answer:"
    assert member.decode(continuation) == " forty two"
    empty_context, cont = member.encode_pair("", "hello")
    assert empty_context == [member.prefix_token_id] and member.decode(cont) == "hello"


def test_extending_few_rows_of_many_runs_only_those_rows(member_and_model):
    """The sub-batch path (at most half the rows get tokens) matches recomputation too."""
    member, model = member_and_model
    ids = [member.encode(p) for p in PROMPTS]
    member.prefill(ids)
    logprobs = member.extend([[], [5, 6, 7], [], []])
    assert member.row_ids()[1] == ids[1] + [5, 6, 7] and member.row_ids()[0] == ids[0]
    logprobs = member.extend([[9], [], [], [8]])  # half the rows: still the sub-batch path
    logprobs = member.extend([[4], [3], [2], [1]])
    for r, row in enumerate(member.row_ids()):
        assert_close(logprobs[r], full_logprobs(model, row)[-1], TINY_MODEL)
    assert fast_greedy(member, ids, 3) == [slow_greedy(model, i, 3) for i in ids]
