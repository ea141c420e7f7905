"""Speculative decoding against every-token decoding, measured in one run on the same prompts.

For each member pair (three pairs of the packaged models and the near-free ``stress`` members of
bench_overhead.py: real Llama-3 and Qwen2 tokenizers before one-layer random models), each task
(GSM8K 5-shot chain of thought, 256 new tokens; NQ-Open 5-shot) and each batch size: GaC and UniTE
decoded every token and with ``speculative: N`` (same settings otherwise), SAFE, and each member
alone. Per configuration: decode ms/token, speculative / every-token, the acceptance rate, tokens
per round and how many outputs are byte-identical to every-token decoding. SAFE is set against its
drafter alone. Beside them the three numbers that bound what speculation can win: each member's own
ms/step alone (the proposer's cost per drafted token), its block read of N tokens against its
one-token step (``read_block`` vs ``extend``, timed directly: the verifier's cost), and the
acceptance rate.

Prompts are built as lm-eval's ``gsm8k`` and ``nq_open`` tasks build them (their templates, plain
text, no chat template): the first five examples of the offline copy are the shots, the questions
are the ones after them. ``--limit N`` questions per task; a batch size B above N takes B questions
(one full batch).

    python scripts/bench_speculative.py [--pairs smollm2+qwen2.5 smollm2+gemma3 gemma3+qwen2.5 stress]
           [--tasks gsm8k nq] [--batch-sizes 1 8] [--methods gac unite safe] [--limit 1] [--draft 8]
           [--proposer null|auto|LABEL|INDEX] [--max-new-tokens N] [--threads 2] [--dtype float32]
           [--out results/bench/speculative.json]
    python scripts/bench_speculative.py --check   # CI: speculative GaC == every-token GaC, byte for byte

``--check`` decodes a few fixed prompts with the stress members, GaC plain and gated, every-token
and speculative, at batch sizes 1 and 4; it exits 1 with one line naming the first prompt whose
outputs differ.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_overhead import PROMPTS, sync, tiny_member  # noqa: E402

STRESS = "stress"
PAIRS = {  # the cheaper member first: it is the methods' lead, so the default proposer
    "smollm2+qwen2.5": ("smollm2-135m", "qwen2.5-0.5b"),
    "smollm2+gemma3": ("smollm2-135m", "gemma3-270m"),
    "gemma3+qwen2.5": ("gemma3-270m", "qwen2.5-0.5b"),
    STRESS: ("llama3", "qwen2"),
}
LABELS = {"smollm2-135m": "smollm2", "qwen2.5-0.5b": "qwen2.5", "gemma3-270m": "gemma3"}
SPECULATIVE_METHODS = ("gac", "unite")
METHODS = (*SPECULATIVE_METHODS, "safe")
SHOTS = 5
BLOCK_REPEATS = 5
CHECK_TOKENS = 24
CHECK_BATCH_SIZES = (1, 4)
CHECK_CONFIGS = (("gac", {}), ("gac gated t=0.5", {"threshold": 0.5}))


@dataclass(frozen=True)
class Task:
    name: str
    until: tuple[str, ...]
    max_new_tokens: int


TASKS = {  # lm-eval 0.4.13's gsm8k.yaml and nq_open.yaml (stop strings; 256: its default max_gen_toks)
    "gsm8k": Task("gsm8k", ("Question:", "</s>", "<|im_end|>"), 256),
    "nq": Task("nq", ("\n", ".", ","), 256),
}


def gsm8k_prompt(shots: list[dict], question: str) -> str:
    """lm-eval's gsm8k: "Question: ...\\nAnswer: <worked answer>" shots joined by blank lines."""
    done = "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)
    return f"{done}Question: {question}\nAnswer:"


def nq_prompt(shots: list[dict], question: str) -> str:
    """lm-eval's nq_open: its description, then "Q: ...?\\nA: <first answer>" shots, one per line."""
    done = "".join(f"Q: {s['question']}?\nA: {s['answer'][0]}\n" for s in shots)
    return f"Answer these questions:\n\n{done}Q: {question}?\nA:"


