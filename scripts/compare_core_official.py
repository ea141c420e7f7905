"""CoRE on GaC against the authors' code (zhichenz98/CoRE-EACL26), on CPU, greedy, beside ensbench.

The official code is read at run time from a local git copy (``--repo``, default the mirror; never
committed here): its ``src/`` is unpacked into a temporary folder and imported. Its CoRE step is its
own ``TokenMappingProcessor`` (src/logits_processor.py), called with the members' logits exactly as
its decode loop (src/run.py) gives them: the main model reads its ids plus the fused tokens; the
assist model reads its own prompt at the first step and, from the second on, the main model's
decoded text (special tokens dropped), re-encoded, without a cache. Its ``gac`` alignment (assist
tokens onto main tokens of the same normalised string, src/utils/calculate_token_map.py) is built
from its own ``_build_id_to_token``; the official builder multiplies two dense [V x |union|]
matrices (tens of GB for a 152k vocabulary), so the same product is formed sparsely here.

ensbench runs ``gac`` with ``core: true`` (the main model as ``lead``), once with the paper's rules
and once with ``core_rules: official``. Every prompt whose texts differ is replayed at its first
differing step with both decisions taken on the same state, one official rule at a time switched
off, to name the cause (docs/fidelity.md).

    python scripts/compare_core_official.py [--prompts 40] [--tokens 20] [--threads 1] [--out FILE.jsonl]
    python scripts/compare_core_official.py --summarise FILE.jsonl
    python scripts/compare_core_official.py --equations 1000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MIRROR = "/work/.mirror/zhichenz98+CoRE-EACL26/repo"
RULES = ("official", "paper")  # ensbench's core_rules, each compared with the official run
from fidelity_prompts import SUMS, TOPICS  # noqa: E402  (scripts/, on the path when run)

QUESTIONS = ([f"Tell me one fact about {t}." for t in TOPICS]
             + [f"What is {a} plus {b}? Answer with the number." for a, b in SUMS])


def unpack_official(repo: str, into: Path) -> Path:
    """The official ``src/`` at the copy's HEAD, unpacked into ``into`` (read, never copied here)."""
    archive = subprocess.run(["git", "-C", repo, "archive", "HEAD", "src"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def gac_token_map(official, main_tok, assist_tok, main_size: int, assist_size: int):
    """The official ``gac`` assist->main map [V_assist, V_main]: 1 where both ids spell the same
    normalised string (its ``_build_id_to_token``), as its dense product gives it."""
    import torch

    main, assist = official._build_id_to_token(main_tok), official._build_id_to_token(assist_tok)
    by_text: dict[str, list[int]] = {}
    for token_id, text in main.items():
        if text and token_id < main_size:
            by_text.setdefault(text, []).append(token_id)
    pairs = [(a, m) for a, text in assist.items() if text and a < assist_size for m in by_text.get(text, [])]
    index = torch.tensor(pairs, dtype=torch.long).T
    return torch.sparse_coo_tensor(index, torch.ones(index.shape[1]), (assist_size, main_size)).coalesce()


class Reader:
    """A model's next-token logits after ids, as the official loop gets them from a forward pass over
    the whole sequence without a cache; here the cache of the longest common prefix with the last
    call is reused (the same values up to float rounding; only a near-tie could tell them apart, and
    every divergence below is replayed without a cache)."""

    def __init__(self, model):
        self.model, self.ids, self.cache = model, [], None

    def __call__(self, ids: list[int]):
        import torch

        common = 0
        while common < min(len(ids), len(self.ids)) and ids[common] == self.ids[common]:
            common += 1
        common = min(common, len(ids) - 1)  # at least one id is read
        if self.cache is not None and common < len(self.ids):
            self.cache.crop(common - len(self.ids))  # transformers 5: a negative count of ids to drop
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([ids[common:]]), past_key_values=self.cache, use_cache=True)
        self.ids, self.cache = list(ids), out.past_key_values
        return out.logits[:, -1, :].float()


READS: dict[tuple, object] = {}  # (model, ids) -> logits, emptied for each prompt


def last_logits(model, ids: list[int]):
    """The official loop's read: the whole sequence, no cache (each state read once per prompt)."""
    import torch

    key = (id(model), tuple(ids))
    if key not in READS:
        with torch.no_grad():
            READS[key] = model(input_ids=torch.tensor([ids]), use_cache=False).logits[:, -1, :].float()
    return READS[key]


class Official:
    """The official processor's step, and its decode loop (run.py) for one prompt."""

    def __init__(self, module, main, assist, token_map, variant: str, logs: Path):
        self.module, self.main, self.assist, self.map = module, main, assist, token_map
        self.variant, self.logs = variant, str(logs)  # the processor names a log file there (written in debug only)
        self.read_main, self.read_assist = Reader(main.model), Reader(assist.model)
        self.stops = {main.tokenizer.eos_token_id, main.tokenizer.convert_tokens_to_ids("<|im_end|>")}  # run.py's

    def step(self, main_ids: list[int], assist_logits, substring: bool = True, main_logits=None,
             top_k: int = 10) -> int:
        import queue

        self.module.check_substring = substring
        fused_ids, assist_queue = queue.Queue(), queue.Queue()
        assist_queue.put(assist_logits)
        processor = self.module.TokenMappingProcessor(
            [0.5, 0.5], fused_ids, [assist_queue], self.logs, self.main.tokenizer, [(None, self.map)], "cpu", "gac",
            self.variant, "NQ", None, topK=top_k, assist_tokenizer_list=[self.assist.tokenizer])
        processor(None, last_logits(self.main.model, main_ids) if main_logits is None else main_logits)
        return int(fused_ids.get_nowait())

    def assist_input(self, prompt_ids: list[int], main_ids: list[int], step: int) -> list[int]:
        """What run.py gives the assist: its own prompt first, then the main model's decoded text."""
        if step == 0:
            return prompt_ids
        text = self.main.tokenizer.decode(main_ids, skip_special_tokens=True)
        return self.assist.tokenizer(text, add_special_tokens=False).input_ids

    def generate(self, main_prompt: list[int], assist_prompt: list[int], tokens: int) -> list[int]:
        stops = self.stops
        ids: list[int] = []
        for step in range(tokens):
            assist_ids = self.assist_input(assist_prompt, main_prompt + ids, step)
            main_logits = self.read_main(main_prompt + ids)
            token = self.step(main_prompt + ids, self.read_assist(assist_ids), main_logits=main_logits)
            if token in stops:
                break
            ids.append(token)
        return ids


def ours_decision(method, main_ids: list[int], assist_ids: list[int], lead: int) -> bytes:
    """Our fused choice (bytes) on this state: the members' full log-probs, union projections, CoRE."""
    import torch

    logits = [last_logits(m.model, ids) for m, ids in zip(method.members, _ordered(assist_ids, main_ids, lead))]
    logprobs = [torch.log_softmax(lg, dim=-1) for lg in logits]  # as the members give them (members/local.py)
    fused = method.core.fuse(method.mixture.projections(logprobs), method.weights, lead)
    return method.union.entries[int(fused.argmax())] or b"<stop>"


def _ordered(assist_ids, main_ids, lead):
    return [main_ids, assist_ids] if lead == 0 else [assist_ids, main_ids]


def first_difference(official: Official, main_prompt, generated: list[int], ours_text: str) -> int | None:
    """The first official step whose text ours does not continue with (None: ours continues it all)."""
    text = ""
    for step in range(len(generated)):
        text = official.main.tokenizer.decode(generated[:step + 1])
        if not ours_text.startswith(text):
            return step
    return None if ours_text == text else len(generated)


def explain(official: Official, method, lead: int, main_prompt, assist_prompt, generated, step: int) -> dict:
    """Both decisions on the same state at the first differing step, one official rule off at a time."""
    main_ids = main_prompt + generated[:step]
    ours_like = assist_prompt + official.assist.tokenizer(official.main.tokenizer.decode(generated[:step]),
                                                           add_special_tokens=False).input_ids
    actual_assist = official.assist_input(assist_prompt, main_ids, step)
    pieces = method.members[lead].vocab.pieces

    def spelled(token: int) -> bytes:
        if token in official.stops or token >= len(pieces) or pieces[token] is None:
            return b"<stop>"
        return pieces[token]

    ours = ours_decision(method, main_ids, ours_like, lead)
    assist_logits = last_logits(official.assist.model, ours_like)
    same_input = spelled(official.step(main_ids, assist_logits))
    no_substring = spelled(official.step(main_ids, assist_logits, substring=False))
    whole = min(official.assist.model.config.vocab_size, official.main.model.config.vocab_size)
    untruncated = spelled(official.step(main_ids, assist_logits, substring=False, top_k=whole))
    recorded = spelled(generated[step]) if step < len(generated) else b"<stop>"
    uncached = spelled(official.step(main_ids, last_logits(official.assist.model, actual_assist)))
    found = {"step": step, "official": recorded, "official_uncached": uncached,
             "ours": ours, "official_on_our_input": same_input, "official_no_substring_rule": no_substring,
             "official_no_substring_no_top10": untruncated,
             "assist_input_differs": actual_assist != ours_like}
    if recorded != uncached:
        cause = "float rounding: the official step without a cache chooses otherwise (a near-tie)"
    elif found["official"] != same_input and same_input == ours:
        cause = "assist input (run.py feeds the assist the main model's decoded text from step 2)"
    elif same_input != ours and no_substring == ours:
        cause = "substring rule (the official code keeps the main token when the fused one extends it)"
    elif same_input != ours and untruncated == ours:
        cause = "top-10 truncation (the official code keeps each model's 10 best tokens)"
    elif ours not in method.entries_of_lead:
        cause = "ours chose a union entry the main vocabulary lacks (the official map keeps main tokens only)"
    else:
        cause = "other"
    found["cause"] = cause
    return {k: v.decode("utf-8", "replace") if isinstance(v, bytes) else v for k, v in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", default=MIRROR)
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variant", default="consist-rbf")
    parser.add_argument("--out", default=None, help="JSON lines, one per prompt (default: in the temporary folder)")
    parser.add_argument("--summarise", default=None, help="only summarise the JSON lines of an earlier run")
    parser.add_argument("--equations", type=int, default=0, help="only compare CoRE's step on N random inputs")
    args = parser.parse_args()
    if args.equations:
        folder = Path(tempfile.mkdtemp(prefix="core-official-"))
        sys.path.insert(0, str(unpack_official(args.repo, folder)))
        import logits_processor

        print(json.dumps(equations(logits_processor, args.equations)))
        return
    if args.summarise:
        summarise([json.loads(line) for line in Path(args.summarise).read_text(encoding="utf-8").splitlines()])
        return

    import torch

    from ensemble_bench.members import Prompt, load_member
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.gac import Gac, GacParams

    torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp(prefix="core-official-"))
    sys.path.insert(0, str(unpack_official(args.repo, folder)))
    import logits_processor
    from utils import calculate_token_map

    members = [load_member("smollm2-135m", name="smollm2"), load_member("qwen2.5-0.5b", name="qwen2.5")]
    lead = 1  # the main model: Qwen2.5 (the stronger), as the paper's main model
    main, assist = members[lead], members[1 - lead]
    token_map = gac_token_map(calculate_token_map, main.tokenizer, assist.tokenizer,
                              main.model.config.vocab_size, assist.model.config.vocab_size)
    official = Official(logits_processor, main, assist, token_map, args.variant, folder)
    prompts = [Prompt(messages=(("user", q),)) for q in QUESTIONS[:args.prompts]]

    methods = {rules: Gac(members, GacParams(core=True, lead=lead, core_rules=rules), batch_size=1) for rules in RULES}
    for method in methods.values():
        method.entries_of_lead = {method.union.entries[u] for u in range(method.union.size)
                                  if int(method.union.maps[lead].to_member[u]) >= 0}
    lines = Path(args.out or folder / "rows.jsonl")
    lines.write_text("", encoding="utf-8")
    for k, prompt in enumerate(prompts):  # one prompt at a time, each written when done
        READS.clear()
        ids = official.generate(main.render(prompt), assist.render(prompt), args.tokens)
        theirs = main.tokenizer.decode(ids)
        row = {"prompt": k, "question": QUESTIONS[k], "official_text": theirs}
        for rules, method in methods.items():
            ours = method.generate([GenerationRequest(prompt, (), args.tokens)])[0].text
            verdict = "equal" if theirs == ours else ("prefix" if ours.startswith(theirs) or theirs.startswith(ours)
                                                      else "differ")
            row[rules] = {"verdict": verdict, "ours": ours}
            step = None if verdict == "equal" else first_difference(official, main.render(prompt), ids, ours)
            if step is not None and (step < len(ids) or len(ids) < args.tokens):
                row[rules]["first_difference"] = explain(official, method, lead, main.render(prompt),
                                                         assist.render(prompt), ids, step)
        with lines.open("a", encoding="utf-8") as out:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(k, {rules: row[rules]["verdict"] for rules in RULES}, flush=True)
    summarise([json.loads(line) for line in lines.read_text(encoding="utf-8").splitlines()])


def cause_of(row: dict, rules: str) -> str | None:
    """A prompt's first difference's cause; under the paper's rules, where ours under the official
    rules still agreed at that step, the rules themselves (the same state, only the rules differ)."""
    found = row[rules].get("first_difference")
    if found is None:
        return None
    other = row["official"].get("first_difference")
    later = row["official"]["verdict"] != "differ" if other is None else other["step"] > found["step"]
    if rules == "paper" and later:
        return "the paper's rules (core_rules: official follows the code here)"
    if rules == "paper" and other["step"] == found["step"] and other["ours"] != found["ours"]:
        return f"{other['cause']}; and the paper's rules"  # the official rules' row names the first
    return found["cause"]


def equations(module, trials: int, seed: int = 0) -> dict:
    """CoRE's step alone: the official ``compute_consist_score`` and ensbench's ``CoreFusion``
    (``core_rules: official``) on the same random top-10 distributions of 2-3 members over 1,000
    tokens, the main model first: the largest difference of the weights and of the fused
    distributions, and how often the fused argmax differs."""
    import torch

    from ensemble_bench.methods.core import CoreFusion, CoreParams

    generator = torch.Generator().manual_seed(seed)
    worst_weight = worst_fused = 0.0
    argmax_differs = 0
    for trial in range(trials):
        count = 2 + trial % 2
        probs = []
        for _ in range(count):
            logits = torch.randn(1, 1000, generator=generator, dtype=torch.float64) * 3
            top = logits.topk(10).indices
            probs.append(torch.zeros_like(logits).scatter(1, top, torch.softmax(logits[0, top[0]], 0)[None]))
        scores, weights = module.compute_consist_score(probs, "consist-rbf", "NQ")
        theirs = probs[0] * weights[0] + sum(probs[i] * weights[i] * scores[i] for i in range(1, count))
        core = CoreFusion(CoreParams(core=True, core_rules="official"), count)
        ours = core.fuse(torch.stack(probs), torch.ones(count), 0)
        worst_weight = max(worst_weight, max(abs(a - b) for a, b in zip(core.counters()["core_weights_mean"],
                                                                        weights.tolist())))
        worst_fused = max(worst_fused, float((ours - theirs).abs().max()))
        argmax_differs += int(ours.argmax() != theirs.argmax())
    return {"trials": trials, "max_weight_difference": worst_weight, "max_fused_difference": worst_fused,
            "argmax_differs": argmax_differs}


def summarise(rows: list[dict]) -> None:
    for rules in RULES:
        counts = Counter(r[rules]["verdict"] for r in rows)
        causes = Counter(cause_of(r, rules) for r in rows if "first_difference" in r[rules])
        print(f"core_rules {rules}: {counts.get('equal', 0)}/{len(rows)} equal, {counts.get('prefix', 0)} prefix, "
              f"{counts.get('differ', 0)} differ; first differences: {dict(causes)}", flush=True)


if __name__ == "__main__":
    main()
