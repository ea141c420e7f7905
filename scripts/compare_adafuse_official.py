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
and ``code`` (``--word-unit whitespace``: with the script's whitespace words), 20 new tokens.

Two official variants run on every prompt: ``as_is`` (the script's own scoring: a proposer's
candidate by all the ids it generated, the other model by ``tokenizer(span)`` without the space the
prefix then gets) and ``fixed``, the same code with only that scoring replaced at run time: each
model scores the ids its tokenizer gives the candidate's text ``" " + span`` after the prefix
(``ids_after``).

Texts are compared word by word, whitespace collapsed (the official spans are words joined by single
spaces). ensbench's last word is left out when it reached the token budget (it may be cut); a text
that ended by a stop parts from a longer one where it ends (``parting``). For each divergence, both
sides' rounds at the first differing character: the candidates, each model's mean NLL, the mean and
the winner's margin (``verdicts`` in the output); "scores" when each side's winner was among the
other's candidates, else "candidate set". ``same_candidates`` / ``largest_nll_gap``: how many
candidates both sides scored at the same point before they part, and the largest difference in a
model's NLL of one. ``--analyse RUN.jsonl ...`` redoes this without the models (lines of one prompt
from several runs merged); ``--reuse RUN.jsonl ...`` keeps the official variants an earlier run has.

Faithful speed-ups only: ``model.generate`` and ``compute_span_perplexity`` are memoised per prompt
on their exact inputs (ids, attention mask, generation config), so a call repeated with the same
inputs (the two variants share rounds until they part) returns the first call's result instead of
recomputing it. Nothing they compute changes. docs/fidelity.md has the figures.

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
import time
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


def memoise_generate(model, calls: Counter) -> dict:
    """Makes ``model.generate`` return the stored result of an earlier call with the same ids, mask
    and generation config (greedy and beam search on CPU are deterministic). Returns the store."""
    plain, store = model.generate, {}

    def generate(input_ids, attention_mask, generation_config, **kwargs):
        key = (tuple(input_ids.shape), tuple(input_ids.flatten().tolist()), tuple(attention_mask.flatten().tolist()),
               generation_config.to_json_string(), tuple(sorted(kwargs.items())))
        calls["generate"] += 1
        if key not in store:
            calls["generate_run"] += 1
            store[key] = plain(input_ids=input_ids, attention_mask=attention_mask,
                               generation_config=generation_config, **kwargs)
        return store[key]

    model.generate = generate
    return store


def ids_after(tok, prefix: str, text: str) -> list[int]:
    """The ids the tokenizer gives ``text`` after ``prefix`` (the tail of the joint encoding, where
    it keeps the prefix's ids; else ``text`` encoded alone)."""
    head = tok(prefix)["input_ids"]
    joint = tok(prefix + text)["input_ids"]
    if joint[:len(head)] == head:
        return joint[len(head):]
    return tok(text, add_special_tokens=False)["input_ids"]