def task_prompts(task: str, count: int) -> list[str]:
    """``count`` prompts of the offline copy: its first ``SHOTS`` examples are every prompt's shots."""
    from ensemble_bench.tasks import get_benchmark
    from ensemble_bench.tasks.offline import ensure_offline_data

    root = ensure_offline_data([get_benchmark(task)])
    path = {"gsm8k": root / "openai" / "gsm8k" / "main" / "test.jsonl",
            "nq": root / "google-research-datasets" / "nq_open" / "default" / "validation.jsonl"}[task]
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[:SHOTS + count]]
    build = gsm8k_prompt if task == "gsm8k" else nq_prompt
    return [build(rows[:SHOTS], row["question"]) for row in rows[SHOTS:]]


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def proposer_value(text: str) -> int | str | None:
    """--proposer: null (the method's lead), auto, a member index or a member label."""
    if text == "null":
        return None
    return int(text) if text.isdigit() else text


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"bench_speculative: {message}\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", nargs="+", choices=list(PAIRS), default=list(PAIRS))
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--batch-sizes", type=positive, nargs="+", default=[1, 8])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--limit", type=positive, default=1, help="questions per task (more: one full batch)")
    parser.add_argument("--draft", type=positive, default=8, help="speculative: N, the longest draft")
    parser.add_argument("--proposer", type=proposer_value, default=None,
                        help="null (the lead member), auto, or a member label or index")
    parser.add_argument("--max-new-tokens", type=positive, default=None, help="default: the task's own (256)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", type=Path, default=Path("results/bench/speculative.json"))
    parser.add_argument("--check", action="store_true", help="the CI guard: speculative GaC == every-token GaC")
    args = parser.parse_args(argv)
    return args


# --- methods and one measured run ---------------------------------------------------------------

def build(name: str, members, params: dict, batch: int):
    from ensemble_bench.methods import get_method

    method = get_method(name)
    return method(members, method.Params.model_validate(params), batch_size=batch)


def speculative_params(args) -> dict:
    return {"speculative": args.draft, **({} if args.proposer is None else {"proposer": args.proposer})}


def requests_of(prompts: list[str], task: Task) -> list:
    from ensemble_bench.members import Prompt
    from ensemble_bench.methods import GenerationRequest

    return [GenerationRequest(Prompt(text=p), task.until, task.max_new_tokens) for p in prompts]


def outputs(method, requests) -> list[str]:
    return [g.text for g in method.generate(requests)]


def speculative_figures(info: dict) -> dict:
    """The ``speculative_*`` counters of a method's own statistics (acceptance, tokens per round, draft length,
    passes)."""
    return {k: v for k, v in info.items() if k.startswith("speculative_")}


def measured(method, requests, label: str) -> dict:
    for member in method.members:
        sync(member.device)
    start = time.perf_counter()
    texts = outputs(method, requests)
    wall = time.perf_counter() - start
    info = method.info()
    ms = info["decode_ms_per_token"] if info["decode_ms_per_token"] is not None else info["first_round_ms_per_token"]
    print(f"{label}: {ms:.1f} ms/token, {info['tokens_generated']} tokens in {wall:.0f}s", file=sys.stderr, flush=True)
    return {"ms_per_token": ms, "wall_s": wall, "tokens": info["tokens_generated"], "texts": texts,
            **speculative_figures(info.get(method.name, {}))}


def compared(every: dict, fast: dict, prompts: list[str]) -> dict:
    """Speculative against every-token: the ratio, identical outputs, and each difference in full."""
    differ = [{"prompt": i, "every_token": a, "speculative": b}
              for i, (a, b) in enumerate(zip(every["texts"], fast["texts"])) if a != b]
    return {"every_token": every, "speculative": fast, "ratio": fast["ms_per_token"] / every["ms_per_token"],
            "identical": len(prompts) - len(differ), "total": len(prompts), "differences": differ}


# --- the verifier's block read against its one-token step ---------------------------------------

def block_cost(member, prompts: list[str], length: int) -> dict:
    """Median ms of ``read_block`` of ``length`` tokens per row against ``extend`` of one, after
    the batch's prompts (the first round of each is left out as warm-up)."""
    rows = [member.encode(p) for p in prompts]
    filler = member.encode(" so 12 + 7 = 19 and then the answer is 19.", add_special_tokens=False)
    block = (filler * length)[:length]
    member.prefill(rows)
    base = [len(ids) for ids in member.row_ids()]
    step, read = [], []
    for _ in range(BLOCK_REPEATS + 1):
        step.append(timed(member, lambda: member.extend([block[:1]] * len(rows))))
        member.crop(base)
        read.append(timed(member, lambda: member.read_block([block] * len(rows), [list(range(length))] * len(rows))))
        member.crop(base)
    step_ms, block_ms = statistics.median(step[1:]), statistics.median(read[1:])
    return {"step_ms": step_ms, "block_ms": block_ms, "block_over_step": block_ms / step_ms}


