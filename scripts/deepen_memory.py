"""DeePEn's alignment for LLaMA3 + Qwen2 (the pair the reference implementation cannot hold):
anchors from the real tokenizers, embeddings of the real shapes (random values: weights are not
needed to measure memory and time), one DeePEn step per iteration on peaked random distributions.

Reports the anchor count, the memory the alignment adds on top of the two embedding matrices
(peak resident set size, measured), the dense matrices the reference would need, and seconds per
step. ``--device cuda`` runs it on a GPU (memory from torch.cuda.max_memory_allocated).

    python scripts/deepen_memory.py [--support 256] [--steps 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import resource
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

SHAPES = {"llama3": 4096, "qwen2": 3584}  # hidden sizes of Llama-3-8B and Qwen2-7B


def resident_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--support", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from ensemble_bench.members.vocab_files import load_vocab_tokenizer
    from ensemble_bench.vocab import build_vocab_view
    from ensemble_bench.vocab.relative import RelativeSpace, anchor_ids, inverse_transform

    views = {}
    for name in SHAPES:
        tokenizer = load_vocab_tokenizer(name)
        views[name] = build_vocab_view(tokenizer, len(tokenizer))
    anchors = anchor_ids(list(views.values()))
    count = len(anchors[0])
    dtype = getattr(torch, args.dtype)
    generator = torch.Generator().manual_seed(0)
    embeddings = {n: torch.randn(views[n].size, d, generator=generator).to(dtype).to(args.device)
                  for n, d in SHAPES.items()}
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**30
    else:
        base = resident_gib()
    spaces = [RelativeSpace(embeddings[n], ids) for n, ids in zip(SHAPES, anchors)]
    timings = []
    for _ in range(args.steps):
        logits = [torch.randn(views[n].size, generator=generator) * 4 for n in SHAPES]
        probs = [lg.softmax(-1) for lg in logits]
        start = time.perf_counter()
        supports = [p.topk(args.support).indices for p in probs]
        relative = [space.represent(p[ids], ids) for space, p, ids in zip(spaces, probs, supports)]
        target = sum(r / len(relative) for r in relative)
        updated = inverse_transform(probs[1][supports[1]], supports[1], spaces[1], target, 0.15, 5)
        int(updated.argmax())
        if cuda:
            torch.cuda.synchronize()
        timings.append(time.perf_counter() - start)
    peak = (torch.cuda.max_memory_allocated() / 2**30) if cuda else resident_gib()
    dense = sum(v.size for v in views.values()) * count * 4 / 2**30
    embedding_gib = sum(e.numel() * e.element_size() for e in embeddings.values()) / 2**30
    print(f"anchors (common tokens): {count}; vocabularies {views['llama3'].size} + {views['qwen2'].size}")
    print(f"reference dense R (float32, both members): {dense:.1f} GiB")
    print(f"embeddings ({args.dtype}, the models' own): {embedding_gib:.2f} GiB on {args.device}")
    print(f"memory added by the alignment (peak, support {args.support}): {peak - base:.2f} GiB")
    later = sorted(timings[1:])
    print(f"seconds per step (after the first): {later[len(later) // 2]:.3f}; first {timings[0]:.3f}")


if __name__ == "__main__":
    main()
