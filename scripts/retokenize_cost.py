"""What canonical re-tokenisation costs, compared with local feeding (issue 22), tokenizers only.

For each pair "member <- chooser" the chooser's tokenisation of a sample text is fed to the
member one piece at a time, as if the chooser's token won every step (the worst case for the
member: in a real ensemble many steps pick a token both spell alike). Per step it counts, for
``local`` (vocab/append.py, window 4, as the methods use it) and ``canonical``
(vocab/retokenize.py): the KV-cache crops, the tokens taken back, the tokens fed (forward
positions), the steps where the member gets nothing (canonical: half a UTF-8 character waits),
the tokens re-encoded by the tokenizer and its time; and how often local's ids differ from the
canonical ones.

    python scripts/retokenize_cost.py [--pairs smollm2<-qwen2.5,llama3<-qwen2] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ensemble_bench.vocab import build_vocab_view  # noqa: E402
from ensemble_bench.vocab.append import TextAppender, single_byte_ids  # noqa: E402
from ensemble_bench.vocab.retokenize import CanonicalTail, continuation_encoder  # noqa: E402

PAIRS = ["smollm2<-qwen2.5", "qwen2.5<-smollm2", "gemma3<-smollm2", "smollm2<-gemma3",
         "llama3<-qwen2", "qwen2<-llama3", "gemma3<-llama3", "llama2<-llama3"]
TEXTS = {
    "prose": "Pride and Prejudice is a novel. I don't think it's over; we'll see, they're sure.",
    "numbers": "Pi is 3.14159, the year is 2026 and 1234567 + 89 = 1234656.",
    "cjk": "東京は日本の首都です。大阪も大きな都市です。",
    "emoji": "Great job 🙂👍🏽 see you 👨‍👩‍👧 soon!",
    "code": "def f(x):\n    return x**2\n\n\nfor i in range(10):\n    print(f(i))  # squares\n",
}
PACKAGED = {"smollm2": "smollm2-135m", "qwen2.5": "qwen2.5-0.5b", "gemma3": "gemma3-270m"}


def load(name: str):
    """A real tokenizer: a packaged model's or a vocabulary-only file's (members/vocab_files.py)."""
    if name in PACKAGED:
        from ensemble_bench.members import load_tokenizer
        from ensemble_bench.members.sources import resolve

        return load_tokenizer(resolve(PACKAGED[name]))
    from ensemble_bench.members.vocab_files import load_vocab_tokenizer

    return load_vocab_tokenizer(name)


@dataclass
class Side:
    """One member's two feeders and its from-scratch encoder."""

    view: object
    encode: object
    local: TextAppender
    canonical: CanonicalTail


def side(tokenizer) -> Side:
    view = build_vocab_view(tokenizer)
    encode = continuation_encoder(lambda text: tokenizer(text, add_special_tokens=False).input_ids)
    by_bytes: dict[bytes, int] = {}
    for token_id in view.text_ids():
        by_bytes.setdefault(view.pieces[token_id], token_id)
    local = TextAppender(view.pieces, by_bytes, single_byte_ids(view.pieces, view.special_ids), encode, 4)
    return Side(view, encode, local, CanonicalTail.from_view(view, encode))


@dataclass
class Tally:
    steps: int = 0
    crops: dict = field(default_factory=lambda: {"local": 0, "canonical": 0})
    dropped: dict = field(default_factory=lambda: {"local": 0, "canonical": 0})
    fed: dict = field(default_factory=lambda: {"local": 0, "canonical": 0})
    waits: int = 0
    reencoded: int = 0
    seconds: float = 0.0
    differs: int = 0


def replay(member: Side, pieces: list[bytes], tally: Tally) -> None:
    """Feed ``pieces`` to the member under both policies, counting as we go."""
    local, canon, pending = [], [], b""
    for piece in pieces:
        tally.steps += 1
        step = member.local.plan(local, piece)
        _count(tally, "local", step.drop, len(step.ids))
        local = local[:len(local) - step.drop] + list(step.ids)
        tally.reencoded += len(canon) - member.canonical.window_start(canon)
        start = time.perf_counter()
        plan = member.canonical.plan(canon, pending, piece)
        tally.seconds += time.perf_counter() - start
        _count(tally, "canonical", len(canon) - plan.keep, len(plan.ids))
        tally.waits += not plan.ids and plan.keep == len(canon)
        canon, pending = canon[:plan.keep] + list(plan.ids), plan.pending
        tally.differs += local != canon and not pending


def _count(tally: Tally, policy: str, drop: int, fed: int) -> None:
    tally.crops[policy] += drop > 0
    tally.dropped[policy] += drop
    tally.fed[policy] += fed


def measure(member: Side, chooser: Side, texts: dict[str, str]) -> Tally:
    tally = Tally()
    for text in texts.values():
        pieces = [chooser.view.pieces[i] for i in chooser.encode(text)]
        replay(member, pieces, tally)
    return tally


HEADER = ("| member <- chooser | steps | local crops/step | local fed/step | canonical crops/step "
          "| canonical dropped/step | canonical fed/step | waits/step | local != canonical "
          "| re-encoded tokens/step | us/step |")


def row(pair: str, t: Tally) -> str:
    per = lambda x: f"{x / t.steps:.3f}"  # noqa: E731
    return (f"| {pair} | {t.steps} | {per(t.crops['local'])} | {per(t.fed['local'])} | "
            f"{per(t.crops['canonical'])} | {per(t.dropped['canonical'])} | {per(t.fed['canonical'])} | "
            f"{per(t.waits)} | {100 * t.differs / t.steps:.0f}% | {per(t.reencoded)} | "
            f"{1e6 * t.seconds / t.steps:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default=",".join(PAIRS), help="comma-separated member<-chooser")
    parser.add_argument("--texts", default=",".join(TEXTS), help=f"comma-separated of {', '.join(TEXTS)}")
    args = parser.parse_args()
    pairs = [p.split("<-") for p in args.pairs.split(",")]
    texts = {name: TEXTS[name] for name in args.texts.split(",")}
    sides = {name: side(load(name)) for name in sorted({n for p in pairs for n in p})}
    print(HEADER)
    print("|" + "---|" * (HEADER.count("|") - 1))
    for member, chooser in pairs:
        print(row(f"{member} <- {chooser}", measure(sides[member], sides[chooser], texts)), flush=True)


if __name__ == "__main__":
    main()