class Official:
    """The official round loop over two (model, tokenizer) pairs; records each round. ``scoring``:
    ``as_is`` (the script's ids) or ``fixed`` (each model's ids of ``" " + span`` after the prefix)."""

    def __init__(self, module, pairs, theta: float, beam: int, span_length: int):
        from transformers import GenerationConfig

        self.m, self.pairs, self.theta, self.beam, self.span_length = module, pairs, theta, beam, span_length
        self.configs = [GenerationConfig(num_beams=beam, num_return_sequences=beam, do_sample=False,
                                         pad_token_id=tok.eos_token_id, max_new_tokens=10, use_cache=True)
                        for _, tok in pairs]
        self.calls = Counter()
        self.stores = [memoise_generate(model, self.calls) for model, _ in pairs]
        self.scores: dict = {}

    def new_prompt(self) -> None:
        for store in self.stores:
            store.clear()
        self.scores.clear()

    def _candidates(self, prefix: str) -> tuple[list, dict]:
        found = []
        for (model, tok), config in zip(self.pairs, self.configs):
            found.append(self.m.generate_candidate_spans(model, tok, prefix, self.span_length, config, self.beam,
                                                         self.theta, 3))
        candidates: dict[str, list] = {}
        for v, spans in enumerate(found):
            for span, ids in spans:
                candidates.setdefault(span, [None, None])[v] = ids
        return found, candidates

    def _nll(self, v: int, prefix: str, ids: list[int]) -> float:
        key = (v, prefix, tuple(ids))
        self.calls["nll"] += 1
        if key not in self.scores:
            model, tok = self.pairs[v]
            self.scores[key] = self.m.compute_span_perplexity(model, tok, prefix, ids)
            self.calls["nll_run"] += 1
        return self.scores[key]

    def _scored_ids(self, scoring: str, v: int, prefix: str, span: str, own) -> list[int]:
        tok = self.pairs[v][1]
        if scoring == "fixed":
            return ids_after(tok, prefix, " " + span)
        return own if own is not None else tok(span, add_special_tokens=False)["input_ids"]

    def generate(self, prompt: str, tokens: int, against: list[tuple[list[str], bool]] = (),
                 scoring: str = "as_is") -> tuple[str, list[dict]]:
        """The official text and rounds; stops early once its words differ from every word list in
        ``against`` (ensbench's words, and whether its text ended by a stop): the verdict cannot
        change after that."""
        prefix, rounds = prompt, []
        lead_tok = self.pairs[0][1]
        while len(lead_tok(prefix[len(prompt):], add_special_tokens=False)["input_ids"]) < tokens:
            found, candidates = self._candidates(prefix)
            scored = []
            for span, own in candidates.items():
                nll = [self._nll(v, prefix, self._scored_ids(scoring, v, prefix, span, own[v]))
                       for v in range(len(self.pairs))]
                valid = [x for x in nll if x == x]  # the official skips a NaN score (an empty span)
                if valid:
                    scored.append((span, sum(valid) / len(valid), nll))
            if not scored:
                break
            span = min(scored, key=lambda s: s[1])[0]
            rounds.append({"at": len(prefix) - len(prompt), "selected": span,
                           "candidates": [(s, round(a, 4), [round(x, 4) for x in nll]) for s, a, nll in scored],
                           "per_model": [[s for s, _ in spans] for spans in found]})
            if self._stops(span):
                kept = self._kept(span)
                prefix += " " + kept if kept else ""
                break
            prefix += " " + span
            if any(tok.eos_token and tok.eos_token in span for _, tok in self.pairs):
                break
            if against and all(parting(theirs, ended, words(prefix[len(prompt):]), False) is not None
                               for theirs, ended in against):
                break
        return prefix[len(prompt):], rounds

    @staticmethod
    def _stops(span: str) -> bool:
        import re
        return bool(re.search(r"\\?boxed\s*\{", span, flags=re.IGNORECASE)) or "<" in span or any(
            marker in span.lower() for marker in ("question:", "note:"))

    def _kept(self, span: str) -> str:
        import re
        if re.search(r"\\?boxed\s*\{", span, flags=re.IGNORECASE):
            return self.m.extract_boxed_answer(span)
        return self.m.clean_text_before_question(span)


def trace_offsets(method) -> None:
    """Marks each traced ensbench round with ``at``, the committed text's length in bytes before it."""
    plain = method.choose

    def choose(dists, states):
        before = [(len(state.rounds), len(state.data)) for state in states]
        out = plain(dists, states)
        for state, (n, at) in zip(states, before):
            for round_ in state.rounds[n:]:
                round_["at"] = at
        return out

    method.choose = choose


SCORING = "scores (both sides had both words)"
CANDIDATES = "candidate set (one side never proposed the other's word)"
STOPPED = "the official stopped (a stop marker or its EOS text in its span) where ensbench went on"
WE_STOPPED = "ensbench stopped (its stop id won) where the official went on"
PLACEMENT = "exploration placement (Figure 1 vs the script: commit_rule code agrees)"
VARIANTS = ("as_is", "fixed")


