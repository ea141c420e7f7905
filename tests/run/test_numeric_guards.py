"""Numbers at run time (issue 30): a NaN or infinite score stops the row in one line naming who gave
it, the request and the step; contexts longer than a member's window are cut from the left as
lm-eval's HFLM cuts them, and counted in the method's info()."""

import math

import pytest
import torch
from lm_eval.api.instance import Instance

from ensemble_bench.cli import main as cli
from ensemble_bench.decoding.decode import RequestState, check_distributions, decode_batch, text_of
from ensemble_bench.decoding.method import NonFiniteScore, Timing
from ensemble_bench.errors import UserError
from ensemble_bench.members import LocalMember, Prompt
from ensemble_bench.members.base import Score, fit_window
from ensemble_bench.members.local import max_length_of
from ensemble_bench.members.seq2seq import SOURCE_END, Seq2SeqMember
from ensemble_bench.methods import GenerationRequest, LoglikelihoodRequest
from ensemble_bench.methods.gac import Gac, GacParams
from ensemble_bench.methods.single import Single
from ensemble_bench.run.lm import LM_CLASSES
from tests.cli_helpers import one_line, raising, run_cli
from tests.tiny import CORPUS, tiny_llama
from tests.tiny_seq2seq import nllb_style_tokenizer, tiny_m2m100
from tests.tolerances import TINY_MODEL, assert_close

QUESTION = "Question: What is 12 plus 30?\nAnswer:"


def instances(kind, arguments, task="piqa"):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=0, metadata=(task, 10 + i, 1))
            for i, a in enumerate(arguments)]


@pytest.fixture(scope="module")
def nan_member(bpe_tokenizer):
    """A member whose weights hold a NaN: every logit, log-prob and score is NaN."""
    model = tiny_llama(len(bpe_tokenizer), seed=3)
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")
    return LocalMember(model, bpe_tokenizer, "broken")


def lm_of(method_name, members, **params):
    cls = {"single": Single, "gac": Gac}[method_name]
    return LM_CLASSES[method_name](cls(members, cls.Params(**params), batch_size=2), method_name)


def ensembles(nan_member, healthy):
    return {"single": [nan_member], "gac": [healthy, nan_member]}


# --- 1. non-finite scores -------------------------------------------------------------------------
@pytest.mark.parametrize("method_name", ["single", "gac"])
def test_a_nan_member_stops_loglikelihood_naming_member_request_and_step(method_name, nan_member, bpe_model,
                                                                         bpe_tokenizer):
    healthy = LocalMember(bpe_model, bpe_tokenizer, "healthy")
    lm = lm_of(method_name, ensembles(nan_member, healthy)[method_name])
    with pytest.raises(NonFiniteScore) as caught:
        lm.loglikelihood(instances("loglikelihood", [(QUESTION, " 42"), (QUESTION, " forty two")]))
    message = str(caught.value)
    assert "\n" not in message and caught.value.exit_code == 2
    assert message.startswith("member 'broken' gave a non-finite score (nan) scoring a continuation")
    assert "(piqa, document 1" in message and "' 42'" in message and "Answer:'" in message
    assert "float32 or bfloat16" in message
    assert lm.requests_computed == 0  # nothing reached lm-eval's response cache


@pytest.mark.parametrize("method_name", ["single", "gac"])
def test_a_nan_member_stops_generation_at_its_first_step(method_name, nan_member, bpe_model, bpe_tokenizer):
    healthy = LocalMember(bpe_model, bpe_tokenizer, "healthy")
    lm = lm_of(method_name, ensembles(nan_member, healthy)[method_name])
    requests = [(CORPUS[0][:20], {"until": ["\n"], "max_gen_toks": 5}), (CORPUS[1][:30], {"max_gen_toks": 5})]
    with pytest.raises(NonFiniteScore) as caught:
        lm.generate_until(instances("generate_until", requests, task="nq"))
    message = str(caught.value)
    assert message.startswith("member 'broken' gave a non-finite score (nan) at decoding step 0, for request 2 of 2 "
                              "(nq, document 11): context 'Question: What is 12 plus 30? '; ")


