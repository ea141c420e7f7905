"""AdaFuse against the authors' code (CCM0111/AdaFuse), on CPU, greedy, beside ensbench.

The official script (AdaFuse_two_models.py) is read at run time from a local git copy (``--repo``,
default the mirror; never committed here) and imported from a temporary folder. It imports a
``utils`` package its repository does not contain (answer parsing only): empty stand-ins are put in
``sys.modules``. Its own functions are driven here: ``generate_candidate_spans`` (each model's
candidates), ``compute_span_perplexity`` (each model's mean NLL of a candidate) and the round loop of
``ensemble_decoding_worker`` (the lowest average wins; the prefix grows by ``" " + span``; it stops
at "question:", "note:", "<", a boxed answer or an EOS string), re-typed because the worker
hard-codes CUDA, its data loader and its log files. Its ``torch.amp.autocast("cuda")`` is a no-op
on CPU (float32 throughout).

Both run on the packaged SmolLM2-135M (first, the lead) + Qwen2.5-0.5B, plain-text prompts
("Question: ...\\nAnswer:"), theta_delta 0.7, B = 3 (the official ``--beam_size``; its default 1
takes a branch without exploration), the official ``--span_length`` 1 (``--span-length``; its
default 4 makes the "first word" of a span up to four words), ensbench with ``commit_rule: paper``
and ``code``, 20 new tokens. Texts are compared with whitespace collapsed (the official spans are words joined by single
spaces), over the words both have (ensbench's last word may be cut by the token budget). For each
prompt whose words differ, the official round holding the first differing word says why: ensbench's
words were among its candidates (the scores differ) or not (the candidates differ); docs/fidelity.md.
``--analyse FILE.jsonl`` classifies the lines of a run again (partial runs too) without the models.

    python scripts/compare_adafuse_official.py [--prompts 40] [--tokens 20] [--threads 1] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import types
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MIRROR = "/work/.mirror/CCM0111+AdaFuse/repo"
from fidelity_prompts import SUMS, TOPICS  # noqa: E402  (scripts/, on the path when run)

QUESTIONS = ([f"What is one fact about {t}?" for t in TOPICS]
             + [f"What is {a} plus {b}?" for a, b in SUMS])


def load_official(repo: str, into: Path):
    """The official two-model script at the copy's HEAD, imported from ``into`` (read, never copied here)."""
    source = subprocess.run(["git", "-C", repo, "show", "HEAD:AdaFuse_two_models.py"], check=True,
                            capture_output=True).stdout
    path = into / "adafuse_official.py"
    path.write_bytes(source)
    for name in ("utils", "utils.ans_process", "utils.collate_fun", "utils.extract_response"):
        stand_in = types.ModuleType(name)
        stand_in.__all__ = []
        sys.modules.setdefault(name, stand_in)
    spec = importlib.util.spec_from_file_location("adafuse_official", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def words(text: str) -> list[str]:
    return text.split()


def differs(official: list[str], ours: list[str]) -> bool:
    """Whether two word lists differ where both have words (ours without its last, maybe cut, word)."""
    whole = ours[:-1] if len(ours) > 1 else ours
    n = min(len(whole), len(official))
    return official[:n - 1] != whole[:n - 1] if n > 1 else False


class Official:
    """The official round loop over two (model, tokenizer) pairs; records each round."""

    def __init__(self, module, pairs, theta: float, beam: int, span_length: int):
        from transformers import GenerationConfig

        self.m, self.pairs, self.theta, self.beam, self.span_length = module, pairs, theta, beam, span_length
        self.configs = [GenerationConfig(num_beams=beam, num_return_sequences=beam, do_sample=False,
                                         pad_token_id=tok.eos_token_id, max_new_tokens=10, use_cache=True)
                        for _, tok in pairs]

    def generate(self, prompt: str, tokens: int, against: list[list[str]] = ()) -> tuple[str, list[dict]]:
        """The official text and rounds; stops early once its words differ from every word list in
        ``against`` (the verdict cannot change after that)."""
        prefix, rounds = prompt, []
        lead_tok = self.pairs[0][1]
        while len(lead_tok(prefix[len(prompt):], add_special_tokens=False)["input_ids"]) < tokens:
            found = [self.m.generate_candidate_spans(model, tok, prefix, self.span_length, config, self.beam,
                                                         self.theta, 3)
                     for (model, tok), config in zip(self.pairs, self.configs)]
            candidates: dict[str, list] = {}
            for v, spans in enumerate(found):
                for span, ids in spans:
                    candidates.setdefault(span, [None, None])[v] = ids
            scored = []
            for span, own in candidates.items():
                nll = [self.m.compute_span_perplexity(model, tok, prefix, own[v] if own[v] is not None
                                                      else tok(span, add_special_tokens=False)["input_ids"])
                       for v, (model, tok) in enumerate(self.pairs)]
                valid = [x for x in nll if x == x]  # the official skips a NaN score (an empty span)
                if valid:
                    scored.append((span, sum(valid) / len(valid), nll))
            if not scored:
                break
            span = min(scored, key=lambda s: s[1])[0]
            rounds.append({"candidates": [(s, round(a, 4)) for s, a, _ in scored], "selected": span,
                           "per_model": [[s for s, _ in spans] for spans in found]})
            if self._stops(span):
                kept = self._kept(span)
                prefix += " " + kept if kept else ""
                break
            prefix += " " + span
            if any(tok.eos_token and tok.eos_token in span for _, tok in self.pairs):
                break
            if against and all(differs(words(prefix[len(prompt):]), theirs) for theirs in against):
                break
        return prefix[len(prompt):], rounds

    def _stops(self, span: str) -> bool:
        import re
        return bool(re.search(r"\\?boxed\s*\{", span, flags=re.IGNORECASE)) or "<" in span or any(
            marker in span.lower() for marker in ("question:", "note:"))

    def _kept(self, span: str) -> str:
        import re
        if re.search(r"\\?boxed\s*\{", span, flags=re.IGNORECASE):
            return self.m.extract_boxed_answer(span)
        return self.m.clean_text_before_question(span)


SCORING = "scoring rule (both had the word; the official scores its own candidate by all its generated ids)"
CANDIDATES = "candidate set (the official never proposed ensbench's word: whitespace words, 7-12 token chunks)"
STOPPED = "the official stopped (a stop marker or its EOS text in a span)"
PLACEMENT = "exploration placement (Figure 1 vs the script: commit_rule code agrees)"


def classify(their_rounds: list[dict], ours_words: list[str], their_words: list[str]) -> str:
    """The cause of a divergence, read off the official round that holds the first differing word:
    whether ensbench's words there were among that round's official candidates."""
    first = next((i for i, (a, b) in enumerate(zip(ours_words, their_words)) if a != b), None)
    if first is None:
        return STOPPED
    done = 0
    for round_ in their_rounds:
        span = words(round_["selected"])
        if done + len(span) > first:
            ours_here = ours_words[done:first + 1]
            proposed = [words(c) for c, _ in round_["candidates"]]
            if any(c[:len(ours_here)] == ours_here for c in proposed):
                return SCORING
            return CANDIDATES
        done += len(span)
    return STOPPED


def analyse(rows: list[dict]) -> dict:
    """Agreement per commit rule, and the cause of each divergence."""
    tally: dict = {}
    for row in rows:
        their_words = words(row["official"])
        for rule in ("paper", "code"):
            mine = words(row[rule]["text"])
            whole = mine[:-1] if len(mine) > 1 else mine  # the token budget may cut the last word
            n = min(len(whole), len(their_words))
            same = n > 0 and whole[:n] == their_words[:n]
            row[rule]["agree"] = same
            row[rule]["cause"] = None if same else classify(row["official_rounds"], whole, their_words)
        if not row["paper"]["agree"] and row["code"]["agree"]:
            row["paper"]["cause"] = PLACEMENT
        for rule in ("paper", "code"):
            tally.setdefault(rule, Counter())["agree" if row[rule]["agree"] else row[rule]["cause"]] += 1
    return {rule: dict(counts) for rule, counts in tally.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=MIRROR)
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--start", type=int, default=0, help="skip the first prompts (a run continued)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--theta", type=float, default=0.7)
    parser.add_argument("--beam", type=int, default=3)
    parser.add_argument("--span-length", type=int, default=1,
                        help="the official --span_length (its default 4 makes its first 'word' up to 4 words)")
    parser.add_argument("--out", default="adafuse_official.json")
    parser.add_argument("--analyse", metavar="JSONL",
                        help="classify a finished (or partial) run's lines again; no model runs")
    args = parser.parse_args()
    if args.analyse:
        report([json.loads(line) for line in Path(args.analyse).read_text().splitlines() if line.strip()], args.out)
        return

    import torch

    from ensemble_bench.members import Prompt, load_member
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.adafuse import AdaFuse, AdaFuseParams

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        official = load_official(args.repo, Path(folder))
    members = [load_member("smollm2-135m", name="smollm2", chat_template=False),
               load_member("qwen2.5-0.5b", name="qwen2.5", chat_template=False)]
    prompts = [f"Question: {q}\nAnswer:" for q in QUESTIONS[:args.prompts]]
    requests = [GenerationRequest(Prompt(text=p), (), args.tokens) for p in prompts]
    methods = {rule: AdaFuse(members, AdaFuseParams(theta_delta=args.theta, beam_size=args.beam, commit_rule=rule))
               for rule in ("paper", "code")}
    reference = Official(official, [(m.model, m.tokenizer) for m in members], args.theta, args.beam,
                         args.span_length)
    rows = []
    with open(args.out + "l", "w") as log:  # one line per prompt as it finishes
        for i, (prompt, request) in enumerate(zip(prompts, requests)):
            if i < args.start:
                continue
            row = {"prompt": prompt}
            for rule, method in methods.items():
                mine = method.generate([request])[0].text
                row[rule] = {"text": mine, "rounds": method.traces[-1]["rounds"]}
            text, rounds = reference.generate(prompt, args.tokens, [words(row[r]["text"]) for r in methods])
            row.update({"official": text, "official_rounds": rounds})
            analyse([row])
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(f"p{i}: paper {row['paper']['agree']} code {row['code']['agree']} | ours {row['paper']['text']!r} | "
                  f"official {text!r}", flush=True)
    report(rows, args.out)


def report(rows: list[dict], out: str) -> None:
    tally = analyse(rows)
    Path(out).write_text(json.dumps({"rows": rows, "tally": tally}, indent=1))
    for rule, counts in tally.items():
        print(f"commit_rule {rule}: {counts.get('agree', 0)}/{len(rows)} agree; " +
              "; ".join(f"{n} {cause}" for cause, n in counts.items() if cause != "agree"))


if __name__ == "__main__":
    main()
