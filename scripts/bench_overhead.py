"""The methods' own per-step cost, isolated from the members' (issue 18).

Members are real tokenizers of big models (Llama-2 32k, Llama-3 128k, Qwen2 152k; Gemma-3 256k
when its packaged model is in the cache) in front of near-free random models (one layer, hidden
size 16), so that a step is almost all vocabulary-sized work. In the ``peaked`` mode the output
heads are scaled so that next-token distributions are peaked like a trained model's (top-1
probability 0.1-0.9); in the ``flat`` mode (``--flat``) they are left unscaled, so the top-k bound
decides no GaC row and every row takes the full union projection. The share of GaC rows that the
bound decided is printed beside the timings.

For each member pair and batch size, in one process: the raw model forward alone (cached greedy
loop, no Member), each member alone (method ``single``), and every method; per configuration the
ms per decode step, the overhead over the members' summed steps (ms per step and per row), and
where the method's own time goes (exclusive time per phase: member forward incl. log-softmax,
combine/choose, feeding/re-tokenisation, KV-cache edits, the rest = the loop's bookkeeping).

    python scripts/bench_overhead.py [--pairs llama3+qwen2] [--batch-sizes 1 8 32 64] [--tokens 16]
           [--methods gac gac-gated unite deepen] [--threads 1] [--repeats 3] [--device cpu] [--shape tiny]
           [--modes peaked flat | --flat] [--json out.json] [--plot STEM] [--check gac:8:1.75[:flat] ...]

``x members`` is the median over rounds of the ensemble's ms/step over its members' summed ms/step
in the same round (a round runs every configuration back to back, so a load change between rounds
cancels). ``--check METHOD:BATCH:LIMIT[:MODE]`` (repeatable; MODE peaked by default) exits 1 when
that ratio exceeds LIMIT (the CI guard uses it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import replace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROMPTS = [
    "The capital of France is", "def add(a, b):\n    return", "Question: what is 15 + 27?\nAnswer:",
    "Café culture in Tokyo", "Once upon a time, in a land far away,", "Translate 'good morning' into German:",
    "List three prime numbers:", "The mitochondria is the",
]
HEAD_SCALE = 300.0  # random head weights x this: peaked distributions (see the module docstring)


class PhaseClock:
    """Exclusive wall time per named phase: a phase entered inside another is not counted twice."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self._stack: list[list] = []

    @contextmanager
    def phase(self, name: str):
        self._stack.append([name, time.perf_counter(), 0.0])
        try:
            yield
        finally:
            name, start, inner = self._stack.pop()
            elapsed = time.perf_counter() - start
            self.seconds[name] += elapsed - inner
            if self._stack:
                self._stack[-1][2] += elapsed

    def wrap(self, owner, attribute: str, name: str) -> None:
        original = getattr(owner, attribute)

        def timed(*args, **kwargs):
            with self.phase(name):
                return original(*args, **kwargs)
        setattr(owner, attribute, timed)

    def reset(self) -> None:
        self.seconds.clear()


def instrument(clock: PhaseClock) -> None:
    """Time the phases of every method by wrapping the functions that do them."""
    from ensemble_bench.decoding import feeding
    from ensemble_bench.members import kv, local
    from ensemble_bench.methods import deepen, gac, unite

    clock.wrap(local.LocalMember, "_forward", "member forward")
    for feeder in (feeding.LocalFeeder, feeding.CanonicalFeeder):
        clock.wrap(feeder, "give", "feeding")
    for name in ("left_align_padding", "select_rows", "copy_rows", "append_columns"):
        clock.wrap(kv, name, "cache edits")
    clock.wrap(gac.Gac, "_choose", "combine+choose")
    clock.wrap(unite.Unite, "_step", "combine+choose")
    clock.wrap(deepen.Deepen, "_step", "combine+choose")


# The real shapes of Llama-3-8B and Qwen2-7B (their config.json), for --shape 7b (GPU, bf16).
SEVEN_B = {
    "llama3": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                   num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0),
    "qwen2": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                  num_key_value_heads=4, vocab_size=152064, rope_theta=1000000.0),
}


