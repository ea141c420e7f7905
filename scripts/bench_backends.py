"""GaC, UniTE and each member alone on transformers members and on vLLM members (backend: vllm), at
batch 1 and 8, measured in one run on the same prompts: decode ms/token, and each ensemble's ratio to
its members' summed ms/token on the same backend (members steered by ensbench's loop, ``single``) and
to the members' plain vLLM decode (vLLM's own greedy loop, no steering). Then what one call of a
vLLM member costs in each way it moves rows (in place, several tokens in place, re-submitted, block
reads and crops).

    python scripts/bench_backends.py [--members smollm2-135m qwen2.5-0.5b] [--threads 1] [--tokens 24]
           [--batch-sizes 1 8] [--max-model-len 512] [--repeats 2] [--output results/bench/backends.json]

Needs vllm (make install-vllm; make bench-backends runs it in .venv-vllm). Plain vLLM decode is timed
as (T new tokens - 1 new token) / (T - 1) per step over the same prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

QUESTIONS = [
    "What is 15 + 27? Explain briefly.", "Name the capital of France and one famous landmark there.",
    "Write one sentence about café culture in Tokyo.", "Give two uses of a paperclip.",
    "Why is the sky blue? One sentence.", "List three prime numbers greater than 10.",
    "What does a compiler do?", "Translate 'good morning' into Spanish and German.",
]


def ms_per_token(make, requests, repeats: int) -> tuple[float, float]:
    """The lowest decode ms/token (per step) of ``repeats`` fresh runs (a loaded machine only adds time),
    and that run's ms per step inside member calls (their decode clocks: a vLLM member's includes the
    wait for its engine's step); the rest is the method's own work."""
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        method = make()
        before = sum(m.clock.decode_seconds for m in method.members)
        method.generate(requests)
        info = method.info()
        inside = 1000 * (sum(m.clock.decode_seconds for m in method.members) - before) / info["decode_steps"]
        best = min(best, (info["decode_ms_per_token"], inside))
    return best


def plain_ms_per_step(member, prompts, tokens: int, repeats: int) -> float:
    """vLLM's own greedy loop: the time of ``tokens`` new ids less the time of one, per extra step
    (each the lowest of ``repeats``)."""
    def seconds(count: int) -> float:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            member.generate_plain(prompts, count)
            best = min(best, time.perf_counter() - start)
        return best

    return 1000 * (seconds(tokens) - seconds(1)) / (tokens - 1)


def call_costs(member, prompts, repeats: int) -> dict[str, float]:
    """ms of one call of a vLLM member in each way it can move rows (lowest of ``repeats``): every row
    one token in place; every row three tokens in place (three engine steps); one row of the batch
    given two tokens while the others take one (that row re-submitted with prefix caching); every row
    cropped by one token and given two (all re-submitted); a block read of four tokens, every
    position's log-probs kept (four steps); a speculative round's crop of two drafted tokens and the
    next block of four (every row re-submitted)."""
    calls = {"1 token in place": lambda n: [[11]] * n, "3 tokens in place": lambda n: [[11, 12, 13]] * n,
             "one row 2 tokens, rest 1 (re-submitted)": lambda n: [[11, 12]] + [[11]] * (n - 1),
             "crop 1 + 2 tokens (all re-submitted)": lambda n: [[11, 12]] * n,
             "block read of 4": lambda n: [[11, 12, 13, 14]] * n,
             "crop 2 + block read of 4 (all re-submitted)": lambda n: [[11, 12, 13, 14]] * n}
    costs = {}
    for name, tokens in calls.items():
        best = float("inf")
        for _ in range(repeats):
            member.prefill(prompts)
            member.extend([[7, 8]] * len(prompts))
            if name.startswith("crop"):
                member.crop([len(row) - int(name.split()[1]) for row in member.row_ids()])
            given = tokens(len(prompts))
            start = time.perf_counter()
            if "block" in name:
                member.read_block(given, [list(range(len(row))) for row in given])
            else:
                member.extend(given)
            best = min(best, time.perf_counter() - start)
        costs[name] = 1000 * best
    return costs


def cell(row: dict, key: str, digits: int = 2) -> str:
    return "" if row.get(key) is None else f"{row[key]:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", nargs="+", default=["smollm2-135m", "qwen2.5-0.5b"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2, help="each figure is the lowest of this many runs")
    parser.add_argument("--output", default="results/bench/backends.json")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)  # before vLLM starts: its CPU worker refuses later changes

    from ensemble_bench.members import Prompt, load_member
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.gac import Gac, GacParams
    from ensemble_bench.methods.single import Single
    from ensemble_bench.methods.unite import Unite, UniteParams

    engine = {"max_model_len": args.max_model_len, "max_num_seqs": max(args.batch_sizes)}
    backends = {
        "transformers": [load_member(name, name=name, chat_template=True) for name in args.members],
        "vllm": [load_member(name, name=f"{name}-vllm", chat_template=True, backend="vllm", vllm=engine)
                 for name in args.members],
    }
    requests = [GenerationRequest(Prompt(messages=(("user", q),)), (), args.tokens) for q in QUESTIONS]
    methods = {"gac": lambda ms, b: Gac(ms, GacParams(), batch_size=b),
               "gac speculative 4": lambda ms, b: Gac(ms, GacParams(speculative=4), batch_size=b),
               "unite": lambda ms, b: Unite(ms, UniteParams(primary=1), batch_size=b)}
    for members in backends.values():  # warm-up: the union vocabulary, first calls
        methods["gac"](members, 1).generate(requests[:1])
    rows = []
    for batch in args.batch_sizes:
        asked = requests[:max(batch, 2)]
        for backend, members in backends.items():
            alone = {m.name: ms_per_token(lambda m=m, b=batch: Single([m], Single.Params(), batch_size=b), asked,
                                          args.repeats)[0] for m in members}
            plain = ({m.name: plain_ms_per_step(m, [m.render(r.prompt) for r in asked[:batch]], args.tokens,
                                                args.repeats) for m in members} if backend == "vllm" else {})
            summed = sum(alone.values())
            for name, ms in alone.items():
                rows.append({"backend": backend, "batch": batch, "config": f"{name} alone", "ms_per_token": ms,
                             "plain_vllm_ms_per_step": plain.get(name)})
            for key, make in methods.items():
                ms, inside = ms_per_token(lambda f=make, ms=members, b=batch: f(ms, b), asked, args.repeats)
                rows.append({"backend": backend, "batch": batch, "config": key, "ms_per_token": ms,
                             "members_ms_per_step": inside,
                             "ratio_to_members_sum": ms / summed,
                             "ratio_to_plain_vllm_sum": ms / sum(plain.values()) if plain else None})
    print("| backend | batch | config | ms/token | in member calls | / members' sum | / plain vLLM sum "
          "| plain vLLM ms/step |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        ratios = [cell(row, "members_ms_per_step", 1), cell(row, "ratio_to_members_sum"),
                  cell(row, "ratio_to_plain_vllm_sum"), cell(row, "plain_vllm_ms_per_step", 1)]
        print(f"| {row['backend']} | {row['batch']} | {row['config']} | {row['ms_per_token']:.1f} | "
              + " | ".join(ratios) + " |")
    for batch in args.batch_sizes:
        speed = {r["backend"]: r["ms_per_token"] for r in rows if r["batch"] == batch and r["config"] == "gac"}
        print(f"batch {batch}: GaC transformers / GaC vLLM = {speed['transformers'] / speed['vllm']:.2f}x")
    costs = {}
    for batch in args.batch_sizes:
        for member in backends["vllm"]:
            prompts = [member.render(r.prompt) for r in requests[:batch]]
            costs[f"{member.name} b{batch}"] = call_costs(member, prompts, args.repeats)
    print("\n| vLLM member, batch | " + " | ".join(next(iter(costs.values()))) + " |")
    print("|---|" + "---|" * len(next(iter(costs.values()))))
    for name, row in costs.items():
        print(f"| {name} | " + " | ".join(f"{ms:.0f} ms" for ms in row.values()) + " |")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({"threads": args.threads, "tokens": args.tokens, "repeats": args.repeats,
                                             "rows": rows, "call_costs_ms": costs}, indent=1))


if __name__ == "__main__":
    main()
