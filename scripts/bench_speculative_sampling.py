"""Speculative sampling against every-token sampling, GaC over a packaged pair, in one run on the same
prompts (lm-eval's gsm8k prompts of the offline copy, as scripts/bench_speculative.py builds them).

Per batch size: for every-token sampling and for ``speculative: N`` (the same requests, seeds and
settings), wall seconds, tokens generated and decode ms/token (wall less the members' prefill passes,
per token generated), the ratio of the decode ms/token (the samples, hence their lengths, differ
between the two sides: their wall times alone do not compare), the acceptance rate, tokens per round,
forward passes per token of each member and the load average. The distribution of the samples is the
same (docs/sampling.md). ``make bench-speculative-sampling``.

    python scripts/bench_speculative_sampling.py [--limit 2] [--batch-sizes 1 8] [--draft 4 [6 ...]]
           [--temperature 0.7] [--max-new-tokens 64] [--threads 1] [--dtype float32]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_speculative import TASKS, task_prompts  # noqa: E402


def requests(prompts: list[str], temperature: float, max_new_tokens: int) -> list:
    from ensemble_bench.decoding.sampling import RequestSampling, SamplingParams, request_key
    from ensemble_bench.members import Prompt
    from ensemble_bench.methods import GenerationRequest

    params = SamplingParams(do_sample=True, temperature=temperature)
    return [GenerationRequest(Prompt(text=p), TASKS["gsm8k"].until, max_new_tokens,
                              RequestSampling(params, 1234, request_key(p, {}), 0)) for p in prompts]


def timed(members, params, batch, batch_size: int) -> tuple[float, float, int, object]:
    """Wall seconds of ``generate``, the same less the members' prefill passes (the decode), the tokens
    generated (the samples' lengths differ between the two sides), the method."""
    from ensemble_bench.methods.gac import Gac

    method = Gac(members, params, batch_size=batch_size)
    prefill = sum(m.clock.prefill_seconds for m in members)
    start = time.perf_counter()
    generations = method.generate(batch)
    wall = time.perf_counter() - start
    decode = wall - (sum(m.clock.prefill_seconds for m in members) - prefill)
    return wall, decode, sum(g.new_tokens for g in generations), method


def side(wall: float, decode: float, tokens: int) -> str:
    return f"{wall:.1f} s, {tokens} tokens, decode {1000 * decode / tokens:.1f} ms/token"


def figures(summary: dict) -> str:
    forwards = ", ".join(f"{name} {value:.2f}" for name, value in summary["speculative_forwards_per_token"].items())
    return (f"acceptance {summary['speculative_acceptance_rate']:.2f}, "
            f"tokens/round {summary['speculative_tokens_per_round']:.2f}, forwards/token {forwards}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--draft", type=int, nargs="+", default=[4], help="draft lengths N, each timed")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    import torch

    from ensemble_bench.members import load_member
    from ensemble_bench.methods.gac import GacParams

    torch.set_num_threads(args.threads)
    members = [load_member("smollm2-135m", dtype=args.dtype, chat_template=False, name="smollm2"),
               load_member("qwen2.5-0.5b", dtype=args.dtype, chat_template=False, name="qwen2.5")]
    warm = requests(task_prompts("gsm8k", 1), args.temperature, 4)
    timed(members, GacParams(), warm, 1)  # the first forward passes are slower: not inside a measurement
    timed(members, GacParams(speculative=max(args.draft), proposer=0), warm, 1)
    for batch_size in args.batch_sizes:
        prompts = task_prompts("gsm8k", max(args.limit, batch_size))
        batch = requests(prompts, args.temperature, args.max_new_tokens)
        every = timed(members, GacParams(), batch, batch_size)[:3]
        for draft in args.draft:
            *spec, method = timed(members, GacParams(speculative=draft, proposer=0), batch, batch_size)
            per_token = (spec[1] / spec[2]) / (every[1] / every[2])
            print(f"batch {batch_size}, draft {draft}: {len(batch)} requests, every-token {side(*every)}, "
                  f"speculative {side(*spec)}, decode ms/token ratio {per_token:.2f} (wall ratio "
                  f"{spec[0] / every[0]:.2f}), {figures(method.speculation.summary())}, "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