def tiny_member(vocab: str, device: str, shape: str = "tiny", flat: bool = False, tokenizer=None):
    """A random model behind a real tokenizer: one layer of hidden size 16 (``tiny``; its head
    scaled to peaked distributions unless ``flat``), or the real 7B/8B shape in bf16 (``7b``;
    Qwen2's attention biases left out)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ensemble_bench.members import LocalMember

    tokenizer = tokenizer or load_tokenizer(vocab)
    head = max(len(tokenizer), 1 + max(tokenizer.get_vocab().values()))
    if vocab == "qwen2":
        head = 151936  # Qwen2's head is padded beyond its tokenizer
    torch.manual_seed(len(vocab))
    if shape == "7b":
        config = LlamaConfig(**{**SEVEN_B[vocab], "vocab_size": max(head, SEVEN_B[vocab]["vocab_size"])},
                             max_position_embeddings=8192, tie_word_embeddings=False)
        torch.set_default_dtype(torch.bfloat16)
        with torch.device(device):
            model = LlamaForCausalLM(config).eval()
        torch.set_default_dtype(torch.float32)
    else:
        config = LlamaConfig(vocab_size=head, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                             tie_word_embeddings=False)
        model = LlamaForCausalLM(config).eval()
        if not flat:
            with torch.no_grad():
                model.lm_head.weight.mul_(HEAD_SCALE)
    return LocalMember(model.to(device), tokenizer, vocab, chat_template=False)


def load_tokenizer(vocab: str):
    if vocab == "gemma3":
        from ensemble_bench.members import load_tokenizer as from_source
        from ensemble_bench.members.sources import resolve

        return from_source(resolve("gemma3-270m"))
    from ensemble_bench.members.vocab_files import load_vocab_tokenizer

    return load_vocab_tokenizer(vocab)


def raw_forward_ms(member, prompts: list[str], tokens: int) -> float:
    """ms per step of the model's own cached greedy loop (argmax of its logits; no Member)."""
    import torch
    from transformers import DynamicCache

    from ensemble_bench.members.batching import left_padded

    ids, mask = left_padded([member.encode(p) for p in prompts], member.pad_id)
    ids, mask = ids.to(member.device), mask.to(member.device)
    cache = DynamicCache()
    elapsed = 0.0
    with torch.inference_mode():
        for step in range(tokens):
            positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, -ids.shape[1]:]
            sync(member.device)
            start = time.perf_counter()
            out = member.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                               use_cache=True, logits_to_keep=1, **{member.cache_argument: cache})
            ids = out.logits[:, -1].argmax(dim=-1, keepdim=True)
            sync(member.device)
            if step:
                elapsed += time.perf_counter() - start
            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
    return 1000 * elapsed / (tokens - 1)


def sync(device) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


class Drawing:
    """A method whose every request samples (temperature 1, decoding/sampling.py), each from its own generator."""

    def __init__(self, method):
        self.method = method

    def generate(self, requests):
        from ensemble_bench.decoding.sampling import RequestSampling, SamplingParams, request_key

        params = SamplingParams(do_sample=True)
        return self.method.generate([replace(r, sampling=RequestSampling(params, 0, request_key(r.prompt.text, {})))
                                     for r in requests])

    def __getattr__(self, name):
        return getattr(self.method, name)


def make_methods(members, names: list[str]):
    from ensemble_bench.methods.deepen import Deepen, DeepenParams
    from ensemble_bench.methods.gac import Gac, GacParams
    from ensemble_bench.methods.unite import Unite, UniteParams

    factories = {
        "gac": lambda b: Gac(members, GacParams(), batch_size=b),
        "gac-gated": lambda b: Gac(members, GacParams(threshold=0.5, gate=0), batch_size=b),
        "gac-sample": lambda b: Drawing(Gac(members, GacParams(), batch_size=b)),  # draws from q (temperature 1)
        "unite": lambda b: Unite(members, UniteParams(primary=0), batch_size=b),
        "deepen": lambda b: Deepen(members, DeepenParams(main=0), batch_size=b),
        # the other retokenize policy of each (issue 22): gac defaults to local, unite / deepen to canonical
        "gac-canonical": lambda b: Gac(members, GacParams(retokenize="canonical"), batch_size=b),
        "unite-local": lambda b: Unite(members, UniteParams(primary=0, retokenize="local"), batch_size=b),
        "deepen-local": lambda b: Deepen(members, DeepenParams(main=0, retokenize="local"), batch_size=b),
    }
    return {name: factories[name] for name in names}


def run_once(method, requests, clock: PhaseClock) -> tuple[float, dict[str, float], float, dict]:
    """(ms per decode step, exclusive ms per step per phase, share of GaC rows the bound decided,
    the retokenize cost counters per member-row step)."""
    from ensemble_bench.decoding.method import Timing

    for member in method.members:
        sync(member.device)
    clock.reset()
    method.timing = Timing()
    method.generate(requests)
    for member in method.members:
        sync(member.device)
    info = method.info()
    steps = info["decode_steps"] + info["generation_batches"]  # phases also ran in the first step
    phases = {name: 1000 * seconds / steps for name, seconds in clock.seconds.items()}
    own = info.get(method.name, {})  # the method's own statistics
    return info["decode_ms_per_token"], phases, own.get("bound_decided_fraction"), retokenize_cost(own)


