"""`single` reproduces stock lm-eval HFLM: same greedy generations, log-likelihoods within TINY_MODEL."""

import pytest
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM

from ensemble_bench.members import LocalMember
from ensemble_bench.methods.single import Single
from ensemble_bench.run.lm import LM_CLASSES
from tests.tiny import CORPUS
from tests.tolerances import TINY_MODEL, assert_close


def instances(kind, arguments):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(arguments)]


def pair(tokenizer, model, batch_size=3, max_length=None):
    """HFLM and our `single` over the same model.

    HFLM stops only at the generation config's EOS ids while a member stops at every end marker
    of its vocabulary; the fixture's generation config lists all of them (as Llama-3's does), so
    both stop at the same ids. (With a config naming only one of them, the two can differ after
    a model emits another end marker: see docs/limitations.md.)
    """
    model.generation_config.eos_token_id = sorted(LocalMember(model, tokenizer, "probe").stop_ids)
    hflm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)
    member = LocalMember(model, tokenizer, "tiny")
    if max_length:
        member.max_length = max_length
    ours = LM_CLASSES["single"](Single([member], Single.Params(), batch_size=batch_size), "tiny")
    return hflm, ours


@pytest.fixture(params=["bpe", "sp"])
def models(request):
    return request.getfixturevalue(f"{request.param}_tokenizer"), request.getfixturevalue(f"{request.param}_model")


def test_generate_until_matches_hflm(models):
    tokenizer, model = models
    hflm, ours = pair(tokenizer, model)
    contexts = [CORPUS[i][: 10 + 7 * i] for i in range(6)]
    free = ours.generate_until(instances("generate_until",
                                         [(c, {"until": ["@@"], "max_gen_toks": 24}) for c in contexts]))
    stop_inside = free[2][len(free[2]) // 2: len(free[2]) // 2 + 2]  # a string the greedy output contains
    requests = [(c, {"until": ["@@"] if i % 2 else [stop_inside], "max_gen_toks": 12 + 4 * i})
                for i, c in enumerate(contexts)]
    expected = hflm.generate_until(instances("generate_until", requests))
    got = ours.generate_until(instances("generate_until", requests))
    assert got == expected
    assert stop_inside not in got[2] and len(got[2]) < len(free[2])  # cut at the request's own until


def test_loglikelihood_matches_hflm(models):
    tokenizer, model = models
    hflm, ours = pair(tokenizer, model)
    question = "Question: What is 12 plus 30?\nAnswer:"
    requests = [(question, " 42"), (question, " forty two"),
                ("The quick brown ", "fox jumps"), ("", "Café 東京"), ("James and Jamie", " went to the market")]
    expected = hflm.loglikelihood(instances("loglikelihood", requests))
    got = ours.loglikelihood(instances("loglikelihood", requests))
    for (lp_hf, greedy_hf), (lp, greedy) in zip(expected, got):
        assert_close(lp, lp_hf, TINY_MODEL)
        assert greedy == greedy_hf


def test_rolling_loglikelihood_matches_hflm(models):
    tokenizer, model = models
    hflm, ours = pair(tokenizer, model, max_length=32)
    texts = [" ".join(CORPUS[:6]), CORPUS[3]]
    expected = hflm.loglikelihood_rolling(instances("loglikelihood_rolling", [(t,) for t in texts]))
    got = ours.loglikelihood_rolling(instances("loglikelihood_rolling", [(t,) for t in texts]))
    assert_close(got, expected, TINY_MODEL)


def test_chat_rendering_matches_hflm(bpe_tokenizer, bpe_model):
    hflm, ours = pair(bpe_tokenizer, bpe_model)
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q: 2+2?\nA:"}]
    from ensemble_bench.run.answers import to_prompt

    prompt = to_prompt(ours.apply_chat_template(history))
    assert ours.method.member.render_text(prompt) == hflm.apply_chat_template(history)