def timed(member, call) -> float:
    sync(member.device)
    start = time.perf_counter()
    call()
    sync(member.device)
    return 1000 * (time.perf_counter() - start)


# --- one pair ------------------------------------------------------------------------------------

class Members:
    """The members, each loaded once and shared by every pair that names it."""

    def __init__(self, dtype: str):
        self.dtype = dtype
        self.loaded: dict[str, object] = {}
        self.alone: dict[tuple, dict] = {}  # (member, task, batch) -> its row alone

    def pair(self, pair: str) -> list:
        return [self.get(model, pair == STRESS) for model in PAIRS[pair]]

    def get(self, model: str, stress: bool):
        if model not in self.loaded:
            from ensemble_bench.members import load_member

            self.loaded[model] = (tiny_member(model, "cpu") if stress
                                  else load_member(model, dtype=self.dtype, chat_template=False, name=LABELS[model]))
        return self.loaded[model]


def warm_up(members, methods: list[str], args) -> None:
    """One short request through every configuration (union caches, first-call costs), not measured."""
    from ensemble_bench.members import Prompt
    from ensemble_bench.methods import GenerationRequest

    request = [GenerationRequest(Prompt(text=PROMPTS[0]), (), 4)]
    for name in methods:
        build(name, members, {}, 1).generate(request)
        if name in SPECULATIVE_METHODS:
            build(name, members, speculative_params(args), 1).generate(request)


def bench_pair(pair: str, pool: Members, args) -> Iterator[dict]:
    """Each task and batch size of one pair, one row at a time."""
    members = pool.pair(pair)
    warm_up(members, args.methods, args)
    for name in args.tasks:
        task = TASKS[name] if args.max_new_tokens is None else replace(TASKS[name], max_new_tokens=args.max_new_tokens)
        for batch in args.batch_sizes:
            yield bench_config(pair, members, task, batch, task_prompts(name, max(args.limit, batch)), pool, args)


def bench_config(pair: str, members, task: Task, batch: int, prompts: list[str], pool: Members, args) -> dict:
    requests = requests_of(prompts, task)
    head = f"{pair} {task.name} b{batch}"
    row = {"pair": pair, "task": task.name, "batch": batch, "questions": len(prompts), "draft": args.draft,
           "proposer": args.proposer, "members": {}, "methods": {}, "bounds": {}}
    for member in members:
        key = (member.name, task.name, batch)
        if key not in pool.alone:
            pool.alone[key] = measured(build("single", [member], {}, batch), requests, f"{head} {member.name} alone")
        row["members"][member.name] = pool.alone[key]
        row["bounds"][member.name] = block_cost(member, prompts[:batch], args.draft)
    for name in args.methods:
        if name in SPECULATIVE_METHODS:
            every = measured(build(name, members, {}, batch), requests, f"{head} {name} every-token")
            fast = measured(build(name, members, speculative_params(args), batch), requests,
                            f"{head} {name} speculative")
            row["methods"][name] = compared(every, fast, prompts)
        else:
            safe = measured(build(name, members, {}, batch), requests, f"{head} {name}")
            drafter = row["members"][members[0].name]
            row["methods"][name] = {"run": safe, "drafter": members[0].name,
                                    "ratio": safe["ms_per_token"] / drafter["ms_per_token"]}
    return row


# --- the tables ----------------------------------------------------------------------------------

def number(value, digits: int = 1, suffix: str = "") -> str:
    return "" if value is None else f"{value:.{digits}f}{suffix}"


def method_lines(row: dict) -> list[str]:
    head = f"| {row['pair']} | {row['task']} | {row['batch']} "
    lines = []
    for name, result in row["methods"].items():
        if "speculative" in result:
            fast = result["speculative"]
            forwards = ", ".join(f"{member} {number(value, 2)}" for member, value
                                 in (fast.get("speculative_forwards_per_token") or {}).items())
            lines.append(f"{head}| {name} | {number(result['every_token']['ms_per_token'])} | "
                         f"{number(fast['ms_per_token'])} | {number(result['ratio'], 2, 'x')} | "
                         f"{number(fast.get('speculative_acceptance_rate'), 2)} | "
                         f"{number(fast.get('speculative_tokens_per_round'), 2)} | {forwards} | "
                         f"{result['identical']}/{result['total']} |")
        else:
            drafter = row["members"][result["drafter"]]
            lines.append(f"{head}| {name} (vs {result['drafter']} alone) | {number(drafter['ms_per_token'])} | "
                         f"{number(result['run']['ms_per_token'])} | {number(result['ratio'], 2, 'x')} |  |  |  |  |")
    for label, alone in row["members"].items():
        lines.append(f"{head}| {label} alone | {number(alone['ms_per_token'])} |  |  |  |  |  |  |")
    return lines


