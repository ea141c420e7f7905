"""DeePEn's restricted support against a near-exact reference, on the packaged models.

The exact transform uses every token of every vocabulary (support: null); on SmolLM2 + Qwen2.5
that is ~6 TFLOP of relative rows per step before the inverse steps, too slow for a CPU. The
reference here is support 1024 (the mass it leaves out is printed: it bounds ||r_exact - r||_1).
Along the reference's own greedy path, every step's member distributions are also given to
DeePEn with smaller supports, and the chosen tokens are compared.

    python scripts/deepen_support.py [--prompts 12] [--tokens 16] [--supports 16,64,256]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

REFERENCE = 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--supports", default="16,64,256")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from ensemble_bench.members import Prompt, load_member
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.deepen import Deepen, DeepenParams
    from ensemble_bench.tasks.offline import nq_questions

    members = [load_member("smollm2-135m"), load_member("qwen2.5-0.5b")]
    supports = [int(s) for s in args.supports.split(",")]
    variants = {m: Deepen(members, DeepenParams(main=1, support=m)) for m in supports}
    reference = Deepen(members, DeepenParams(main=1, support=REFERENCE))
    agree = {m: 0 for m in supports}
    seconds = {m: 0.0 for m in supports}
    dropped = {m: [0.0, 0.0] for m in supports + [REFERENCE]}
    steps = 0
    changed = 0  # steps where the reference's token is not the main model's own argmax
    original = reference._step

    def compare(logprobs, targets):
        nonlocal steps, changed
        step = original(logprobs, targets)
        probs = [lp.exp() for lp in logprobs]
        for m in supports + [REFERENCE]:
            for i, p in enumerate(probs):
                dropped[m][i] += float((1 - p.topk(m, dim=-1).values.sum(dim=-1)).clamp(min=0).sum())
        for m, variant in variants.items():
            start = time.perf_counter()
            choices = variant._step(logprobs, None).choices
            seconds[m] += time.perf_counter() - start
            agree[m] += sum(a == b for a, b in zip(choices, step.choices))
        steps += len(step.choices)
        changed += sum(c != int(a) for c, a in zip(step.choices, logprobs[1].argmax(dim=-1)))
        return step

    reference._step = compare
    requests = [GenerationRequest(Prompt(messages=(("user", p),)), (), args.tokens) for p in nq_questions(args.prompts)]
    start = time.perf_counter()
    reference.generate(requests)
    print(f"{steps} steps along support-{REFERENCE} DeePEn (main Qwen2.5, eta 0.15, T 5), "
          f"{time.perf_counter() - start:.0f} s; {reference.spaces[0].size} anchors; the ensemble's token differs "
          f"from Qwen2.5's own argmax at {changed} of them")
    print("| support | same token as support 1024 | mass left out, SmolLM2 | mass left out, Qwen2.5 | s per step |")
    print("|---|---|---|---|---|")
    for m in supports:
        print(f"| {m} | {100 * agree[m] / steps:.1f}% | {dropped[m][0] / steps:.4f} | {dropped[m][1] / steps:.4f} "
              f"| {seconds[m] / steps:.3f} |")
    kept, mass = dropped[REFERENCE]
    print(f"| {REFERENCE} | (reference) | {kept / steps:.5f} | {mass / steps:.5f} | |")


if __name__ == "__main__":
    main()