def retokenize_cost(info: dict) -> dict:
    """Crops, tokens taken back, tokens fed and waits per member-row step given others' text (issue 22)."""
    steps = info.get("retokenize_row_steps")
    if not steps:
        return {}
    return {"policy": info["retokenize"], **{name: info[f"retokenize_{key}"] / steps for name, key in
                                             (("crops", "crops"), ("dropped", "tokens_dropped"),
                                              ("fed", "tokens_fed"), ("waits", "waits"))}}


def measure(makers: dict, requests, repeats: int, clock: PhaseClock) -> dict:
    """Every configuration once per round, ``repeats`` rounds (a load change hits all of them
    alike); per configuration the median ms/step, the phases of its fastest round and its ms/step in
    every round (``rounds``, in order)."""
    built = {name: make() for name, make in makers.items()}  # one instance each: warm caches, as in a run
    for method in built.values():
        method.generate(requests[:1])  # warm-up
    runs = {name: [] for name in makers}
    for _ in range(repeats):
        for name, method in built.items():
            runs[name].append(run_once(method, requests, clock))
    result = {}
    for name, rounds in runs.items():
        fastest = min(rounds, key=lambda r: r[0])
        result[name] = {"ms_per_step": statistics.median(r[0] for r in rounds), "phases": fastest[1],
                        "bound": fastest[2], "retokenize": fastest[3], "rounds": [r[0] for r in rounds]}
    return result


def bench_pair(pair: str, args, clock: PhaseClock) -> list[dict]:
    tokenizers = [load_tokenizer(v) for v in pair.split("+")]
    return [row for mode in args.modes for row in bench_mode(pair, tokenizers, mode, args, clock)]


