"""A member's decode step against the raw model forward it wraps (issue 28, "a lazy member step").

For each vocabulary and batch size, in one process and in lockstep, step by step: the model's own
cached greedy loop (``raw``: forward with ``logits_to_keep=1`` and an argmax of the logits, as
scripts/bench_overhead.py times it) and the same greedy loop driven through ``LocalMember.extend``
(``step``: forward, float32 next-token log-probs, KV bookkeeping). Reported: the medians, the
median of the per-step ratios, and the ratio of the fastest steps (the least disturbed by load).
The models are the near-free
random ones of bench_overhead.py (one layer, hidden size 16) behind real tokenizers, so the
vocabulary-sized work dominates: Qwen2 (152k head) and Gemma-3 (262k head, when its packaged model
is in the cache).

    python scripts/bench_member_step.py [--vocabs qwen2 gemma3] [--batch-sizes 1 8 32] [--tokens 16]
           [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_overhead import PROMPTS, sync, tiny_member  # noqa: E402


def paired_steps_ms(member, prompts: list[str], tokens: int) -> list[tuple[float, float]]:
    """(raw ms, member ms) per decode step, the two greedy loops run in lockstep so that a load
    change on this machine hits both alike: the model's own cached loop (forward with
    ``logits_to_keep=1``, argmax of the logits; as bench_overhead.raw_forward_ms) and
    ``member.extend`` (its argmax taken outside the timing)."""
    import torch
    from transformers import DynamicCache

    from ensemble_bench.members.batching import left_padded

    rows = [member.encode(p) for p in prompts]
    ids, mask = left_padded(rows, member.pad_id)
    ids, mask, cache = ids.to(member.device), mask.to(member.device), DynamicCache()
    logprobs = member.prefill(rows)
    pairs = []
    for step in range(tokens):
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, -ids.shape[1]:]
        sync(member.device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = member.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                               use_cache=True, logits_to_keep=1, **{member.cache_argument: cache})
            ids = out.logits[:, -1].argmax(dim=-1, keepdim=True)
        sync(member.device)
        raw = time.perf_counter() - start
        mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
        chosen = [[t] for t in logprobs.argmax(dim=-1).tolist()]
        sync(member.device)
        start = time.perf_counter()
        logprobs = member.extend(chosen)
        sync(member.device)
        if step:
            pairs.append((1000 * raw, 1000 * (time.perf_counter() - start)))
    return pairs


def bench(vocab: str, batches: list[int], tokens: int, repeats: int, device: str) -> list[tuple]:
    member = tiny_member(vocab, device)
    rows = []
    for batch in batches:
        prompts = (PROMPTS * (batch // len(PROMPTS) + 1))[:batch]
        paired_steps_ms(member, prompts, 3)  # warm-up
        pairs = [pair for _ in range(repeats) for pair in paired_steps_ms(member, prompts, tokens)]
        raw, step = [r for r, _ in pairs], [s for _, s in pairs]
        row = (vocab, member.vocab.size, batch, statistics.median(raw), statistics.median(step),
               statistics.median(s / r for r, s in pairs), min(step) / min(raw))
        rows.append(row)
        print("| {} | {} | {} | {:.3f} | {:.3f} | {:.3f} | {:.3f} |".format(*row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocabs", nargs="+", default=["qwen2", "gemma3"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    print(f"load: {os.getloadavg()[0]:.2f}, threads {args.threads}")
    print("| vocab | head | batch | raw fwd ms | member step ms | step / raw (median of paired steps) | "
          "fastest step / fastest raw |")
    print("|---|---|---|---|---|---|---|")
    for vocab in args.vocabs:
        bench(vocab, args.batch_sizes, args.tokens, args.repeats, args.device)


if __name__ == "__main__":
    main()
