"""ME beside its authors' code, Kamichanw/Mixture-model-like-Ensemble (docs/fidelity.md#me).

The official ``src/ray_engine.py``, ``src/token_mapping.py`` and ``src/utils.py`` are read at run time
from a clone or a git copy (``--repo``; never committed here) and imported as a package. Its engine
(``RayGenerationEngine``) keeps models in Ray actors; here the actor is its own ``ModelGroupWorker`` in
this process (``ray.get`` the identity, ``.remote`` a plain call: Ray only carries the calls), over the
packaged SmolLM2-135M and Qwen2.5-0.5B that ensbench loads (the runners get ensbench's model objects and
the members' tokenizers saved to a folder: the packaged models are GGUF files that its
``from_pretrained`` cannot open). Its ``generate``, ``_select_token``, ``_sample_from_probs`` and
``TokenMapper`` (the union vocabulary) run as they are. 40 plain-text prompts (scripts/fidelity_prompts.py),
equal weights, temperature 1 without truncation:

1. Member picks under aligned random numbers. ensbench picks a member with one uniform u from the
   request's generator and draws the member's token with the next; the official code picks with
   ``random.Random.choices`` (also the first member whose cumulative weight exceeds u x total) and draws
   the token with ``torch.multinomial`` on the global generator, which cannot be aligned. Its ``_rng``
   is given the uniforms ensbench's generator gives its picks (the 1st, 3rd, 5th ... of the request's
   stream), so the per-step member choices must agree at every step both run (texts then differ).
2. First tokens: ``--draws`` first tokens per prompt from each (the official code: its pick and its
   ``_select_token`` on its runners' first distributions, drawn again and again; ensbench: as many rows
   of the prompt, each a repeat of the request with its own generator), a two-sample chi-square test per
   prompt (categories under 5 expected lumped), summed over the prompts; and the picked members' counts.
3. Greedy (``do_sample`` false): the official code still picks a member at random (its seed 42) and takes
   that member's argmax; ensbench takes the mixture's argmax (GaC's). Texts compared, ``--tokens`` tokens.

Usage: python scripts/compare_me_official.py --repo PATH [--draws 100] [--tokens 16] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import types
from bisect import bisect_right
from collections import Counter
from itertools import accumulate
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

OFFICIAL_FILES = ("src/ray_engine.py", "src/token_mapping.py", "src/utils.py")
from fidelity_prompts import SUMS, TOPICS  # noqa: E402  (scripts/, on the path when run)

QUESTIONS = ([f"Question: Tell me one fact about {t}.\nAnswer:" for t in TOPICS]
             + [f"Question: What is {a} plus {b}?\nAnswer:" for a, b in SUMS])


def import_official(repo: str, into: Path):
    """The official engine module from ``repo`` (a checkout or a git copy), as package ``me_official``,
    with Ray's transport replaced by plain calls (and loguru by the logging module when absent)."""
    package = into / "me_official"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in OFFICIAL_FILES:
        source = Path(repo) / name
        text = source.read_text() if source.is_file() else subprocess.run(
            ["git", "-C", repo, "show", f"HEAD:{name}"], check=True, capture_output=True, text=True).stdout
        (package / Path(name).name).write_text(text)
    sys.path.insert(0, str(into))
    try:
        import loguru  # noqa: F401  (its token_mapping logs with it)
    except ImportError:
        import logging

        sys.modules["loguru"] = types.SimpleNamespace(logger=logging.getLogger("me_official"))
    from me_official import ray_engine, token_mapping

    ray_engine.ray = types.SimpleNamespace(get=lambda value: value, is_initialized=lambda: True)
    token_mapping.check_byte_mappings = tolerant(token_mapping.check_byte_mappings)
    return ray_engine


class ByteTable(dict):
    """A byte-level (BBPE) tokenizer's byte table holding only the bytes it can spell, of the size the
    code takes as BBPE's (128): the code then treats it as it treats any BBPE table."""

    def __len__(self) -> int:
        return 128