def parting(ours: list[str], ours_ended: bool, theirs: list[str], theirs_ended: bool) -> int | None:
    """The index of the first word where two texts part (None: they agree). A text that ended (a
    stop, not the token budget) parts from a longer one at its end."""
    n = min(len(ours), len(theirs))
    first = next((i for i in range(n) if ours[i] != theirs[i]), None)
    if first is None and ((ours_ended and len(theirs) > n) or (theirs_ended and len(ours) > n)):
        return n
    return first


def parting_char(ours: list[str], theirs: list[str]) -> int:
    """Where the texts ``" ".join(words)`` first differ (or the shorter one ends)."""
    a, b = " ".join(ours), " ".join(theirs)
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def raw_offset(text: str, char: int) -> int:
    """The offset in ``text`` of character ``char`` of ``" ".join(text.split())`` (a collapsed space:
    the last whitespace before the word; past the end: the end)."""
    seen, started = 0, False
    for i, ch in enumerate(text):
        if ch.isspace():
            continue
        if started and i > 0 and text[i - 1].isspace():
            if seen == char:
                return i - 1
            seen += 1
        if seen == char:
            return i
        seen, started = seen + 1, True
    return len(text)


def their_round(rounds: list[dict], char: int) -> dict | None:
    """The official round that wrote character ``char`` of its space-joined text (its text is
    ``" " + span`` per round: offset ``char + 1``)."""
    found = None
    for round_ in rounds:
        if round_["at"] <= char + 1:
            found = round_
    return found


def our_round(text: str, rounds: list[dict], char: int) -> dict | None:
    """The traced ensbench round that wrote character ``char`` of ``text``'s space-joined words
    (past the end: the round that ended it); None: that round had one candidate, not scored."""
    at = len(text[:raw_offset(text, char)].encode("utf-8"))
    for round_ in reversed(rounds):
        if "at" in round_:
            winner = round_["candidates"][round_["winner"]].encode("utf-8")
            if round_["at"] <= at < round_["at"] + len(winner) or round_["at"] == at == len(text.encode("utf-8")):
                return round_
            if round_["at"] <= at:
                return round_ if round_["at"] + len(winner) == len(text.encode("utf-8")) == at else None
    return None


def margin(means: list[float]) -> float | None:
    ordered = sorted(means)
    return round(ordered[1] - ordered[0], 4) if len(ordered) > 1 else None


def divergence(first: int, ours_text: str, ours_rounds: list[dict], ours: list[str], theirs: list[dict],
               their_words: list[str]) -> dict:
    """Both sides' rounds at the first differing word (candidates, each model's score, the mean and
    the winner's margin) and the cause."""
    char = parting_char(ours, their_words)
    official = their_round(theirs, char)
    mine = our_round(ours_text, ours_rounds, char)
    record = {"word": first, "ours_word": ours[first] if first < len(ours) else None,
              "official_word": their_words[first] if first < len(their_words) else None}
    if first >= len(their_words):
        record["cause"] = STOPPED
    elif first >= len(ours):
        record["cause"] = WE_STOPPED
    else:
        both = (official is not None and mine is not None  # each side's winner among the other's candidates
                and mine["candidates"][mine["winner"]].strip() in {c[0].strip() for c in official["candidates"]}
                and official["selected"].strip() in {c.strip() for c in mine["candidates"]})
        record["cause"] = SCORING if both else CANDIDATES
    if official is not None:
        record["official"] = {"at": official.get("at"), "selected": official["selected"],
                              "candidates": official["candidates"],
                              "margin": margin([c[1] for c in official["candidates"]])}
    if mine is not None:
        means = [sum(row) / len(row) for row in mine["nll"]]
        record["ours"] = {"at": mine["at"], "winner": mine["candidates"][mine["winner"]],
                          "candidates": list(zip(mine["candidates"], mine["nll"], [round(m, 4) for m in means])),
                          "margin": margin(means)}
    return record


