"""Token-level methods' latency against their members, measured in one run on the same prompts.

For each configuration: decode ms/token (per step), time to first token, tokens/s, the share of
wall time spent in the members' forward passes (the rest is the method's own work: union
projection, top-k alignment, relative transforms, re-tokenisation, bookkeeping), the fraction of
tokens ensembled (GaC gating) and tokens manipulated per step. With members run one after another
on one device, the ratio to the sum of the members' own ms/token is the method's overhead.

    python scripts/bench_methods.py [--members smollm2-135m qwen2.5-0.5b] [--threads 1]
           [--prompts 8] [--tokens 48] [--threshold 0.5] [--gate 0] [--emitter 1]
           [--methods gac gac-gated unite deepen-64 deepen-256] [--batch-sizes 1 8]
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
            "ensembled_fraction": info.get("ensembled_fraction"),
            "manipulated": info.get("tokens_manipulated_per_step")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", nargs="+", default=["smollm2-135m", "qwen2.5-0.5b"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--gate", type=int, default=0)
    parser.add_argument("--emitter", type=int, default=1, help="UniTE primary / DeePEn main member index")
    parser.add_argument("--methods", nargs="+", default=["gac", "gac-gated", "unite", "deepen-64", "deepen-256"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()

    import torch

    from ensemble_bench.members import Prompt, load_member
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.deepen import Deepen, DeepenParams
    from ensemble_bench.methods.gac import Gac, GacParams
    from ensemble_bench.methods.single import Single
    from ensemble_bench.methods.unite import Unite, UniteParams

    torch.set_num_threads(args.threads)
    members = [load_member(name, dtype="float32", name=name) for name in args.members]
    requests = [GenerationRequest(Prompt(messages=(("user", q),)), (), args.tokens)
                for q in (QUESTIONS * 4)[:args.prompts]]
    configs = {
        "gac": ("gac t=1.0", lambda b: Gac(members, GacParams(), batch_size=b)),
        "gac-gated": (f"gac t={args.threshold} gate {members[args.gate].name}",
                      lambda b: Gac(members, GacParams(threshold=args.threshold, gate=args.gate), batch_size=b)),
        "unite": ("unite k=10", lambda b: Unite(members, UniteParams(primary=args.emitter), batch_size=b)),
        "deepen-64": ("deepen support 64",
                      lambda b: Deepen(members, DeepenParams(main=args.emitter, support=64), batch_size=b)),
        "deepen-256": ("deepen support 256",
                       lambda b: Deepen(members, DeepenParams(main=args.emitter, support=256), batch_size=b)),
    }

    def fresh(method):
        for m in members:
            m.clock.__init__()
        return method

    for key in args.methods:  # warm-up (and the union cache)
        configs[key][1](1).generate(requests[:1])
    rows = {}
    for batch in args.batch_sizes:
        for m in members:
            rows[f"{m.name} b{batch}"] = measure(fresh(Single([m], Single.Params(), batch_size=batch)), requests)
        for key in args.methods:
            label, make = configs[key]
            rows[f"{label} b{batch}"] = measure(fresh(make(batch)), requests)
    for name, row in rows.items():
        print(json.dumps({"config": name, **{k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}}))
    print("\n| config | ms/token | ttft ms | tokens/s | forward share | ensembled | tokens manipulated/step |")
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        ens = "" if row["ensembled_fraction"] is None else f"{100 * row['ensembled_fraction']:.1f}%"
        manipulated = "" if row["manipulated"] is None else f"{row['manipulated']:.1f}"
        print(f"| {name} | {row['ms_per_token']:.1f} | {row['ttft_ms']:.0f} | {row['tokens_per_s']:.1f} | "
              f"{100 * row['forward_share']:.0f}% | {ens} | {manipulated} |")
    names = {m.name for m in members}
    for batch in args.batch_sizes:
        members_sum = sum(rows[f"{m.name} b{batch}"]["ms_per_token"] for m in members)
        for name, row in rows.items():
            if name.rsplit(" b", 1)[0] not in names and name.endswith(f"b{batch}"):
                print(f"batch {batch}: {name}: ms/token / sum(members) = {row['ms_per_token'] / members_sum:.3f}")


if __name__ == "__main__":
    main()
