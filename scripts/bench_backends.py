"""GaC, UniTE and each member alone on transformers members and on vLLM members (backend: vllm), at
batch 1 and 8, measured in one run on the same prompts: decode ms/token, and each ensemble's ratio to
its members' summed ms/token on the same backend (members steered by ensbench's loop, ``single``) and
to the members' plain vLLM decode (vLLM's own greedy loop, no steering). Then what one call of a
vLLM member costs in each way it moves rows (in place, several tokens in place, re-submitted, block
reads and crops), each against one token in place; and speculative GaC against every-token GaC on
both backends with GSM8K 5-shot prompts (bench_speculative.py's): ms/token, the ratio, acceptance,
tokens per round, forward passes per generated token and row, identical outputs.

    python scripts/bench_backends.py [--members smollm2-135m qwen2.5-0.5b] [--threads 1] [--tokens 24]
           [--batch-sizes 1 8] [--max-model-len 1280] [--repeats 2] [--gsm8k-tokens 64] [--draft 8]
           [--output results/bench/backends.json]

Needs vllm (make install-vllm; make bench-backends runs it in .venv-vllm). Plain vLLM decode is timed
as (T new tokens - 1 new token) / (T - 1) per step over the same prompts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_speculative import TASKS, requests_of, task_prompts  # noqa: E402

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
    """ms of one call of a vLLM member in each way it can move rows (lowest of ``repeats``), each after a
    prefill and an extend of two tokens (the second a draft of one engine step): every row one token in
    place; every row three tokens in place; one row of the batch given two tokens while the others take
    one; every row cropped by one token (the draft: rejected in the step it waits in) and given two; a
    block read of four tokens, every position's log-probs kept, as the member does it (one drafted
    step), as without drafted steps (one engine step with the rows re-submitted, the block in their
    prompts) and in four forced steps; a speculative round's crop of two tokens (past the draft:
    every row re-submitted) and the next block of four."""
    calls = {"1 token in place": lambda n: [[11]] * n, "3 tokens in place": lambda n: [[11, 12, 13]] * n,
             "one row 2 tokens, rest 1": lambda n: [[11, 12]] + [[11]] * (n - 1),
             "crop 1 (a draft) + 2 tokens": lambda n: [[11, 12]] * n,
             "block read of 4": lambda n: [[11, 12, 13, 14]] * n,
             "block read of 4, one pass (re-submitted)": lambda n: [[11, 12, 13, 14]] * n,
             "block read of 4, one step per token": lambda n: [[11, 12, 13, 14]] * n,
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
            with read_mode(member, name):
                start = time.perf_counter()
                if "block" in name:
                    member.read_block(given, [list(range(len(row))) for row in given])
                else:
                    member.extend(given)
                best = min(best, time.perf_counter() - start)
        costs[name] = 1000 * best
    return costs


@contextlib.contextmanager
def read_mode(member, name: str):
    """A block read as the call's name asks: as the member reads it (one drafted step), as a member
    without drafted steps reads it in one engine step (rows re-submitted; no costs measured yet: a
    tie, one step), or one forced step per token (as without a ``PromptReader``)."""
    from ensemble_bench.members.vllm_engine import StepCosts

    reader, costs, drafting = member.steering.reader, member.step_costs, member.drafting
    if "one pass" in name:
        member.step_costs, member.drafting = StepCosts(), None
    elif name.endswith("one step per token"):
        member.steering.reader = None
    try:
        yield
    finally:
        member.steering.reader, member.step_costs, member.drafting = reader, costs, drafting


def speculation_rows(backends: dict, batch_sizes: list[int], tokens: int, draft: int, repeats: int) -> list[dict]:
    """GaC every token and ``speculative: draft`` on GSM8K 5-shot prompts, per backend and batch size
    (batch 1 decodes two prompts one at a time): each the lowest ms/token of ``repeats`` runs, and the
    speculative run's acceptance, tokens per round and forward passes per generated token and row."""
    from ensemble_bench.methods.gac import Gac, GacParams

    task = replace(TASKS["gsm8k"], max_new_tokens=tokens)
    rows = []
    for batch in batch_sizes:
        requests = requests_of(task_prompts("gsm8k", max(batch, 2)), task)
        for backend, members in backends.items():
            runs = {}
            for label, params in (("every", GacParams()), ("speculative", GacParams(speculative=draft))):
                best = None
                for _ in range(repeats):
                    method = Gac(members, params, batch_size=batch)
                    texts = [g.text for g in method.generate(requests)]
                    info = method.info()
                    if best is None or info["decode_ms_per_token"] < best[0]:
                        best = (info["decode_ms_per_token"], texts, info.get("gac", {}))
                runs[label] = best
            (every, expected, _), (fast, texts, spec) = runs["every"], runs["speculative"]
            rows.append({"backend": backend, "batch": batch, "every_ms_per_token": every,
                         "speculative_ms_per_token": fast, "ratio": fast / every,
                         "acceptance": spec.get("speculative_acceptance_rate"),
                         "tokens_per_round": spec.get("speculative_tokens_per_round"),
                         "forwards_per_token": spec.get("speculative_forwards_per_token"),
                         "identical": sum(a == b for a, b in zip(texts, expected)), "prompts": len(expected)})
    return rows


