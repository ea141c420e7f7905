"""GaC latency against its members, measured in one run on the same prompts.

For each configuration: decode ms/token (per step), time to first token, tokens/s, and the share
of wall time spent in the members' forward passes (the rest is union projection, choice,
re-tokenisation and bookkeeping). GaC's target is ms/token <= 1.05 x the sum of its members'
own ms/token on one device (members run one after another here).

    python scripts/bench_gac.py [--members smollm2-135m qwen2.5-0.5b] [--threads 1]
           [--prompts 8] [--tokens 48] [--threshold 0.5] [--gate 0]
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

QUESTIONS = [
    "What is 15 + 27? Explain briefly.", "Name the capital of France and one famous landmark there.",
    "Write one sentence about café culture in Tokyo.", "Give two uses of a paperclip.",
    "Why is the sky blue? One sentence.", "List three prime numbers greater than 10.",
    "What does a compiler do?", "Translate 'good morning' into Spanish and German.",
]


def forward_seconds(members) -> float:
    return sum(m.clock.prefill_seconds + m.clock.decode_seconds for m in members)


def measure(method, requests) -> dict:
    members = method.members
    before = forward_seconds(members)
    start = time.perf_counter()
    method.generate(requests)
    wall = time.perf_counter() - start
    info = method.info()
    return {"ms_per_token": info["decode_ms_per_token"], "ttft_ms": info["time_to_first_token_ms"],
            "tokens_per_s": info["tokens_generated"] / wall, "steps": info["decode_steps"],
            "forward_share": (forward_seconds(members) - before) / wall,
            "ensembled_fraction": info.get("ensembled_fraction")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", nargs="+", default=["smollm2-135m", "qwen2.5-0.5b"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--gate", type=int, default=0)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()

    import torch

    from ensemble_bench.members import Prompt, load_member
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.gac import Gac, GacParams
    from ensemble_bench.methods.single import Single

    torch.set_num_threads(args.threads)
    members = [load_member(name, dtype="float32", name=name) for name in args.members]
    requests = [GenerationRequest(Prompt(messages=(("user", q),)), (), args.tokens)
                for q in (QUESTIONS * 4)[:args.prompts]]

    def fresh(kind, batch):
        for m in members:
            m.clock.__init__()
        if kind == "single":
            return None
        params = GacParams() if kind == "gac t=1.0" else GacParams(threshold=args.threshold, gate=args.gate)
        return Gac(members, params, batch_size=batch)

    Gac(members, GacParams()).generate(requests[:1])  # warm-up (and union cache)
    rows = {}
    for batch in args.batch_sizes:
        for m in members:
            rows[f"{m.name} b{batch}"] = measure(Single([m], Single.Params(), batch_size=batch), requests)
        for kind in ("gac t=1.0", f"gac t={args.threshold} gate {members[args.gate].name}"):
            rows[f"{kind} b{batch}"] = measure(fresh("gac t=1.0" if kind == "gac t=1.0" else "gated", batch), requests)
    for name, row in rows.items():
        print(json.dumps({"config": name, **{k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}}))
    print("\n| config | ms/token | ttft ms | tokens/s | forward share | ensembled |")
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        ens = "" if row["ensembled_fraction"] is None else f"{100 * row['ensembled_fraction']:.1f}%"
        print(f"| {name} | {row['ms_per_token']:.1f} | {row['ttft_ms']:.0f} | {row['tokens_per_s']:.1f} | "
              f"{100 * row['forward_share']:.0f}% | {ens} |")
    for batch in args.batch_sizes:
        members_sum = sum(rows[f"{m.name} b{batch}"]["ms_per_token"] for m in members)
        for name, row in rows.items():
            if name.startswith("gac") and name.endswith(f"b{batch}"):
                print(f"batch {batch}: {name}: ms/token / sum(members) = {row['ms_per_token'] / members_sum:.3f}")


if __name__ == "__main__":
    main()