def bench_mode(pair: str, tokenizers: list, mode: str, args, clock: PhaseClock) -> list[dict]:
    """Every batch size of one pair with peaked or flat (unscaled heads) distributions."""
    from ensemble_bench.members import Prompt
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.single import Single

    members = [tiny_member(v, args.device, args.shape, mode == "flat", t) for v, t in zip(pair.split("+"), tokenizers)]
    methods = make_methods(members, args.methods)
    rows = []
    for batch in args.batch_sizes:
        prompts = (PROMPTS * (batch // len(PROMPTS) + 1))[:batch]
        requests = [GenerationRequest(Prompt(text=p), (), args.tokens) for p in prompts]
        result = {"pair": pair, "mode": mode, "batch": batch,
                  "raw": {m.name: statistics.median(raw_forward_ms(m, prompts, args.tokens)
                                                    for _ in range(args.repeats))
                          for m in members}}
        makers = {f"member:{m.name}": lambda m=m, batch=batch: Single([m], Single.Params(), batch_size=batch)
                  for m in members}
        makers.update({name: lambda f=f, batch=batch: f(batch) for name, f in methods.items()})
        measured = measure(makers, requests, args.repeats, clock)
        result["members"] = {m.name: measured[f"member:{m.name}"] for m in members}
        result["methods"] = {name: {**measured[name], "x_members": paired_ratio(measured[name], result["members"])}
                             for name in methods}
        rows.append(result)
        print(json.dumps(result), file=sys.stderr, flush=True)
    return rows


def paired_ratio(method: dict, members: dict) -> float:
    """The median over rounds of the method's ms/step over its members' summed ms/step in the same
    round: the configurations of a round run back to back, so a load change between rounds cancels."""
    sums = [sum(steps) for steps in zip(*(m["rounds"] for m in members.values()))]
    return statistics.median(ms / total for ms, total in zip(method["rounds"], sums))


def print_table(rows: list[dict]) -> None:
    print("| pair | mode | batch | raw fwd sum | members' sum | member / raw | method | ms/step | x members | "
          "overhead ms (per row) | combine+choose | feeding | cache edits | other | bound decided |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        raw = sum(r["raw"].values())
        members = sum(m["ms_per_step"] for m in r["members"].values())
        for name, m in r["methods"].items():
            overhead = m["ms_per_step"] - members
            p = m["phases"]
            other = m["ms_per_step"] - sum(p.values())
            decided = "" if m["bound"] is None else f"{100 * m['bound']:.1f}%"
            print(f"| {r['pair']} | {r['mode']} | {r['batch']} | {raw:.2f} | {members:.2f} | {members / raw:.2f} "
                  f"| {name} | "
                  f"{m['ms_per_step']:.2f} | {m['x_members']:.2f} | {overhead:+.2f} "
                  f"({overhead / r['batch']:+.3f}) | {p.get('combine+choose', 0):.2f} | {p.get('feeding', 0):.2f} | "
                  f"{p.get('cache edits', 0):.2f} | {other:.2f} | {decided} |")
    bounds = [(r["pair"], r["mode"], r["batch"], m["bound"]) for r in rows for n, m in r["methods"].items()
              if n == "gac" and m["bound"] is not None]
    if bounds:
        print("\nGaC rows decided by the top-k bound (the rest take the full union projection): " +
              ", ".join(f"{p} {mode} b{b}: {100 * v:.1f}%" for p, mode, b, v in bounds))
    print_retokenize(rows)


def print_retokenize(rows: list[dict]) -> None:
    """Per member-row step given another member's text: crops, tokens taken back, fed, waits (issue 22)."""
    lines = [(r, name, m["retokenize"]) for r in rows for name, m in r["methods"].items() if m.get("retokenize")]
    if not lines:
        return
    print("\n| pair | batch | method | retokenize | crops/step | taken back/step | fed/step | waits/step "
          "| feeding ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r, name, c in lines:
        print(f"| {r['pair']} | {r['batch']} | {name} | {c['policy']} | {c['crops']:.3f} | {c['dropped']:.3f} | "
              f"{c['fed']:.3f} | {c['waits']:.3f} | {r['methods'][name]['phases'].get('feeding', 0):.2f} |")


def plot(rows: list[dict], stem: str) -> None:
    """Ensemble ms/step over the members' summed ms/step against the batch size (PNG and SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        for name, m in r["methods"].items():
            series[f"{name} ({r['pair']}, {r['mode']})"].append((r["batch"], m["x_members"]))
    for label, points in series.items():
        axes.plot(*zip(*points), marker="o", label=label)
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.axhline(1.2, color="grey", linestyle="--", linewidth=0.8, label="1.20x target")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("batch size")
    axes.set_ylabel("ensemble ms/step / members' sum")
    axes.set_title("Method overhead, near-free members, real vocabularies")
    axes.legend(fontsize=7)
    figure.tight_layout()
    for suffix in (".png", ".svg"):
        figure.savefig(stem + suffix)


def check(rows: list[dict], spec: str) -> bool:
    """``METHOD:BATCH:LIMIT[:MODE]``: the first pair's ratio at that batch size and mode."""
    method, batch, limit, *rest = spec.split(":")
    mode = rest[0] if rest else "peaked"
    for r in rows:
        if r["batch"] == int(batch) and r["mode"] == mode and method in r["methods"]:
            ratio = r["methods"][method]["x_members"]
            verdict = ratio <= float(limit)
            print(f"check {r['pair']} {mode} {method} batch {batch}: {ratio:.3f} x members' sum (limit {limit}): "
                  f"{'ok' if verdict else 'TOO SLOW'}")
            return verdict
    print(f"check {spec}: no such configuration was measured")
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", nargs="+", default=["llama3+qwen2"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--methods", nargs="+", default=["gac", "gac-gated", "unite", "deepen"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", choices=["tiny", "7b"], default="tiny",
                        help="7b: real Llama-3-8B / Qwen2-7B shapes, bf16")
    parser.add_argument("--json", default=None, help="also write the raw figures here")
    parser.add_argument("--modes", nargs="+", choices=["peaked", "flat"], default=["peaked"],
                        help="peaked: heads scaled like a trained model's; flat: unscaled (every GaC row falls back)")
    parser.add_argument("--flat", action="store_true", help="the same as --modes flat")
    parser.add_argument("--check", action="append", default=[],
                        help="METHOD:BATCH:LIMIT[:MODE] (exit 1 above the limit; repeatable)")
    parser.add_argument("--plot", default=None, help="path stem: writes STEM.png and STEM.svg")
    args = parser.parse_args()
    if args.flat:
        args.modes = ["flat"]

    import torch

    torch.set_num_threads(args.threads)
    clock = PhaseClock()
    instrument(clock)
    rows = [row for pair in args.pairs for row in bench_pair(pair, args, clock)]
    print_table(rows)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    if args.plot:
        plot(rows, args.plot)
    verdicts = [check(rows, spec) for spec in args.check]
    if not all(verdicts):
        sys.exit(1)


if __name__ == "__main__":
    main()