def joined_index(text: str, at: int) -> int:
    """The index in ``" ".join(text.split())`` where the text from byte ``at`` of ``text`` goes on."""
    head = text.encode("utf-8")[:at].decode("utf-8", errors="ignore")
    joined = " ".join(head.split())
    return len(joined) + 1 if joined and head[-1:].isspace() else len(joined)


def same_scores(ours_text: str, ours_rounds: list[dict], theirs: list[dict], before: int) -> list[float]:
    """For each candidate both sides scored at the same point before character ``before`` (same text
    up to the leading space), the largest difference between the two sides' per-model NLLs."""
    mine = {}
    for round_ in ours_rounds:
        if "at" in round_:
            at = joined_index(ours_text, round_["at"])
            for text, nll in zip(round_["candidates"], round_["nll"]):  # a leading space: the word starts after it
                mine.setdefault((at + (at > 0 and text[:1].isspace()), text.strip()), nll)
    gaps = []
    for round_ in theirs:
        if round_["at"] < before:
            for candidate in round_["candidates"]:
                key = (round_["at"], candidate[0].strip())
                if len(candidate) > 2 and key in mine:
                    gaps.append(max(abs(a - b) for a, b in zip(candidate[2], mine[key])))
    return gaps


def official_ended(rounds: list[dict]) -> bool:
    """Whether the official text ended by its own stop (a stop marker, or EOS text: both members'
    EOS strings hold "<"), not the token budget."""
    return not rounds or Official._stops(rounds[-1]["selected"])


def compared(ours: dict, count, tokens: int) -> tuple[list[str], bool]:
    """ensbench's words as compared (the last left out where the token budget may have cut it) and
    whether its text ended by a stop."""
    mine = words(ours["text"])
    if "budget" not in ours:
        ours["budget"] = count(ours["text"]) >= tokens
    return (mine[:-1] if ours["budget"] and len(mine) > 1 else mine), not ours["budget"]


