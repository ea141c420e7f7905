"""byte_level's branch after a whitespace run (issue 42 item 8): with a GPT-2 style pre-tokeniser
"\\n\\n" alone is one token, but "\\n\\n" before a word is "\\n" "\\n" + the word. The exact byte
distribution after "\\n\\n" therefore puts a word's first letter on the trunk "\\n" "\\n", and the
trunk "\\n\\n" carries only whitespace and the end of the text."""

import math

import pytest

import tests.naive as naive
from ensemble_bench.decoding.feeding import canonical_tail
from ensemble_bench.members import LocalMember, Prompt
from ensemble_bench.methods import LoglikelihoodRequest
from ensemble_bench.methods.byte_level import ByteLevel, ByteLevelParams
from ensemble_bench.vocab.lookahead import LETTERS, WHITESPACE, lookahead
from tests.methods.test_byte_level_tree import LoopMember
from tests.tolerances import TINY_MODEL, assert_close

PARAGRAPHS = "Title: Hi\n\nThe dog ran.\n\nThe cat sat.\n\n"


@pytest.fixture(scope="module")
def paragraph_member():
    """The tests' byte-level BPE (GPT-2 regex) trained with paragraphs: it has "\\n\\n" and "The"."""
    from tests import tiny

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tiny, "CORPUS", tiny.CORPUS + [PARAGRAPHS] * 40)
        tokenizer = tiny.byte_bpe_tokenizer()
    return tokenizer, tiny.tiny_llama(len(tokenizer), seed=5)


def ids(tokenizer, *tokens):
    return [tokenizer.convert_tokens_to_ids(t) for t in tokens]


def test_the_tokenizer_splits_a_newline_run_before_a_word(paragraph_member):
    tokenizer, _ = paragraph_member
    alone = tokenizer.encode("Hi\n\n")
    assert alone[-1:] == ids(tokenizer, "ĊĊ")
    assert tokenizer.encode("Hi\n\nThe") == alone[:-1] + ids(tokenizer, "Ċ", "Ċ", "The")


def test_lookahead_gives_letters_the_split_trunk(paragraph_member):
    tokenizer, model = paragraph_member
    tail = canonical_tail(LocalMember(model, tokenizer, "m"))
    held, _ = tail.canonical(b"Hi\n\n")
    split = lookahead(tail, held, b"Hi\n\n")
    assert split.keep >= WHITESPACE and not LETTERS & split.keep
    letters = [trunk for first, trunk in split.others if first >= LETTERS]
    assert letters == [tuple(held[:-1] + ids(tokenizer, "Ċ", "Ċ"))]
    spaced, _ = tail.canonical(b"Hi ")
    after_space = lookahead(tail, spaced, b"Hi ")  # " The" is one token: no letter starts after "Hi "
    assert not LETTERS & after_space.keep and all(not LETTERS & first for first, _ in after_space.others)


@pytest.mark.parametrize("kind", [LocalMember, LoopMember])
def test_score_after_a_newline_run_is_the_exact_byte_distribution(paragraph_member, kind, monkeypatch):
    """log P("\\n\\nThe dog" | "Title: Hi") on the tree read and on the byte loop equals the naive
    reference (every trunk re-encoded from scratch, one forward each), and differs from the naive
    reference with the old rule (the trunk "\\n\\n" for every token) by more than the tolerance."""
    tokenizer, model = paragraph_member
    member = kind(model, tokenizer, "m")
    request = LoglikelihoodRequest(Prompt(text="Title: Hi"), "\n\nThe dog")
    got = ByteLevel([member], ByteLevelParams(), batch_size=1).loglikelihood([request])[0].logprob
    exact, _ = naive.naive_byte_score([member], [model], "Title: Hi", "\n\nThe dog", [1.0])
    monkeypatch.setattr(naive, "WHITE", b"")
    old, _ = naive.naive_byte_score([member], [model], "Title: Hi", "\n\nThe dog", [1.0])
    assert_close(got, exact, TINY_MODEL)
    assert math.isfinite(old) and abs(old - exact) > 1e-2