def test_nan_method_weights_stop_the_ensembles_loglikelihood(pair):
    """GaC's weights forced to NaN after recipe validation: the members are finite, their mixture is not."""
    gac = Gac(pair(), GacParams())
    gac.weights = torch.tensor([float("nan"), 1.0])
    lm = LM_CLASSES["gac"](gac, "gac")
    with pytest.raises(NonFiniteScore, match=r"^the ensemble gave a non-finite score \(nan\) combining its "
                                             r"members' scores, for request 1 of 1 \(piqa, document 10\)"):
        lm.loglikelihood(instances("loglikelihood", [("The quick brown ", "fox jumps")]))


def test_an_infinite_rolling_total_stops_the_row(bpe_model, bpe_tokenizer, monkeypatch):
    member = LocalMember(bpe_model, bpe_tokenizer, "inf")
    monkeypatch.setattr(member, "score", lambda pairs, batch_size=8: [Score(-math.inf, False) for _ in pairs])
    lm = lm_of("single", [member])
    with pytest.raises(NonFiniteScore, match=r"^member 'inf' gave a non-finite score \(-inf\) scoring a whole text, "
                                             r"for request 1 of 1 \(wikitext, document 10\)"):
        lm.loglikelihood_rolling(instances("loglikelihood_rolling", [(CORPUS[2],)], task="wikitext"))


class NamedMember:
    name = "m"

    def decode(self, ids):
        return "".join(chr(97 + i) for i in ids)


@pytest.mark.parametrize("row, refused", [
    ([0.0, -math.inf, -1.0], False),              # a masked token: probability 0 is a real distribution
    ([math.nan, -1.0, -2.0], True),
    ([math.inf, -1.0, -2.0], True),
    ([-math.inf, -math.inf, -math.inf], True),    # no token has any probability
])
def test_a_distribution_with_a_nan_inf_or_no_mass_is_refused(row, refused):
    dists = [torch.tensor([[0.0, -1.0, -2.0], row])]
    states = [RequestState.of(GenerationRequest(Prompt(text="x"), (), 4)) for _ in range(3)]
    states[2].count = 3
    check = lambda: check_distributions([NamedMember()], dists, [0, 2], [[[0], [1], [0, 1, 2]]], states)  # noqa: E731
    if not refused:
        check()
        return
    with pytest.raises(NonFiniteScore, match=r"^member 'm' gave a non-finite score .* at decoding step 3, for "
                                             r"request: context 'abc'") as caught:
        check()
    assert caught.value.row == 2


def test_a_non_finite_score_is_one_line_and_exit_2_through_the_cli(nan_member, monkeypatch, capsys):
    with pytest.raises(NonFiniteScore) as caught:
        lm_of("single", [nan_member]).loglikelihood(instances("loglikelihood", [(QUESTION, " 42")]))
    monkeypatch.setattr(cli, "app", raising(caught.value))
    code, out = run_cli(monkeypatch, capsys, "list")
    assert code == 2 and one_line(out).startswith("error: member 'broken' gave a non-finite score (nan)")


# --- 2. contexts longer than the window ------------------------------------------------------------
WINDOW = 16


@pytest.fixture(scope="module")
def short_and_long(bpe_tokenizer):
    """One model seen twice: with a window of 16 positions (read from its config) and of 512."""
    model = tiny_llama(len(bpe_tokenizer), seed=1)
    model.config.max_position_embeddings = WINDOW
    short = LocalMember(model, bpe_tokenizer, "short")
    long = LocalMember(model, bpe_tokenizer, "long")
    long.max_length = 512
    return short, long


def test_the_window_is_read_from_the_config_and_its_other_spellings(bpe_tokenizer, short_and_long):
    assert short_and_long[0].max_length == WINDOW
    mpt_like = type("Config", (), {"max_seq_len": 77})()
    assert max_length_of(mpt_like, bpe_tokenizer) == 77


@pytest.mark.parametrize("context, continuation, kept", [
    ([1, 2], [3], ([1, 2], [3], False)),
    (list(range(20)), [50, 51], (list(range(5, 20)), [50, 51], True)),  # the last window + 1 tokens
    ([1], list(range(30)), ([13], list(range(14, 30)), True)),              # continuation over the window
])
def test_fit_window_keeps_the_last_window_plus_one_tokens(context, continuation, kept):
    assert fit_window(context, continuation, WINDOW) == kept