def analyse(rows: list[dict], count, tokens: int = 20) -> dict:
    """Agreement of each commit rule with each official variant, and each divergence. ``count``:
    the lead member's token count of a text (ensbench stopped by its stop id under ``tokens``)."""
    tally: dict = {}
    for row in rows:
        for variant in VARIANTS:
            if variant not in row:
                continue
            their_words = words(row[variant]["text"])
            theirs_ended = official_ended(row[variant]["rounds"])
            for rule in ("paper", "code"):
                whole, ended = compared(row[rule], count, tokens)
                first = parting(whole, ended, their_words, theirs_ended)
                found = None if first is None else divergence(first, row[rule]["text"], row[rule]["rounds"], whole,
                                                              row[variant]["rounds"], their_words)
                before = parting_char(whole, their_words) if first is not None else len(row[variant]["text"])
                gaps = same_scores(row[rule]["text"], row[rule]["rounds"], row[variant]["rounds"], before)
                row.setdefault("verdicts", {})[f"{rule} vs {variant}"] = {
                    "agree": first is None, "divergence": found,
                    "same_candidates": len(gaps), "largest_nll_gap": max(gaps, default=None)}
            paper, code = (row["verdicts"][f"{rule} vs {variant}"] for rule in ("paper", "code"))
            if code["agree"] and not paper["agree"]:
                paper["divergence"]["cause"] = PLACEMENT
            for rule, verdict in (("paper", paper), ("code", code)):
                cause = "agree" if verdict["agree"] else verdict["divergence"]["cause"]
                tally.setdefault(f"{rule} vs {variant}", Counter())[cause] += 1
    return {key: dict(counts) for key, counts in tally.items()}


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
    parser.add_argument("--word-unit", choices=("boundaries", "whitespace"), default="boundaries",
                        help="ensbench's word_unit (whitespace: the script's whitespace words)")
    parser.add_argument("--out", default="adafuse_official.json")
    parser.add_argument("--reuse", metavar="JSONL", nargs="+", default=[],
                        help="earlier runs' lines: a prompt's official variants found there are not run again")
    parser.add_argument("--analyse", metavar="JSONL", nargs="+",
                        help="classify finished (or partial) runs' lines again (one row per prompt); no model runs")
    args = parser.parse_args()
    if args.analyse:
        from ensemble_bench.members.loading import load_tokenizer
        from ensemble_bench.members.sources import resolve

        lead = load_tokenizer(resolve("smollm2-135m"))
        report(merged(args.analyse), args.out, lambda text: len(lead(text, add_special_tokens=False)["input_ids"]),
               args.tokens)
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
    methods = {rule: AdaFuse(members, AdaFuseParams(theta_delta=args.theta, beam_size=args.beam, commit_rule=rule,
                                                     word_unit=args.word_unit))
               for rule in ("paper", "code")}
    for method in methods.values():
        trace_offsets(method)
    reference = Official(official, [(m.model, m.tokenizer) for m in members], args.theta, args.beam,
                         args.span_length)
    count = lambda text: len(members[0].tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    earlier = {row["prompt"]: row for row in merged(args.reuse)}
    rows = []
    with open(args.out + "l", "w") as log:  # one line per prompt as it finishes
        for i, (prompt, request) in enumerate(zip(prompts, requests)):
            if i < args.start:
                continue
            row, clock = {"prompt": prompt, "index": i}, time.perf_counter()
            for rule, method in methods.items():
                mine = method.generate([request])[0].text
                row[rule] = {"text": mine, "rounds": method.traces[-1]["rounds"]}
            row["seconds"] = {"ensbench": round(time.perf_counter() - clock, 1)}
            reference.new_prompt()
            for variant in VARIANTS:
                if variant in earlier.get(prompt, {}):
                    row[variant] = earlier[prompt][variant]
                    continue
                clock = time.perf_counter()
                text, rounds = reference.generate(prompt, args.tokens, [compared(row[r], count, args.tokens)
                                                                        for r in methods], variant)
                row[variant] = {"text": text, "rounds": rounds}
                row["seconds"][variant] = round(time.perf_counter() - clock, 1)
            row["official_calls"] = dict(reference.calls)
            reference.calls.clear()
            analyse([row], count, args.tokens)
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
            verdicts = " ".join(f"{key}={v['agree']}" for key, v in row["verdicts"].items())
            texts = " | ".join(f"{key} {row[key]['text']!r}" for key in ("paper", "code", *VARIANTS))
            print(f"p{i}: {verdicts} | {row['seconds']} | {texts}", flush=True)
    report(rows, args.out, count, args.tokens)


def merged(paths: list[str]) -> list[dict]:
    """The lines of several runs, one row per prompt (a later line's variants join an earlier one's)."""
    rows: dict[str, dict] = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if "official" in row:  # a line of the first runs: the as-is variant only, mean scores only
                    row["as_is"] = {"text": row.pop("official"), "rounds": row.pop("official_rounds")}
                for variant in VARIANTS:  # the first runs' rounds have no offsets: the text grows by " " + span
                    at = 0
                    for round_ in row.get(variant, {}).get("rounds", []):
                        at = round_.setdefault("at", at) + 1 + len(round_["selected"])
                rows.setdefault(row["prompt"], {}).update(row)
    return list(rows.values())


def report(rows: list[dict], out: str, count, tokens: int) -> None:
    tally = analyse(rows, count, tokens)
    Path(out).write_text(json.dumps({"rows": rows, "tally": tally}, indent=1))
    for key, counts in tally.items():
        print(f"ensbench {key}: {counts.get('agree', 0)}/{sum(counts.values())} agree; " +
              "; ".join(f"{n} {cause}" for cause, n in counts.items() if cause != "agree"))


if __name__ == "__main__":
    main()
