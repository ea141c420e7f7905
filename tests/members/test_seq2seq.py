"""Seq2SeqMember: the same invariants as causal members (cached == uncached, crop/keep ==
recomputation, identity under every token-level method), the source convention, and scoring."""

import pytest
import torch

from ensemble_bench.members import Prompt
from ensemble_bench.members.seq2seq import SOURCE_END, Seq2SeqMember, find_translation, language_token, split_row
from ensemble_bench.methods import GenerationRequest, LoglikelihoodRequest, get_method
from ensemble_bench.methods.deepen import Deepen, DeepenParams
from ensemble_bench.methods.gac import Gac, GacParams
from ensemble_bench.methods.single import Single
from ensemble_bench.methods.unite import Unite, UniteParams
from tests.tiny import CORPUS, outputs
from tests.tiny_seq2seq import nllb_style_tokenizer, tiny_m2m100, tiny_t5
from tests.tolerances import TINY_MODEL, assert_close

TRANSLATE = "Translate German to English.\nGerman: Der Fuchs springt.\nEnglish: The fox jumps.\n\nGerman: {}\nEnglish:"
PROMPTS = [TRANSLATE.format("Das Café ist offen."), "The quick brown", TRANSLATE.format("Hallo"),
           "Question: What is 12 plus 30? Answer:"]


@pytest.fixture(scope="module")
def tokenizer():
    return nllb_style_tokenizer()


@pytest.fixture(scope="module", params=["m2m100", "t5"])
def model(request, tokenizer):
    return tiny_m2m100(tokenizer, seed=4) if request.param == "m2m100" else tiny_t5(tokenizer, seed=5)


@pytest.fixture
def member(model, tokenizer):
    return Seq2SeqMember(model, tokenizer, "s2s")


def full_logprobs(model, row):
    """Reference: encoder and decoder run from scratch on one unpadded row; log-probs per decoder position."""
    source, decoder = split_row(row, model.config.decoder_start_token_id)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([decoder])).logits
    return logits[0].float().log_softmax(-1)


def slow_greedy(model, row, steps):
    seq, out = list(row), []
    for _ in range(steps):
        token = int(full_logprobs(model, seq)[-1].argmax())
        out.append(token)
        seq.append(token)
    return out


def rows_of(member):
    return [member.render(Prompt(text=p)) for p in PROMPTS]


def test_batched_cached_decode_equals_slow_loop(member, model):
    rows = rows_of(member)
    logprobs = member.prefill(rows)
    fast = [[] for _ in rows]
    for _ in range(12):
        picks = logprobs.argmax(-1).tolist()
        for r, token in enumerate(picks):
            fast[r].append(token)
        logprobs = member.extend([[t] for t in picks])
    assert fast == [slow_greedy(model, row, 12) for row in rows]


def test_variable_extend_crop_and_keep_match_recomputation(member, model):
    rows = rows_of(member)
    member.prefill(rows)
    starts = [len(ids) for ids in member.row_ids()]  # decoder prefixes: [start, target code] or [start]
    member.extend([[5, 6], [7], [], [8, 9, 10]])
    member.crop([starts[0] + 1, starts[1], starts[2], starts[3] + 2])
    logprobs = member.extend([[11], [12, 13], [14], [15]])
    held = member.row_ids()
    assert held[0][starts[0]:] == [5, 11] and held[1][starts[1]:] == [12, 13]
    assert held[2][starts[2]:] == [14] and held[3][starts[3]:] == [8, 9, 15]
    sources = [row[:row.index(SOURCE_END) + 1] for row in rows]
    for r in range(4):
        assert_close(logprobs[r], full_logprobs(model, sources[r] + held[r])[-1], TINY_MODEL)
    member.keep([3, 1])
    logprobs = member.extend([[1], []])
    assert member.row_ids() == [held[3] + [1], held[1]]
    assert_close(logprobs[0], full_logprobs(model, sources[3] + held[3] + [1])[-1], TINY_MODEL)
    assert_close(logprobs[1], full_logprobs(model, sources[1] + held[1])[-1], TINY_MODEL)


def test_extend_scored_and_crop_errors(member, model):
    rows = rows_of(member)[:2]
    member.prefill(rows)
    _, scored = member.extend_scored([[4, 5, 6], [7]])
    reference = full_logprobs(model, rows[0] + [4, 5, 6])
    start = len(reference) - 3
    assert_close(scored[0], [float(reference[start, 5]), float(reference[start + 1, 6])], TINY_MODEL)
    assert scored[1] == []
    with pytest.raises(ValueError):
        member.crop([100, 1])
    with pytest.raises(ValueError):
        member.extend([[1]])


