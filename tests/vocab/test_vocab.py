"""The byte view of a vocabulary: spelling rules and round trips against the tokenizer's decode."""

import random

import pytest

from ensemble_bench.vocab import build_vocab_view
from ensemble_bench.vocab.bytes_view import byte_level_alphabet, piece_bytes
from tests.tiny import CORPUS

TEXTS = [
    "Hello Multi-tasking world!",
    "Café, naïve, jalapeño — 東京 🙂 and ünïcödé",
    "  leading spaces\nand\ttabs\n\n",
    "James went; Jam es? 12 + 30 = 42.",
    *CORPUS[:7],
]


def decoded_like_tokenizer(view, ids) -> str:
    text = view.join(ids).decode("utf-8", errors="replace")
    if view.strips_leading_space and text.startswith(" "):
        text = text[1:]
    return text


def test_byte_level_alphabet_is_a_bijection_over_bytes():
    alphabet = byte_level_alphabet()
    assert sorted(alphabet.values()) == list(range(256))
    assert alphabet["Ġ"] == ord(" ") and alphabet["Ċ"] == ord("\n") and alphabet["A"] == ord("A")


@pytest.mark.parametrize("piece,spelling,expected", [
    ("Ġhello", "byte-level", b" hello"),
    ("Ċ", "byte-level", b"\n"),
    ("Ã©", "byte-level", "é".encode()),
    ("▁hello", "sentencepiece", b" hello"),
    ("<0x0A>", "sentencepiece", b"\n"),
    ("<0xE6>", "sentencepiece", b"\xe6"),
    ("東京", "sentencepiece", "東京".encode()),
])
def test_piece_bytes(piece, spelling, expected):
    assert piece_bytes(piece, spelling) == expected


@pytest.mark.parametrize("fixture", ["bpe_tokenizer", "sp_tokenizer"])
def test_round_trip_on_text(fixture, request):
    tokenizer = request.getfixturevalue(fixture)
    view = build_vocab_view(tokenizer)
    for text in TEXTS:
        ids = tokenizer(text).input_ids
        assert decoded_like_tokenizer(view, ids) == tokenizer.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("fixture", ["bpe_tokenizer", "sp_tokenizer"])
def test_round_trip_on_random_ids(fixture, request):
    """Random id sequences decode exactly like the tokenizer wherever the tokenizer is lossless.

    Byte-level BPE decodes the joined bytes with replacement, exactly as we do. SentencePiece's
    ByteFallback turns a whole run of byte pieces into U+FFFD when the run is not valid UTF-8
    (even its valid bytes), so such sequences are left out: the byte view keeps what it loses.
    """
    tokenizer = request.getfixturevalue(fixture)
    view = build_vocab_view(tokenizer)
    rng = random.Random(0)
    compared = 0
    for _ in range(1000):
        ids = [rng.choice(view.text_ids()) for _ in range(rng.randint(1, 12))]
        expected = tokenizer.decode(ids, skip_special_tokens=False)
        if view.spelling == "sentencepiece" and "\ufffd" in expected:
            continue
        assert decoded_like_tokenizer(view, ids) == expected
        compared += 1
    assert compared >= 200  # enough lossless sequences were compared


def test_specials_and_byte_fallback(sp_tokenizer, bpe_tokenizer):
    sp = build_vocab_view(sp_tokenizer)
    assert sp.spelling == "sentencepiece" and sp.strips_leading_space
    assert {sp_tokenizer.convert_tokens_to_ids(t) for t in ("<s>", "</s>", "<unk>")} <= sp.special_ids
    assert sp.pieces[sp_tokenizer.convert_tokens_to_ids("<0xE6>")] == b"\xe6"
    bpe = build_vocab_view(bpe_tokenizer)
    assert bpe.spelling == "byte-level" and not bpe.strips_leading_space
    assert bpe.pieces[bpe_tokenizer.convert_tokens_to_ids("<|im_end|>")] == b"<|im_end|>"
    assert bpe_tokenizer.convert_tokens_to_ids("<|im_end|>") in bpe.special_ids


def test_padded_head_rows_have_no_bytes(bpe_tokenizer):
    view = build_vocab_view(bpe_tokenizer, head_size=len(bpe_tokenizer) + 16)
    assert view.size == len(bpe_tokenizer) + 16
    assert all(p is None for p in view.pieces[len(bpe_tokenizer):])
    assert all(view.pieces[i] is not None for i in range(len(bpe_tokenizer)))


@pytest.mark.parametrize("fixture", ["bpe_tokenizer", "sp_tokenizer"])
def test_tiny_fixtures_have_no_duplicate_byte_strings(fixture, request):
    """The identity invariant is exact only without duplicates; the fixtures are built that way."""
    view = build_vocab_view(request.getfixturevalue(fixture))
    pieces = [view.pieces[i] for i in view.text_ids()]
    assert len(pieces) == len(set(pieces))