def test_a_long_context_scores_as_its_left_truncated_context(short_and_long):
    short, long = short_and_long
    context = " ".join(CORPUS[:3])
    request = LoglikelihoodRequest(Prompt(text=context), " fox jumps")
    ctx, cont = short.encode_pair(context, " fox jumps")
    assert len(ctx) + len(cont) > WINDOW + 1
    single = Single([short], Single.Params(), batch_size=2)
    got = single.loglikelihood([request, LoglikelihoodRequest(Prompt(text="The"), " quick")])
    expected = long.score([(ctx[-(WINDOW + 1 - len(cont)):], cont)])[0]
    assert_close(got[0].logprob, expected.logprob, TINY_MODEL)
    assert got[0].is_greedy == expected.is_greedy
    assert single.info()["contexts_truncated"] == {"short": 1}


def test_a_continuation_longer_than_the_window_scores_its_last_tokens(short_and_long):
    short, long = short_and_long
    cont = short.encode(" " + CORPUS[3], add_special_tokens=False)
    assert len(cont) > WINDOW
    got = short.score([([short.prefix_token_id], cont)])[0]
    expected = long.score([(cont[-WINDOW - 1:-WINDOW], cont[-WINDOW:])])[0]
    assert_close(got.logprob, expected.logprob, TINY_MODEL)


def test_rolling_windows_are_not_counted_as_truncations(short_and_long):
    short, _ = short_and_long
    single = Single([short], Single.Params())
    assert math.isfinite(single.loglikelihood_rolling([" ".join(CORPUS[:4])])[0])
    assert single.info()["contexts_truncated"] == {"short": 0}


def test_generation_with_a_long_prompt_keeps_window_minus_budget_tokens(short_and_long, bpe_model, bpe_tokenizer):
    short, long = short_and_long
    prompt = Prompt(text=" ".join(CORPUS[:3]))
    gac = Gac([short, LocalMember(bpe_model, bpe_tokenizer, "wide")], GacParams())
    out = gac.generate([GenerationRequest(prompt, (), 4)])
    assert out[0].new_tokens <= 4 and gac.info()["contexts_truncated"] == {"short": 1, "wide": 0}
    kept = short.fit_prompt(short.render(prompt), 4)
    assert kept == short.render(prompt)[-(WINDOW - 4):]
    alone = Single([short], Single.Params()).generate([GenerationRequest(prompt, (), 4)])[0]
    state = RequestState.of(GenerationRequest(prompt, (), 4))
    reference = Single([long], Single.Params())
    decode_batch(reference, [[kept]], [state], Timing())
    assert alone.text == text_of(long, state)


def test_a_budget_that_fills_the_window_is_one_line(short_and_long):
    short, _ = short_and_long
    with pytest.raises(UserError, match=r"^member 'short' has a window of 16 tokens: a request needing 16 new tokens"):
        Single([short], Single.Params()).generate([GenerationRequest(Prompt(text="The quick"), (), WINDOW)])


def test_seq2seq_encoder_input_is_cut_from_the_left():
    tokenizer = nllb_style_tokenizer()
    model = tiny_m2m100(tokenizer, seed=4)
    short, long = Seq2SeqMember(model, tokenizer, "short"), Seq2SeqMember(model, tokenizer, "long")
    short.max_length = WINDOW
    context, continuation = short.encode_pair(" ".join(CORPUS[:3]), " The café")
    source = context[:context.index(SOURCE_END)]
    assert len(source) > WINDOW
    got = short.score([(context, continuation)])[0]
    cut = source[-WINDOW:] + context[context.index(SOURCE_END):]
    assert_close(got.logprob, long.score([(cut, continuation)])[0].logprob, TINY_MODEL)
    assert short.fit_prompt(context, 4) == cut and short.contexts_truncated == 2
    single = Single([short], Single.Params())
    assert single.generate([GenerationRequest(Prompt(text=" ".join(CORPUS[:3])), (), 4)])[0].new_tokens <= 4
    assert single.info()["contexts_truncated"] == {"short": 1}