def test_score_matches_direct_computation(member, model):
    context, continuation = member.encode_pair(PROMPTS[0], " The café")
    assert SOURCE_END in context and SOURCE_END not in continuation
    direct = full_logprobs(model, context + continuation)
    first = len(direct) - len(continuation)  # row of the first continuation token's prediction
    expected = sum(float(direct[first - 1 + k, t]) for k, t in enumerate(continuation))
    greedy = slow_greedy(model, context, 3)
    scores = member.score([(context, continuation), member.encode_pair(PROMPTS[1], " fox")], batch_size=2)
    assert_close(scores[0].logprob, expected, TINY_MODEL)
    assert scores[0].is_greedy == (greedy[:len(continuation)] == continuation)
    assert member.score([(context, greedy)])[0].is_greedy


def test_translation_prompt_gives_the_source_alone_and_the_forced_target(tokenizer):
    found = find_translation(PROMPTS[0])
    assert (found.source, found.source_language, found.target_language) == ("Das Café ist offen.", "German", "English")
    assert find_translation("Klingon: Qapla'\nEnglish:") is None and find_translation("no pair here") is None
    nllb = Seq2SeqMember(tiny_m2m100(tokenizer), tokenizer, "nllb")
    row = nllb.render(Prompt(text=PROMPTS[0]))
    source, decoder = split_row(row, nllb.start_id)
    code = tokenizer.convert_tokens_to_ids
    assert source[0] == code("deu_Latn") and source[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(source[1:-1]) == "Das Café ist offen."  # no few-shot scaffolding
    assert decoder == [tokenizer.eos_token_id, code("eng_Latn")]
    t5 = Seq2SeqMember(tiny_t5(tokenizer), tokenizer, "t5")
    source, decoder = split_row(t5.render(Prompt(text=PROMPTS[2])), t5.start_id)
    assert tokenizer.decode(source, skip_special_tokens=True) == "translate German to English: Hallo"
    assert decoder == [tokenizer.pad_token_id] and language_token(tokenizer, "t5", "German") is None
    chat = Prompt(messages=(("system", "Be brief."), ("user", "German: Hallo\nEnglish:")))
    assert nllb.render(chat) == nllb.render(Prompt(text="German: Hallo\nEnglish:"))
    plain = split_row(nllb.render(Prompt(text="The quick brown")), nllb.start_id)
    assert tokenizer.decode(plain[0], skip_special_tokens=True) == "The quick brown" and plain[1] == [nllb.start_id]


def test_not_an_encoder_decoder_is_refused(tokenizer, bpe_model, bpe_tokenizer):
    with pytest.raises(ValueError, match="not an encoder-decoder"):
        Seq2SeqMember(bpe_model, bpe_tokenizer, "causal")


# ------------------------------------------------------------------ identity under token-level methods
SEQ2SEQ_REQUESTS = [GenerationRequest(Prompt(text=p), ("\n",) if i % 2 else ("@@",), 6 + 2 * i)
                    for i, p in enumerate(PROMPTS)]
SPAN_METHODS = [get_method(name) for name in ("sweetspan", "coolfusion")]
# UniTE / DeePEn default to retokenize: canonical, under which a member with itself equals the member alone
# only where its greedy path is canonical (docs/retokenize.md); identity is exact under local.
METHODS = [(Gac, GacParams()), (Gac, GacParams(threshold=0.5, gate=1)), (Unite, UniteParams(retokenize="local")),
           (Deepen, DeepenParams(support=16, retokenize="local")), *((cls, cls.Params()) for cls in SPAN_METHODS)]


@pytest.mark.parametrize("method,params", METHODS,
                         ids=["gac", "gac-gated", "unite", "deepen", "sweetspan", "coolfusion"])
def test_seq2seq_member_with_itself_is_the_member_alone(model, tokenizer, method, params):
    def make(name):
        return Seq2SeqMember(model, tokenizer, name)
    alone = outputs(Single([make("solo")], Single.Params(), batch_size=2), SEQ2SEQ_REQUESTS)
    assert any(text for text, _ in alone)
    assert outputs(method([make("a"), make("b")], params, batch_size=2), SEQ2SEQ_REQUESTS) == alone


def test_seq2seq_scoring_with_itself_keeps_greedy_flags(model, tokenizer):
    requests = [LoglikelihoodRequest(Prompt(text=CORPUS[i][:30]), CORPUS[i][30:30 + n])
                for i in range(3) for n in (1, 8)]
    alone = Single([Seq2SeqMember(model, tokenizer, "solo")], Single.Params(), batch_size=3).loglikelihood(requests)
    pair = Gac([Seq2SeqMember(model, tokenizer, "a"), Seq2SeqMember(model, tokenizer, "b")], GacParams(),
               batch_size=3).loglikelihood(requests)
    assert_close([s.logprob for s in pair], [s.logprob for s in alone], TINY_MODEL)
    assert [s.is_greedy for s in pair] == [s.is_greedy for s in alone]


@pytest.mark.parametrize("method,params",
                         [(Gac, GacParams()), (Unite, UniteParams()), (Deepen, DeepenParams(support=16))],
                         ids=["gac", "unite", "deepen"])
def test_causal_and_seq2seq_members_together(bpe_model, bpe_tokenizer, tokenizer, method, params):
    from ensemble_bench.members import LocalMember
    members = [LocalMember(bpe_model, bpe_tokenizer, "causal"),
               Seq2SeqMember(tiny_m2m100(tokenizer, 4), tokenizer, "nllb")]
    results = method(members, params, batch_size=2).generate(SEQ2SEQ_REQUESTS)
    assert len(results) == len(SEQ2SEQ_REQUESTS)
    assert all(0 < g.new_tokens <= r.max_new_tokens for g, r in zip(results, SEQ2SEQ_REQUESTS))


# ------------------------------------------------------------------ a recipe end to end on the Flores fixture
@pytest.fixture(scope="module")
def seq2seq_dir(tmp_path_factory, tokenizer):
    """A tiny M2M100 and its NLLB-style tokenizer saved as an ordinary model folder."""
    path = tmp_path_factory.mktemp("tiny-nllb")
    tiny_m2m100(tokenizer, seed=4).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_loading_detects_an_encoder_decoder(seq2seq_dir, tiny_dirs):
    from ensemble_bench.members import load_member
    from ensemble_bench.members.seq2seq import is_seq2seq

    member = load_member(seq2seq_dir, name="nllb")
    assert isinstance(member, Seq2SeqMember) and member.family == "m2m_100"
    assert not is_seq2seq(tiny_dirs[0], None) and is_seq2seq(tiny_dirs[0], None, "seq2seq")
    with pytest.raises(ValueError, match="member kind"):
        is_seq2seq(seq2seq_dir, None, "decoder")


@pytest.mark.slow
def test_causal_and_seq2seq_recipe_runs_flores_end_to_end(seq2seq_dir, tiny_dirs, tmp_path, monkeypatch):
    import json
    import sys
    import textwrap

    from ensemble_bench.cli.main import main

    recipe = tmp_path / "flores.yaml"
    recipe.write_text(textwrap.dedent(f"""\
        name: tiny-flores
        members:
          - {{model: {tiny_dirs[0]}, name: causal}}
          - {{model: {seq2seq_dir}, name: nllb}}
        methods:
          - {{name: gac, label: gac}}
          - {{name: unite, label: unite}}
          - {{name: deepen, label: deepen, support: 16}}
        tasks:
          - {{name: flores_de-en, shots: 2, limit: 3}}
          - {{name: flores_en-ro, variant: flores200, shots: 1, limit: 2}}
        batch_size: 2
        data: offline
        output: {tmp_path / "results"}
    """))
    monkeypatch.setattr(sys, "argv", ["ensbench", "run", str(recipe)])
    try:
        main()
    except SystemExit as exit_info:
        assert exit_info.code == 0
    [run_dir] = (tmp_path / "results" / "tiny-flores").iterdir()
    for row in ("gac", "unite", "deepen"):
        results = {}  # one results file per task
        for path in (run_dir / row).glob("results_*.json"):
            results.update(json.loads(path.read_text())["results"])
        for task in ("flores101_de-en", "flores200_en-ro"):
            assert 0 <= results[task]["bleu,none"] <= 100 and 0 <= results[task]["chrf,none"] <= 100
        samples = [json.loads(line) for line in next((run_dir / row).glob("samples_flores101_de-en_*.jsonl")).open()]
        assert len(samples) == 3 and all("\n" not in s["resps"][0][0] for s in samples)
        assert samples[0]["doc"]["source_language"] == "German"
    summary = (run_dir / "summary.md").read_text()
    assert "flores_de-en" in summary and "| deepen" in summary