def speculation_table(rows: list[dict]) -> str:
    lines = ["| backend | batch | GaC every-token ms/token | speculative ms/token | ratio | acceptance | tokens/round "
             "| forwards/token (per member) | identical |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        forwards = ", ".join(f"{name} {value:.2f}" for name, value in (row["forwards_per_token"] or {}).items()
                             if value is not None)
        lines.append(f"| {row['backend']} | {row['batch']} | {row['every_ms_per_token']:.1f} | "
                     f"{row['speculative_ms_per_token']:.1f} | {row['ratio']:.2f}x | {cell(row, 'acceptance')} | "
                     f"{cell(row, 'tokens_per_round')} | {forwards} | {row['identical']}/{row['prompts']} |")
    return "\n".join(lines)


def cell(row: dict, key: str, digits: int = 2) -> str:
    return "" if row.get(key) is None else f"{row[key]:.{digits}f}"


PARTS = ("methods", "calls", "gsm8k")


def method_rows(backends: dict, requests: list, batch_sizes: list[int], repeats: int) -> list[dict]:
    """Each member alone, GaC, GaC speculative 4 and UniTE on each backend and batch size (chat prompts)."""
    from ensemble_bench.methods.gac import Gac, GacParams
    from ensemble_bench.methods.single import Single
    from ensemble_bench.methods.unite import Unite, UniteParams

    methods = {"gac": lambda ms, b: Gac(ms, GacParams(), batch_size=b),
               "gac speculative 4": lambda ms, b: Gac(ms, GacParams(speculative=4), batch_size=b),
               "unite": lambda ms, b: Unite(ms, UniteParams(primary=1), batch_size=b)}
    rows = []
    for batch in batch_sizes:
        asked = requests[:max(batch, 2)]
        for backend, members in backends.items():
            alone = {m.name: ms_per_token(lambda m=m, b=batch: Single([m], Single.Params(), batch_size=b), asked,
                                          repeats)[0] for m in members}
            plain = ({m.name: plain_ms_per_step(m, [m.render(r.prompt) for r in asked[:batch]],
                                                asked[0].max_new_tokens, repeats)
                      for m in members} if backend == "vllm" else {})
            summed = sum(alone.values())
            for name, ms in alone.items():
                rows.append({"backend": backend, "batch": batch, "config": f"{name} alone", "ms_per_token": ms,
                             "plain_vllm_ms_per_step": plain.get(name)})
            for key, make in methods.items():
                ms, inside = ms_per_token(lambda f=make, ms=members, b=batch: f(ms, b), asked, repeats)
                rows.append({"backend": backend, "batch": batch, "config": key, "ms_per_token": ms,
                             "members_ms_per_step": inside, "ratio_to_members_sum": ms / summed,
                             "ratio_to_plain_vllm_sum": ms / sum(plain.values()) if plain else None})
    return rows


