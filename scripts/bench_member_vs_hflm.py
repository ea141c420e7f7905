"""ms/token of each packaged model through our Member (method `single`) vs stock lm-eval HFLM.

Same model object, same prompt, batch size 1, greedy, warm-up first, then alternating repeats;
wall time over (prefill + decode) divided by the tokens generated. On these shared CPU machines
only the ratio measured in one run means anything.

    python scripts/bench_member_vs_hflm.py [--models smollm2-135m qwen2.5-0.5b gemma3-270m]
           [--tokens 64] [--repeats 3] [--threads 1] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROMPT = ("Once upon a time, in a small village by the sea, there lived an old fisherman named Tomas. "
          "Every morning he")


def time_generate(lm, request_cls, tokens: int) -> tuple[float, str]:
    request = request_cls(request_type="generate_until", doc={},
                          arguments=(PROMPT, {"until": [], "max_gen_toks": tokens}), idx=0)
    start = time.perf_counter()
    [text] = lm.generate_until([request])
    return time.perf_counter() - start, text


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-0.5b", "gemma3-270m"])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()

    import torch
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from ensemble_bench.members import load_member
    from ensemble_bench.methods.single import Single
    from ensemble_bench.run.lm import LM_CLASSES

    torch.set_num_threads(args.threads)
    rows = []
    for name in args.models:
        member = load_member(name, dtype=args.dtype, name=name)
        member.model.generation_config.eos_token_id = sorted(member.stop_ids)  # same stops for both
        ours = LM_CLASSES["single"](Single([member], Single.Params(), batch_size=1), name)
        hflm = HFLM(pretrained=member.model, tokenizer=member.tokenizer, batch_size=1)
        count = len(member.encode(time_generate(ours, Instance, args.tokens)[1], add_special_tokens=False))
        time_generate(hflm, Instance, args.tokens)  # warm-up
        ours_s, hflm_s, same = [], [], True
        for _ in range(args.repeats):
            seconds, text_ours = time_generate(ours, Instance, args.tokens)
            ours_s.append(seconds)
            seconds, text_hf = time_generate(hflm, Instance, args.tokens)
            hflm_s.append(seconds)
            same &= text_ours == text_hf
        steps = ours.method.timing.decode_steps
        row = {
            "model": name, "dtype": args.dtype, "threads": args.threads, "tokens": count,
            "member_ms_per_token": 1000 * statistics.median(ours_s) / count,
            "hflm_ms_per_token": 1000 * statistics.median(hflm_s) / count,
            "member_decode_only_ms_per_token": 1000 * ours.method.timing.decode_seconds / steps,
            "identical_text": same,
        }
        row["ratio_member_over_hflm"] = row["member_ms_per_token"] / row["hflm_ms_per_token"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        del ours, hflm, member
    print("| model | tokens | Member ms/token | HFLM ms/token | ratio | identical |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['tokens']} | {r['member_ms_per_token']:.1f} | {r['hflm_ms_per_token']:.1f} | "
              f"{r['ratio_member_over_hflm']:.2f} | {r['identical_text']} |")


if __name__ == "__main__":
    main()
