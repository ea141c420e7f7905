"""PackLLM (alignment mined) beside the authors' code, cmavro/PackLLM (docs/fidelity.md#packllm).

The official ``downstream_tasks/modeling_llm_fusion.py`` is read at run time from a clone or a git copy
of the repository (``--repo``; never committed here) and imported with the packaged SmolLM2-135M and
Qwen2.5-0.5B as its experts (the same weights ensbench loads). Per prompt, 40 fixed plain-text prompts:

1. Its ``select_tokenizer`` picks the reference (top-1) expert, its ``forward`` on the reference's tokens
   of the prompt gives lambda (``fusion`` sim or opt: its own perplexities, grid search and printed
   lambdas, parsed from its output).
2. Greedy decoding, ``--tokens`` new tokens: every step calls its ``forward`` on the reference's ids so
   far plus one placeholder id, with the prompt's lambda held fixed (its ``cbtm`` branch, whose cluster
   weights are replaced by lambda: the same weighted logit sum as its sim branch), and takes the argmax
   of the last position (its forward drops the last position's logits; the placeholder makes the last
   kept position the next-token prediction). Other experts read the MinED images of the reference's ids.

Its ``align_tokenizers`` is not run: its map is built with pure-Python edit distances from every
reference token to every member token (151k x 49k here), which does not finish on a small CPU. The map
given to its ``forward`` is ensbench's MinED map (vocab/mined.py: exact text, else the least edit distance;
ties to the lowest id where the official code takes the first in dictionary order).

ensbench runs ``packllm`` with ``alignment: mined`` and the same variant; ``--conventions official`` (the
default) adds the official code's prompt reading (``score_from: second_token``: no prefix token;
``ppl_reading: expert_tokens``: every member's perplexity on the reference's tokens), ``ensbench`` keeps
ensbench's defaults. Each prompt is also decoded by the official code with ensbench's lambda, which
separates the weights from the decoding. Usage:

    python scripts/compare_packllm_official.py --repo PATH_TO_PackLLM [--variant sim|opt]
        [--conventions official|ensbench] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import types
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

OFFICIAL_FILE = "downstream_tasks/modeling_llm_fusion.py"
from fidelity_prompts import SUMS, TOPICS  # noqa: E402  (scripts/, on the path when run)

QUESTIONS = ([f"Question: Tell me one fact about {t}.\nAnswer:" for t in TOPICS]
             + [f"Question: What is {a} plus {b}?\nAnswer:" for a, b in SUMS])


def import_official(repo: str, into: Path):
    """The official fusion module from ``repo`` (a checkout or a git copy), with its two site-specific
    imports stood in: ``utils.TOKENIZER_MAPS`` (hub names; unused here) and ``editdistance`` when absent
    (only its ``align_tokenizers`` uses it, which is not run)."""
    source = Path(repo) / OFFICIAL_FILE
    text = source.read_text() if source.is_file() else subprocess.run(
        ["git", "-C", repo, "show", f"HEAD:{OFFICIAL_FILE}"], check=True, capture_output=True, text=True).stdout
    (into / "modeling_llm_fusion.py").write_text(text)
    sys.modules.setdefault("utils", types.SimpleNamespace(TOKENIZER_MAPS={}))
    try:
        import editdistance  # noqa: F401
    except ImportError:
        sys.modules["editdistance"] = types.ModuleType("editdistance")
    sys.path.insert(0, str(into))
    import modeling_llm_fusion

    return modeling_llm_fusion


class Official:
    """The official PackLLM module around the two experts, its tokenizer alignment filled in by hand."""

    def __init__(self, module, members, fusion: str, maps):
        import torch

        model = object.__new__(module.PackLLM)
        torch.nn.Module.__init__(model)
        model.models = [m.model for m in members]
        model.fusion = fusion
        model.tokenizers = {m.name: m.tokenizer for m in members}
        model.tokenizers_l = [m.tokenizer for m in members]
        model.accelerator = types.SimpleNamespace(device=torch.device("cpu"))
        model.all_lams = []
        model.tokenizer_list = {m.name: [o.tokenizer for o in members] for m in members}
        model.vocab_mappings_base = {m.name: [maps[r][k] for k in range(len(members))]
                                     for r, m in enumerate(members)}
        self.model, self.members = model, members

    def reference(self, text: str) -> int:
        return self.model.select_tokenizer([text])

    def weights(self, reference: int, ids: list[int], fusion: str) -> list[float]:
        """lambda per member from one forward on the prompt, as the official code prints it."""
        self._use(reference, fusion)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            self._forward(ids)
        lists = {name: json.loads(value) for name, value in
                 re.findall(r"^(sorted experts|test lambdas sorted|test lambdas unsorted):\s+(\[.*\])$",
                            printed.getvalue(), re.M)}
        if fusion == "sim":
            return lists["test lambdas unsorted"]
        weights = [0.0] * len(self.members)
        for k, w in zip(lists["sorted experts"], lists["test lambdas sorted"]):
            weights[k] = w
        return weights

    def generate(self, reference: int, ids: list[int], weights: list[float], tokens: int) -> list[int]:
        self._use(reference, "cbtm")
        self.model._get_context_clusters_seq = lambda *_: weights
        stops = self.members[reference].stop_ids
        new: list[int] = []
        for _ in range(tokens):
            with contextlib.redirect_stdout(io.StringIO()):
                logits = self._forward(ids + new + [0])
            token = int(logits[0, -1].argmax())
            if token in stops:
                break
            new.append(token)
        return new

    def _use(self, reference: int, fusion: str) -> None:
        self.model.fusion = fusion
        self.model.current_tokenizer = self.members[reference].name

    def _forward(self, ids: list[int]):
        import torch

        with torch.no_grad():
            ids_t = torch.tensor([ids])
            return self.model.forward(input_ids=ids_t, attention_mask=torch.ones_like(ids_t), return_dict=True).logits


def mined_maps(members) -> list[list[dict[int, int]]]:
    """[reference][member]: reference id -> member id, in reference id order (identity for itself)."""
    from ensemble_bench.cache import cache_dir
    from ensemble_bench.vocab.mined import cached_mined_map

    maps = []
    for ref in members:
        size = len(ref.tokenizer)
        row = []
        for m in members:
            if m is ref:
                row.append({i: i for i in range(size)})
                continue
            mapped = cached_mined_map(ref.vocab, sorted(ref.stop_ids), m.vocab, sorted(m.stop_ids),
                                      cache_dir() / "mined").tolist()
            row.append({i: (mapped[i] if i < len(mapped) and mapped[i] >= 0 else 0) for i in range(size)})
        maps.append(row)
    return maps


def verdict(theirs: str, ours: str) -> str:
    if theirs == ours:
        return "equal"
    return "prefix" if ours.startswith(theirs) or theirs.startswith(ours) else "differ"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True, help="a clone (or git copy) of cmavro/PackLLM")
    parser.add_argument("--variant", choices=["sim", "opt"], default="sim")
    parser.add_argument("--conventions", choices=["official", "ensbench"], default="official")
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import torch

    from ensemble_bench.members import Prompt, load_member
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.packllm import PackLLM, PackLLMParams

    torch.set_num_threads(args.threads)
    module = import_official(args.repo, Path(tempfile.mkdtemp(prefix="packllm-official-")))
    members = [load_member("smollm2-135m", name="smollm2"), load_member("qwen2.5-0.5b", name="qwen2.5")]
    official = Official(module, members, args.variant, mined_maps(members))
    texts = QUESTIONS[:args.prompts]
    conventions = {"score_from": "second_token", "ppl_reading": "expert_tokens"} if args.conventions == "official" \
        else {}
    method = PackLLM(members, PackLLMParams(variant=args.variant, alignment="mined", **conventions))
    ours = [g.text for g in method.generate([GenerationRequest(Prompt(text=t), (), args.tokens) for t in texts])]
    ours_weights = method.info()["packllm_prompt_weights"]
    rows = []
    for k, (text, mine, our_weights) in enumerate(zip(texts, ours, ours_weights)):
        reference = official.reference(text)
        ids = members[reference].encode(text)
        weights = official.weights(reference, ids, args.variant)
        def spelled(ids: list[int], pieces=members[reference].vocab.pieces) -> str:
            return b"".join(pieces[t] or b"" for t in ids).decode("utf-8", errors="replace")

        generated = official.generate(reference, ids, weights, args.tokens)
        with_ours = official.generate(reference, ids, list(our_weights), args.tokens)
        rows.append({"prompt": k, "verdict": verdict(spelled(generated), mine), "official_reference": reference,
                     "official_weights": [round(w, 4) for w in weights],
                     "ours_weights": [round(w, 4) for w in our_weights],
                     "weights_agree": max(abs(a - b) for a, b in zip(weights, our_weights)) < 1e-3,
                     "official": spelled(generated), "official_ids": generated, "ours": mine,
                     "official_with_our_weights": spelled(with_ours),
                     "verdict_with_our_weights": verdict(spelled(with_ours), mine)})
        print(json.dumps(rows[-1], ensure_ascii=False), flush=True)
    counts = Counter(r["verdict"] for r in rows)
    given = Counter(r["verdict_with_our_weights"] for r in rows)
    same_weights = sum(r["weights_agree"] for r in rows)
    print(f"{args.variant}: {counts.get('equal', 0)}/{len(rows)} equal, {counts.get('prefix', 0)} prefix, "
          f"{counts.get('differ', 0)} differ; weights within 1e-3: {same_weights}/{len(rows)}; "
          f"the official decoding given ensbench's weights: {given.get('equal', 0)}/{len(rows)} equal, "
          f"{given.get('prefix', 0)} prefix, {given.get('differ', 0)} differ")
    if args.out:
        Path(args.out).write_text(json.dumps({"variant": args.variant, "conventions": args.conventions,
                                              "counts": dict(counts),
                                              "counts_given_our_weights": dict(given),
                                              "weights_agree": same_weights, "rows": rows}, indent=1,
                                             ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