def bound_lines(row: dict) -> list[str]:
    accepted = ", ".join(f"{name} {number(r['speculative'].get('speculative_acceptance_rate'), 2)}"
                         for name, r in row["methods"].items() if "speculative" in r)
    return [f"| {row['pair']} | {row['task']} | {row['batch']} | {label} | "
            f"{number(row['members'][label]['ms_per_token'])} | {number(b['step_ms'])} | {number(b['block_ms'])} | "
            f"{number(b['block_over_step'], 2, 'x')} | {accepted} |" for label, b in row["bounds"].items()]


def table(rows: list[dict]) -> str:
    draft = rows[0]["draft"] if rows else ""
    out = ["| pair | task | batch | method | every-token ms/token | speculative ms/token | ratio | acceptance "
           "| tokens/round | forwards/token per row | identical |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    out += [line for row in rows for line in method_lines(row)]
    out += ["", f"| pair | task | batch | member | alone ms/step | one-token step ms | block of {draft} ms "
            "| block / step | acceptance |", "|---|---|---|---|---|---|---|---|---|"]
    out += [line for row in rows for line in bound_lines(row)]
    return "\n".join(out)


def write_json(path: Path, settings: dict, rows: list[dict]) -> None:
    from ensemble_bench.cache import atomic_write_text

    atomic_write_text(path, json.dumps({"settings": settings, "rows": rows}, indent=1) + "\n")


# --- the CI guard --------------------------------------------------------------------------------

def run_check(members, prompts: list[str], draft: int, tokens: int,
              batch_sizes=CHECK_BATCH_SIZES) -> tuple[str | None, list[float]]:
    """(None when speculative GaC, plain and gated, gives every-token GaC's outputs byte for byte on
    every prompt and batch size, else one line naming the first prompt that differs; the acceptance
    rate of each speculative run)."""
    from ensemble_bench.decoding.speculation_stats import SteadyCosts, SteadyPace

    requests = requests_of(prompts, Task("check", (), tokens))
    accepted = []
    for label, params in CHECK_CONFIGS:
        for batch in batch_sizes:
            every = outputs(build("gac", members, params, batch), requests)
            method = build("gac", members, {**params, "speculative": draft}, batch)
            # draft whatever the clock and the machine's load say: the check compares drafts
            method.speculation.costs, method.speculation.pace = SteadyCosts(), SteadyPace()
            fast = outputs(method, requests)
            accepted.append(method.info().get(method.name, {}).get("speculative_acceptance_rate") or 0.0)
            for i, (a, b) in enumerate(zip(every, fast)):
                if a != b:
                    return (f"speculative {label} (draft {draft}, batch {batch}) differs from every-token on prompt "
                            f"{i} {prompts[i]!r}: {b!r} vs {a!r}"), accepted
    if not any(accepted):
        return "no speculative run accepted a drafted token: the check compared nothing", accepted
    return None, accepted


def check(args) -> None:
    start = time.perf_counter()
    members = Members(args.dtype).pair(STRESS)
    prompts = PROMPTS[:6]
    failure, accepted = run_check(members, prompts, args.draft, CHECK_TOKENS)
    if failure:
        sys.exit(f"bench-speculative-check: {failure}")
    print(f"bench-speculative-check: speculative GaC (plain, gated) == every-token GaC on {len(prompts)} prompts, "
          f"batch {' and '.join(map(str, CHECK_BATCH_SIZES))}; acceptance "
          f"{' / '.join(f'{a:.2f}' for a in accepted)} ({time.perf_counter() - start:.0f}s)")


def main(argv: list[str] | None = None) -> None:
    from pydantic import ValidationError

    from ensemble_bench.errors import EnvironmentFault, UserError

    args = parse_args(argv)
    try:
        run(args)
    except (UserError, ValidationError) as err:
        message = err.errors()[0]["msg"] if isinstance(err, ValidationError) else str(err)
        print(f"bench_speculative: {message}", file=sys.stderr)
        sys.exit(2)
    except EnvironmentFault as err:
        sys.exit(f"bench_speculative: {err}")


def run(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    if args.check:
        check(args)
        return
    pool = Members(args.dtype)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "check"}
    rows = []
    for pair in args.pairs:
        for row in bench_pair(pair, pool, args):
            rows.append(row)
            write_json(args.out, settings, rows)  # rows so far survive an interrupted run
    print(table(rows))
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()
