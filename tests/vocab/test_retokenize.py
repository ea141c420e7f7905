"""Canonical re-tokenisation (vocab/retokenize.py): after every piece, held ids == from-scratch encoding.

A member is fed the pieces another tokenizer would produce for a text (or single bytes, or random
cuts), and after every step its held ids must equal its own tokenizer's encoding of the generated
text so far, computed directly (the trailing half of a UTF-8 character waits as pending bytes).
The tiny tokenizers always run; the real ones (SmolLM2, Qwen2.5, Gemma-3 from the packaged
models; Llama-3, Qwen2, Llama-2 vocabulary files) run when they are in the cache.
"""

import random
from functools import cache

import pytest

from ensemble_bench.vocab import build_vocab_view
from ensemble_bench.vocab.retokenize import CanonicalTail, continuation_encoder, split_utf8

TEXTS = [
    "I don't think it's right; they're sure we'll see. Pride and Prejudice!",
    "Pi is 3.14159, the year 2026, and 1234567 + 89 = 1234656.",
    "東京は日本の首都です。大阪も大きな都市です。",
    "Nice 🙂👍🏽 family 👨‍👩‍👧 ok",
    "def f(x):\n    return x**2\n\n\nprint(f(3))  # 9\n",
    "a  b   c\n\n\n  d\t\te    \n end",
    "\nstarts with a newline, ends with spaces   ",
]
PACKAGED = {"smollm2": "smollm2-135m", "qwen2.5": "qwen2.5-0.5b", "gemma3": "gemma3-270m"}
VOCAB = ["llama3", "qwen2", "llama2"]
REAL = [*PACKAGED, *VOCAB]


class Side:
    """One tokenizer: its byte view, continuation encoder and canonical tail."""

    def __init__(self, tokenizer):
        self.view = build_vocab_view(tokenizer)
        self.encode = continuation_encoder(lambda text: tokenizer(text, add_special_tokens=False).input_ids)
        self.tail = CanonicalTail.from_view(self.view, self.encode)

    def pieces(self, text: str) -> list[bytes]:
        return [self.view.pieces[i] for i in self.encode(text)]


@cache
def real_side(name: str) -> Side:
    """A real tokenizer, or a skip when it is not in the cache (nothing is downloaded)."""
    from ensemble_bench.cache import cache_dir

    if name in PACKAGED:
        from ensemble_bench.members import load_tokenizer
        from ensemble_bench.members.sources import PACKAGED as MODELS
        from ensemble_bench.members.sources import resolve

        if not (cache_dir() / "models" / PACKAGED[name] / MODELS[PACKAGED[name]].filename).exists():
            pytest.skip(f"{PACKAGED[name]} is not in the cache")
        return Side(load_tokenizer(resolve(PACKAGED[name])))
    from ensemble_bench.members.vocab_files import VOCAB_FILES, load_vocab_tokenizer

    if not ((cache_dir() / "tokenizers" / f"vocab-{name}" / "tokenizer.json").exists()
            or (cache_dir() / "vocab" / VOCAB_FILES[name]).exists()):
        pytest.skip(f"vocabulary file {name} is not in the cache")
    return Side(load_vocab_tokenizer(name))


def replay(member: Side, pieces: list[bytes], tail: CanonicalTail | None = None) -> int:
    """Feed pieces one by one; assert held ids == from scratch after each; return the number of crops."""
    tail = tail or member.tail
    held, pending, text, crops = [], b"", b"", 0
    for piece in pieces:
        text += piece
        plan = tail.plan(held, pending, piece)
        crops += plan.keep < len(held)
        assert plan.ids or plan.keep == len(held)  # a crop always comes with ids to feed
        held, pending = held[:plan.keep] + list(plan.ids), plan.pending
        valid, waiting = _valid_prefix(text)
        assert pending == waiting
        assert held == member.encode(valid), (text, [member.view.pieces[i] for i in held])
    return crops