def tolerant(check_byte_mappings):
    """The code's byte table builder, for a tokenizer with no token for a few ASCII control bytes
    (SmolLM2: bytes 4, 6, 19, 20, 22 and 29; the code raises on them, as GaC's builder does:
    docs/fidelity.md#gac): those bytes are left out of its table (their union entries get no mass from
    that member; they are never generated here), the table still of BBPE's size."""
    def check(tokenizer):
        plain, unspelled = tokenizer.tokenize, set()

        def tokenize(text, **kwargs):
            pieces = plain(text, **kwargs)
            if not pieces:
                unspelled.add(f"<0x{ord(text):02X}>")
            return pieces or [tokenizer.eos_token]

        tokenizer.tokenize = tokenize
        try:
            table = check_byte_mappings(tokenizer)
        finally:
            del tokenizer.tokenize
        if not unspelled:
            return table
        return ByteTable((key, token_id) for key, token_id in table.items() if key not in unspelled)
    return check


class InProcess:
    """An actor handle whose ``method.remote(...)`` is ``method(...)``."""

    def __init__(self, target):
        self.target = target

    def __getattr__(self, name):
        return types.SimpleNamespace(remote=getattr(self.target, name))


class Picks:
    """A ``random.Random`` stand-in for the engine's member picks: ``choices`` with the given uniforms."""

    def __init__(self, uniforms):
        self.uniforms = iter(uniforms)
        self.picked: list[int] = []

    def choices(self, population, weights, k=1):
        cumulative = list(accumulate(weights))
        index = population[bisect_right(cumulative, next(self.uniforms) * cumulative[-1])]
        self.picked.append(index)
        return [index]


def official_engine(module, members, folder: Path, seed: int):
    """The official engine (method ``me``) over ensbench's loaded members, in this process."""
    from transformers import AutoTokenizer

    runners = []
    for member in members:
        path = folder / member.name
        member.tokenizer.save_pretrained(path)
        runner = module.ModelRunner.__new__(module.ModelRunner)
        runner.name, runner.path, runner.device = member.name, str(path), member.model.device
        runner.tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        runner.model, runner.input_ids, runner.pending_input_ids = member.model, None, None
        runner.past_key_values, runner.prompt_len = None, 0
        runners.append(runner)
    group = module.ModelGroupWorker.__new__(module.ModelGroupWorker)
    group.runners = runners
    engine = module.RayGenerationEngine.__new__(module.RayGenerationEngine)
    engine.method, engine.models = "me", [{"name": m.name, "path": r.path} for m, r in zip(members, runners)]
    engine.active_models, engine.generation = engine.models, {"seed": seed}
    engine.weights = module._normalize_weights(engine.models)
    engine._rng, engine.timer, engine.group, engine.workers = None, module.TokenTimer(), InProcess(group), None
    engine.tokenizer_infos = engine._tokenizer_infos()
    engine.mapper = module.TokenMapper(engine.tokenizer_infos)
    return engine


def two_sample_chi_square(first: Counter, second: Counter) -> tuple[float, int]:
    """(chi^2, degrees) of homogeneity of two samples' counts; categories expected under 5 lumped."""
    n1, n2 = sum(first.values()), sum(second.values())
    cells, rest = [], [0, 0]
    for category in set(first) | set(second):
        a, b = first[category], second[category]
        if min((a + b) * n1, (a + b) * n2) / (n1 + n2) < 5:
            rest[0] += a
            rest[1] += b
        else:
            cells.append((a, b))
    if sum(rest):
        cells.append(tuple(rest))
    chi2 = 0.0
    for a, b in cells:
        e1, e2 = (a + b) * n1 / (n1 + n2), (a + b) * n2 / (n1 + n2)
        chi2 += (a - e1) ** 2 / e1 + (b - e2) ** 2 / e2
    return chi2, max(1, len(cells) - 1)


