"""Tokens manipulated per step (UniTE Table 5) for GaC, DeePEn and UniTE on real vocabularies.

GaC projects every member's distribution onto the union vocabulary (its size is the tokens it
touches per step); DeePEn works in the relative space over the anchors (the common tokens); UniTE
aligns the union of the members' top-k. The first two depend on the vocabularies alone and are
computed here from the real tokenizers (offline vocabulary files, see members/vocab_files.py).
UniTE's count depends on the models' distributions: it is measured on the packaged models by
generating from real prompts (``--prompts`` NQ questions), and for vocabulary-only pairs the
bound 2k (k from every member, no overlap) is given instead.

    python scripts/tokens_manipulated.py [--prompts 16] [--tokens 24] [--k 10]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

from ensemble_bench.vocab import build_vocab_view  # noqa: E402
from ensemble_bench.vocab.relative import anchor_ids  # noqa: E402
from ensemble_bench.vocab.union import build_union  # noqa: E402

VOCAB_PAIRS = [("llama2", "phi3"), ("llama2", "deepseek-llm"), ("llama3", "qwen2"), ("qwen2", "deepseek-llm")]
MODEL_PAIRS = [("smollm2-135m", "qwen2.5-0.5b"), ("smollm2-135m", "gemma3-270m")]


def vocab_counts(views, stops) -> tuple[int, int]:
    union = build_union(views, stops)
    return union.size, len(anchor_ids(views)[0])


def stop_ids_of_tokenizer(tokenizer, view) -> list[int]:
    from ensemble_bench.members.local import END_MARKERS

    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    ids |= {i for i in view.special_ids if (view.pieces[i] or b"").decode("utf-8", "replace") in END_MARKERS}
    return sorted(ids)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from ensemble_bench.members import Prompt, load_member
    from ensemble_bench.members.vocab_files import load_vocab_tokenizer
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.unite import Unite, UniteParams
    from ensemble_bench.tasks.offline import nq_questions

    print("| members | vocabularies | GaC (union) | DeePEn (anchors) | UniTE (top-k union) |")
    print("|---|---|---|---|---|")
    for names in VOCAB_PAIRS:
        tokenizers = [load_vocab_tokenizer(n) for n in names]
        views = [build_vocab_view(t, len(t)) for t in tokenizers]
        stops = [stop_ids_of_tokenizer(t, v) for t, v in zip(tokenizers, views)]
        union, anchors = vocab_counts(views, stops)
        sizes = " + ".join(str(len(t)) for t in tokenizers)
        print(f"| {' + '.join(names)} (tokenizers only) | {sizes} | {union} | {anchors} "
              f"| <= {2 * args.k} (needs the models) |")
    prompts = nq_questions(args.prompts)
    requests = [GenerationRequest(Prompt(text=p), ("\n",), args.tokens) for p in prompts]
    for names in MODEL_PAIRS:
        members = [load_member(n) for n in names]
        union, anchors = vocab_counts([m.vocab for m in members], [sorted(m.stop_ids) for m in members])
        method = Unite(members, UniteParams(k=args.k, primary=1), batch_size=8)
        start = time.perf_counter()
        method.generate(requests)
        measured = method.info()["tokens_manipulated_per_step"]
        sizes = " + ".join(str(m.vocab.size) for m in members)
        print(f"| {' + '.join(names)} | {sizes} | {union} | {anchors} | {measured:.2f} "
              f"(measured, {method.stats.union_rows} steps, {time.perf_counter() - start:.0f} s) |")


if __name__ == "__main__":
    main()