def _valid_prefix(data: bytes) -> tuple[str, bytes]:
    try:
        return data.decode("utf-8"), b""
    except UnicodeDecodeError as err:
        assert err.reason == "unexpected end of data" and err.end == len(data)
        return data[:err.start].decode("utf-8"), data[err.start:]


def cuts(data: bytes, seed: int) -> list[bytes]:
    """``data`` cut at random places (also inside UTF-8 characters)."""
    rng = random.Random(seed)
    points = sorted(rng.sample(range(1, len(data)), len(data) // 3))
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]


def test_split_utf8():
    assert split_utf8("é東".encode()) == (["é東"], b"")
    assert split_utf8("a東".encode()[:3]) == (["a"], "東".encode()[:2])
    assert split_utf8(b"ab\x80cd\xe6\x9d") == (["ab", 0x80, "cd"], b"\xe6\x9d")
    assert split_utf8(b"\xe6\x9dA") == ([0xE6, 0x9D, "A"], b"")


def test_continuation_encoder_drops_the_dummy_prefix(sp_tokenizer):
    encode = continuation_encoder(lambda text: sp_tokenizer(text, add_special_tokens=False).input_ids)
    view = build_vocab_view(sp_tokenizer)
    assert view.join(sp_tokenizer("fox", add_special_tokens=False).input_ids) == b" fox"  # the spurious space
    assert view.join(encode("fox")) == b"fox" and view.join(encode(" fox")) == b" fox"


@pytest.mark.parametrize("member", ["bpe", "sp"])
def test_equals_from_scratch_on_tiny_tokenizers(member, bpe_tokenizer, sp_tokenizer):
    sides = {"bpe": Side(bpe_tokenizer), "sp": Side(sp_tokenizer)}
    for k, text in enumerate(TEXTS):
        for chooser in sides.values():
            replay(sides[member], chooser.pieces(text))
        replay(sides[member], [bytes([b]) for b in text.encode()])
        replay(sides[member], cuts(text.encode(), k))


def test_pending_bytes_wait_and_invalid_bytes_go_as_single_bytes(bpe_tokenizer):
    side = Side(bpe_tokenizer)
    first = side.tail.plan([], b"", "東".encode()[:2])
    assert (first.keep, first.ids, first.pending) == (0, (), "東".encode()[:2])
    done = side.tail.plan([], first.pending, "東".encode()[2:])
    assert done.pending == b"" and side.view.join(done.ids) == "東".encode() and list(done.ids) == side.encode("東")
    stray = side.tail.plan(list(done.ids), b"", b"\x80x")  # a continuation byte with no lead: never valid
    held = list(done.ids)[:stray.keep] + list(stray.ids)
    assert side.view.join(held) == "東".encode() + b"\x80x"
    assert held == side.tail.canonical("東".encode() + b"\x80x")[0]


@pytest.mark.integration
@pytest.mark.parametrize("member", REAL)
def test_equals_from_scratch_on_real_tokenizers(member):
    """Fed the pieces of two other real tokenizers, single bytes and random cuts, on every text."""
    side = real_side(member)
    others = [name for name in REAL if name != member]
    choosers = [others[0], others[2]]  # SmolLM2 (or Qwen2.5) and one of another family
    for k, text in enumerate(TEXTS):
        for name in choosers:
            replay(side, real_side(name).pieces(text))
        replay(side, [bytes([b]) for b in text.encode()])
        replay(side, cuts(text.encode(), k))


@pytest.mark.integration
def test_prejudice_example():
    """Qwen2.5 spells ' Prejudice' as ' Pre' 'jud' 'ice'; SmolLM2's tokenizer says ' Pre' 'judice':
    locally SmolLM2 would hold three pieces, canonically the last step takes 'jud' back."""
    qwen, smol = real_side("qwen2.5"), real_side("smollm2")
    assert qwen.pieces(" Prejudice") == [b" Pre", b"jud", b"ice"]
    held = []
    plans = []
    for piece in qwen.pieces(" Prejudice"):
        plans.append(smol.tail.plan(held, b"", piece))
        held = held[:plans[-1].keep] + list(plans[-1].ids)
    assert [smol.view.pieces[i] for i in held] == [b" Pre", b"judice"]
    assert (plans[-1].keep, [smol.view.pieces[i] for i in plans[-1].ids]) == (1, [b"judice"])


class EveryBoundaryHard(CanonicalTail):
    """A wrong tail that re-encodes only the last token: shows the boundary rule is needed."""

    def is_hard(self, before, after):
        return not 0x80 <= after[0] <= 0xBF


@pytest.mark.integration
@pytest.mark.parametrize("member,text", [("smollm2", "they're"), ("llama3", " international"),
                                         ("gemma3", " Prejudice"), ("llama2", " Prejudice")])
def test_a_one_token_window_is_not_enough(member, text):
    """Fed byte by byte, earlier tokens change: GPT-2's regex turns "'" "r" into "'re"; BPE merges a
    word's pieces anew as it grows. Re-encoding only the last token goes wrong; the boundary rule does not."""
    side = real_side(member)
    wrong = EveryBoundaryHard.from_view(side.view, side.encode)
    pieces = [bytes([b]) for b in text.encode()]
    replay(side, pieces)
    with pytest.raises(AssertionError):
        replay(side, pieces, wrong)


@pytest.mark.integration
def test_pair_rule_on_gemma():
    """Gemma-3 has the piece '> </' (a space after a non-space): there, '>' | ' ' is no boundary."""
    tail = real_side("gemma3").tail
    assert not tail.is_hard(b"<a>", b" </")
    assert tail.is_hard(b"word", b" next")


@pytest.mark.integration
@pytest.mark.parametrize("member", REAL)
def test_window_stays_short_on_prose(member):
    """The look-behind on English prose is the last word or two, not the whole text."""
    side = real_side(member)
    ids = side.encode(TEXTS[0] * 3)
    windows = [k - side.tail.window_start(ids[:k]) for k in range(1, len(ids) + 1)]
    assert max(windows[10:]) <= 6 and sum(windows) / len(windows) <= 3


TRICKY = [*"abXY '\".,!?;:-_()<>/\\\n\t  0123456789", "東", "京", "🙂", "👍🏽", "é", "ж", "\u200d", "\r\n",
          "'re", "'ll", "> </", "   ", "\n    ", "**"]


@pytest.mark.parametrize("member", ["bpe", "sp"])
def test_random_strings_on_tiny_tokenizers(member, bpe_tokenizer, sp_tokenizer):
    """Random strings of awkward characters, cut at random places: still equal to from scratch."""
    side = Side(bpe_tokenizer if member == "bpe" else sp_tokenizer)
    rng = random.Random(7)
    for trial in range(60):
        data = "".join(rng.choice(TRICKY) for _ in range(rng.randint(2, 40))).encode()
        replay(side, cuts(data, trial) if len(data) > 1 else [data])


@pytest.mark.integration
def test_a_non_canonical_tail_is_made_canonical_back_to_a_hard_boundary():
    """SmolLM2 holding Qwen2.5's local pieces ' Pre' 'jud' 'ice' (its own ids, but not canonical):
    the next piece re-encodes back to the last hard boundary, so the word becomes ' Pre' 'judice';
    what lies before that boundary is kept as it is."""
    qwen, smol = real_side("qwen2.5"), real_side("smollm2")
    ids = {piece: smol.encode(piece.decode())[0] for piece in (b" Pre", b"jud", b"ice")}
    assert all(len(smol.encode(piece.decode())) == 1 for piece in ids)
    before = smol.encode("Pride and")
    held = before + [ids[p] for p in qwen.pieces(" Prejudice")]
    plan = smol.tail.plan(held, b"", b" is")
    assert plan.keep >= len(before)
    assert held[:plan.keep] + list(plan.ids) == smol.encode("Pride and Prejudice is")
