"""byte_level's cost against its members alone (issue 28), in one process.

Generation: ms per generated token of ``byte_level`` (tokens = the main member's canonical tokens
of its text) over the summed ms per token of each member alone (method ``single``), no stop string,
a fixed token budget. Multiple choice: wall time of ``byte_level.loglikelihood`` over the summed
time of each member's ``single`` scoring, on PIQA-like questions (a goal and two solutions that
share their first words). Each figure is the median of ``--repeats`` runs. ``--lvr`` also times
``lvr`` (lossless vocabulary reduction, the same covering trees over the members' common tokens) on
the same generation requests in the same run: its ms per token (the same unit: the main member's
canonical tokens) and byte_level's over it. ``--questions 0`` skips scoring.

Members (``--members``):
- ``tiny``: the tests' tiny BPE and SentencePiece tokenizers (400 pieces) and 2-layer random models;
- ``llama3+qwen2``: the real tokenizers in front of near-free random models (bench_overhead.py's);
- ``packaged``: SmolLM2-135M + Qwen2.5-0.5B from ~/.cache/ensbench/models (never downloaded).

    python scripts/bench_byte_level.py [--members tiny] [--batch-sizes 1 8] [--tokens 12] [--questions 4]
           [--threads 1] [--repeats 3] [--prompts 8] [--lvr] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = [
    "The capital of France is", "Question: what is 15 + 27?\nAnswer:", "Once upon a time, in a land far away,",
    "List three prime numbers:", "The mitochondria is the", "Translate 'good morning' into German:",
    "Café culture in Tokyo", "def add(a, b):\n    return",
]
PIQA = [  # (goal, solution 1, solution 2): PIQA-like, the two solutions share their opening words
    ("How do I keep bread fresh for longer?", "Store the bread in a sealed bag in the freezer.",
     "Store the bread in an open bowl next to the oven."),
    ("To remove a stripped screw,", "press a wide rubber band between the screwdriver and the screw head, then turn.",
     "press a drop of water between the screwdriver and the screw head, then turn."),
    ("How can I cool a drink quickly?", "Wrap it in a wet paper towel and put it in the freezer for ten minutes.",
     "Wrap it in a dry wool sock and put it in the sun for ten minutes."),
    ("To clean a cast iron pan,", "scrub it with coarse salt and a little oil, then dry it on the stove.",
     "scrub it with dish soap and steel wool, then leave it to soak overnight."),
    ("How do you stop a door from squeaking?", "Rub a bar of soap or a little oil on the hinges.",
     "Rub a bar of chocolate or a little honey on the hinges."),
    ("To make a paper airplane fly farther,", "fold the wings evenly and add a small paper clip to the nose.",
     "fold the wings unevenly and add a heavy coin to the tail."),
    ("How do I unclog a sink drain?", "Pour baking soda and then vinegar down the drain, wait, then flush hot water.",
     "Pour flour and then milk down the drain, wait, then flush cold water."),
    ("To keep cut apples from browning,", "brush the slices with lemon juice.",
     "brush the slices with olive oil and salt."),
]


def tiny_pair():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from ensemble_bench.members import LocalMember
    from tests.tiny import byte_bpe_tokenizer, sentencepiece_tokenizer, tiny_llama

    bpe, sp = byte_bpe_tokenizer(), sentencepiece_tokenizer()
    return [LocalMember(tiny_llama(len(bpe), seed=0), bpe, "bpe", chat_template=False),
            LocalMember(tiny_llama(len(sp), seed=1), sp, "sp", chat_template=False)]


def real_tokenizer_pair():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_overhead import tiny_member

    return [tiny_member("llama3", "cpu"), tiny_member("qwen2", "cpu")]


def packaged_pair():
    from ensemble_bench.members import load_member

    root = Path.home() / ".cache" / "ensbench" / "models"
    for name in ("smollm2-135m", "qwen2.5-0.5b"):
        if not any((root / name).glob("*.gguf")):
            raise SystemExit(f"{name} is not in {root} (this script does not download it)")
    return [load_member("smollm2-135m", chat_template=False, name="smollm2"),
            load_member("qwen2.5-0.5b", chat_template=False, name="qwen2.5")]


def generation_requests(count: int, tokens: int):
    from ensemble_bench.members import Prompt
    from ensemble_bench.methods import GenerationRequest

    return [GenerationRequest(Prompt(text=PROMPTS[i % len(PROMPTS)]), (), tokens) for i in range(count)]


def scoring_requests(questions: int):
    from ensemble_bench.members import Prompt
    from ensemble_bench.methods import LoglikelihoodRequest

    return [LoglikelihoodRequest(Prompt(text=f"Question: {goal}\nAnswer:"), f" {solution}")
            for goal, *solutions in PIQA[:questions] for solution in solutions]


def ms_per_token(method, requests) -> tuple[float, int]:
    start = time.perf_counter()
    generations = method.generate(requests)
    elapsed = time.perf_counter() - start
    tokens = sum(g.new_tokens for g in generations)
    return 1000 * elapsed * method.batch_size / max(tokens, 1), tokens  # per token of a row


def seconds_scoring(method, requests) -> float:
    start = time.perf_counter()
    method.loglikelihood(requests)
    return time.perf_counter() - start


def measure(members, batch_size: int, tokens: int, questions: int, repeats: int, lvr: bool = False,
            prompts: int = 0) -> dict:
    from ensemble_bench.methods.byte_level import ByteLevel, ByteLevelParams
    from ensemble_bench.methods.lvr import Lvr, LvrParams
    from ensemble_bench.methods.single import Single

    singles = [Single([m], Single.Params(), batch_size=batch_size) for m in members]
    byte_level = ByteLevel(members, ByteLevelParams(), batch_size=batch_size)
    reduced = Lvr(members, LvrParams(), batch_size=batch_size) if lvr else None
    gen = generation_requests(max(batch_size, prompts), tokens)
    scored = scoring_requests(questions)
    rows = {"single_ms_per_token": [], "byte_ms_per_token": [], "single_scoring_s": [], "byte_scoring_s": []}
    for _ in range(repeats):
        rows["single_ms_per_token"].append(sum(ms_per_token(s, gen)[0] for s in singles))
        rows["byte_ms_per_token"].append(ms_per_token(byte_level, gen)[0])
        if reduced is not None:
            rows.setdefault("lvr_ms_per_token", []).append(ms_per_token(reduced, gen)[0])
        if scored:
            rows["single_scoring_s"].append(sum(seconds_scoring(s, scored) for s in singles))
            rows["byte_scoring_s"].append(seconds_scoring(byte_level, scored))
    result = {name: statistics.median(values) if values else None for name, values in rows.items()}
    result["generation_ratio"] = result["byte_ms_per_token"] / result["single_ms_per_token"]
    result["scoring_ratio"] = result["byte_scoring_s"] / result["single_scoring_s"] if scored else None
    result["covering"] = {k: v for k, v in byte_level.info().items() if k.startswith(("covering", "byte_steps"))}
    if reduced is not None:
        result["byte_over_lvr"] = result["byte_ms_per_token"] / result["lvr_ms_per_token"]
        result["lvr_covering"] = {k: v for k, v in reduced.info().items()
                                  if k.startswith(("covering", "common_token_steps", "common_vocabulary"))}
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", choices=["tiny", "llama3+qwen2", "packaged"], default="tiny")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=0, help="generation prompts (default: the batch size)")
    parser.add_argument("--lvr", action="store_true", help="also time lvr on the same generation requests")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    members = {"tiny": tiny_pair, "llama3+qwen2": real_tokenizer_pair, "packaged": packaged_pair}[args.members]()
    print(f"load {os.getloadavg()[0]:.2f}; members {args.members}; threads {args.threads}; "
          f"{args.tokens} tokens; {args.questions} questions x 2 choices")
    results = {}
    for batch_size in args.batch_sizes:
        result = measure(members, batch_size, args.tokens, args.questions, args.repeats, args.lvr, args.prompts)
        results[batch_size] = result
        print(f"batch {batch_size:>2}: generation {result['byte_ms_per_token']:8.1f} ms/token vs members "
              f"{result['single_ms_per_token']:7.1f} = {result['generation_ratio']:5.2f}x | {result['covering']}",
              flush=True)
        if args.questions:
            print(f"          scoring {result['byte_scoring_s']:7.2f} s vs {result['single_scoring_s']:6.2f} s = "
                  f"{result['scoring_ratio']:6.2f}x", flush=True)
        if args.lvr:
            print(f"          lvr {result['lvr_ms_per_token']:8.1f} ms/token: byte_level / lvr = "
                  f"{result['byte_over_lvr']:5.2f}x | {result['lvr_covering']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"members": args.members, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