def upper_tail(chi2: float, degrees: int) -> float:
    """P(X >= chi2) for X ~ chi^2(degrees), exactly: the Poisson sum for even degrees, the normal tail
    plus its series for odd ones."""
    half = chi2 / 2
    if degrees % 2 == 0:
        term = total = math.exp(-half)
        for i in range(1, degrees // 2):
            term *= half / i
            total += term
        return total
    total = math.erfc(math.sqrt(half))
    term = math.sqrt(2 * chi2 / math.pi) * math.exp(-half)
    for odd in range(3, degrees + 1, 2):
        total += term
        term *= chi2 / odd
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", required=True)
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import torch

    from ensemble_bench.decoding.decode import prefill
    from ensemble_bench.decoding.sampling import RequestSampling, SamplingParams, request_generator, request_key
    from ensemble_bench.members import Prompt, load_member
    from ensemble_bench.methods import GenerationRequest, get_method

    torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp(prefix="me-official-"))
    module = import_official(args.repo, folder)
    members = [load_member("smollm2-135m", name="smollm2"), load_member("qwen2.5-0.5b", name="qwen2.5")]
    engine = official_engine(module, members, folder, args.seed)
    me = get_method("me")
    method = me(members, me.Params(), batch_size=8)
    params = SamplingParams(do_sample=True, temperature=1.0)
    texts = QUESTIONS[:args.prompts]
    asked = {"do_sample": True, "temperature": 1.0, "max_gen_toks": args.tokens, "until": []}

    def request(text: str, repeat: int = 0, sampled: bool = True) -> GenerationRequest:
        sampling = RequestSampling(params, args.seed, request_key(text, {}), repeat) if sampled else None
        return GenerationRequest(Prompt(text=text), (), args.tokens, sampling)

    def spelled(ids: list[int]) -> str:
        return engine.group.target.runners[0].tokenizer.decode(ids, skip_special_tokens=False)

    captured = {}  # prompt text -> its state (the batches run longest prompt first)
    start = method.start
    method.start = lambda r: captured.setdefault(r.prompt.text, start(r))
    ours = method.generate([request(t) for t in texts])
    rows = []
    for k, text in enumerate(texts):
        state = captured[text]
        stream = request_generator(args.seed, request_key(text, {}), 0)
        uniforms = [float(torch.rand((), dtype=torch.float64, generator=stream)) for _ in range(2 * args.tokens)]
        engine._rng = Picks(uniforms[0::2])
        official_text = engine.generate(text, asked)
        shared = min(len(state.drawn_by), len(engine._rng.picked))
        rows.append({"prompt": k, "picks_agree": state.drawn_by[:shared] == engine._rng.picked[:shared],
                     "steps_compared": shared, "ours_picks": state.drawn_by, "official_picks": engine._rng.picked,
                     "ours": ours[k].text, "official": official_text})
    method.start = start

    chi_total, degrees_total, failing, picked = 0.0, 0, 0, {"ours": Counter(), "official": Counter()}
    engine._rng = __import__("random").Random(args.seed)
    for k, text in enumerate(texts):
        for runner in engine.group.target.runners:
            runner.reset(text)
        first = [(i, runner.next_probs()) for i, runner in enumerate(engine.group.target.runners)]
        official = Counter()
        for _ in range(args.draws):
            chosen = engine._rng.choices(range(len(first)), engine.weights, k=1)[0]
            picked["official"][chosen] += 1
            official[spelled(engine._select_token([first[chosen]], asked)[0])] += 1
        states = [method.start(request(text, repeat)) for repeat in range(args.draws)]
        dists = prefill(members, [[method.render(i, Prompt(text=text))] * args.draws for i in range(len(members))],
                        [args.tokens] * args.draws)
        advances = method.choose(dists, states).advances
        for state in states:
            picked["ours"][state.drawn_by[0]] += 1
        mine = Counter("<stop>" if a.finish else a.data.decode("utf-8", errors="replace") for a in advances)
        official = Counter("<stop>" if t in {"<|im_end|>", "<|endoftext|>"} else t for t in official.elements())
        chi2, degrees = two_sample_chi_square(official, mine)
        chi_total, degrees_total = chi_total + chi2, degrees_total + degrees
        failing += upper_tail(chi2, degrees) < 0.001
        rows[k].update(first_token_chi2=round(chi2, 2), first_token_degrees=degrees,
                       first_tokens_ours=dict(mine.most_common(5)), first_tokens_official=dict(official.most_common(5)))

    greedy_ours = method.generate([request(t, sampled=False) for t in texts])
    engine._rng = __import__("random").Random(42)
    greedy_equal = 0
    for k, text in enumerate(texts):
        official_text = engine.generate(text, {**asked, "do_sample": False})
        rows[k].update(greedy_ours=greedy_ours[k].text, greedy_official=official_text)
        greedy_equal += official_text == greedy_ours[k].text
        print(json.dumps(rows[k], ensure_ascii=False), flush=True)

    summary = {"picks_agree": sum(r["picks_agree"] for r in rows), "prompts": len(rows),
               "first_token_chi2": round(chi_total, 2), "first_token_degrees": degrees_total,
               "first_token_p": upper_tail(chi_total, degrees_total), "prompts_failing_at_0.001": failing,
               "picked_ours": dict(picked["ours"]), "picked_official": dict(picked["official"]),
               "greedy_equal": greedy_equal}
    print(json.dumps(summary))
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1, ensure_ascii=False),
                                  encoding="utf-8")


if __name__ == "__main__":
    main()