def method_table(rows: list[dict], batch_sizes: list[int]) -> str:
    lines = ["| backend | batch | config | ms/token | in member calls | / members' sum | / plain vLLM sum "
             "| plain vLLM ms/step |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        ratios = [cell(row, "members_ms_per_step", 1), cell(row, "ratio_to_members_sum"),
                  cell(row, "ratio_to_plain_vllm_sum"), cell(row, "plain_vllm_ms_per_step", 1)]
        lines.append(f"| {row['backend']} | {row['batch']} | {row['config']} | {row['ms_per_token']:.1f} | "
                     + " | ".join(ratios) + " |")
    for batch in batch_sizes:
        speed = {r["backend"]: r["ms_per_token"] for r in rows if r["batch"] == batch and r["config"] == "gac"}
        lines.append(f"batch {batch}: GaC transformers / GaC vLLM = {speed['transformers'] / speed['vllm']:.2f}x")
    return "\n".join(lines)


def cost_table(costs: dict[str, dict[str, float]]) -> str:
    """Each call's ms and, in brackets, its ratio to one token in place."""
    lines = ["| vLLM member, batch | " + " | ".join(next(iter(costs.values()))) + " |",
             "|---|" + "---|" * len(next(iter(costs.values())))]
    for name, row in costs.items():
        step = row["1 token in place"]
        lines.append(f"| {name} | " + " | ".join(f"{ms:.0f} ms ({ms / step:.2f}x)" for ms in row.values()) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", nargs="+", default=["smollm2-135m", "qwen2.5-0.5b"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-model-len", type=int, default=1280,
                        help="the engines' window (GSM8K 5-shot prompts: about 900 tokens)")
    parser.add_argument("--repeats", type=int, default=2, help="each figure is the lowest of this many runs")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="methods: the chat-prompt table; calls: a vLLM call's costs; gsm8k: speculative GaC")
    parser.add_argument("--gsm8k-tokens", type=int, default=64, help="new tokens per GSM8K prompt")
    parser.add_argument("--draft", type=int, default=8, help="speculative: N on the GSM8K prompts")
    parser.add_argument("--output", default="results/bench/backends.json")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)  # before vLLM starts: its CPU worker refuses later changes

    from ensemble_bench.members import Prompt, load_member
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.gac import Gac, GacParams

    engine = {"max_model_len": args.max_model_len, "max_num_seqs": max(args.batch_sizes)}
    backends = {
        "transformers": [load_member(name, name=name, chat_template=True) for name in args.members],
        "vllm": [load_member(name, name=f"{name}-vllm", chat_template=True, backend="vllm", vllm=engine)
                 for name in args.members],
    }
    requests = [GenerationRequest(Prompt(messages=(("user", q),)), (), args.tokens) for q in QUESTIONS]
    for members in backends.values():  # warm-up: the union vocabulary, first calls
        Gac(members, GacParams(), batch_size=1).generate(requests[:1])
    result = {"threads": args.threads, "tokens": args.tokens, "repeats": args.repeats}
    if "methods" in args.parts:
        result["rows"] = method_rows(backends, requests, args.batch_sizes, args.repeats)
        print(method_table(result["rows"], args.batch_sizes))
    if "calls" in args.parts:
        result["call_costs_ms"] = {f"{member.name} b{batch}": call_costs(
            member, [member.render(r.prompt) for r in requests[:batch]], args.repeats)
            for batch in args.batch_sizes for member in backends["vllm"]}
        print("\n" + cost_table(result["call_costs_ms"]))
    if "gsm8k" in args.parts:
        result["gsm8k_speculation"] = speculation_rows(backends, args.batch_sizes, args.gsm8k_tokens, args.draft,
                                                       args.repeats)
        print(f"\nGaC on GSM8K 5-shot prompts, {args.gsm8k_tokens} new tokens, speculative: {args.draft}")
        print(speculation_table(result["gsm8k_speculation"]))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
