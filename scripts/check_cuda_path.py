"""Every method on CUDA members gives what it gives on CPU members (run on a GPU machine).

The test suite's tiny random models (tests/tiny.py: byte-level BPE and SentencePiece tokenizers
trained on the fly, 2-layer Llamas with peaked heads) are built once and copied to both devices;
each method generates the suite's five requests and scores two continuations on each. Prints one
line per method and exits 1 when a CUDA output differs from the CPU one. Also checks that the
members' log-probs stay on the GPU.

    python scripts/check_cuda_path.py [--device cuda]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def methods():
    from ensemble_bench.methods.coolfusion import CoolFusion, CoolFusionParams
    from ensemble_bench.methods.deepen import Deepen, DeepenParams
    from ensemble_bench.methods.gac import Gac, GacParams
    from ensemble_bench.methods.single import Single
    from ensemble_bench.methods.sweetspan import SweetSpan
    from ensemble_bench.methods.sweetspan_params import SweetSpanParams
    from ensemble_bench.methods.unite import Unite, UniteParams

    return {
        "single": lambda m: Single(m[:1], Single.Params(), batch_size=3),
        "gac": lambda m: Gac(m, GacParams(), batch_size=3),
        "gac-gated": lambda m: Gac(m, GacParams(gate=0, threshold=0.5), batch_size=3),
        "unite": lambda m: Unite(m, UniteParams(primary=1), batch_size=3),
        "deepen": lambda m: Deepen(m, DeepenParams(main=1), batch_size=3),
        "coolfusion": lambda m: CoolFusion(m, CoolFusionParams(), batch_size=3),
        "sweetspan": lambda m: SweetSpan(m, SweetSpanParams(span_words=2), batch_size=3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    from ensemble_bench.members import LocalMember, Prompt
    from ensemble_bench.methods import LoglikelihoodRequest
    from tests.tiny import REQUESTS, byte_bpe_tokenizer, sentencepiece_tokenizer, tiny_llama

    tokenizers = [byte_bpe_tokenizer(), sentencepiece_tokenizer()]
    models = [tiny_llama(len(t), seed=k + 1) for k, t in enumerate(tokenizers)]

    def members(device):
        return [LocalMember(copy.deepcopy(m).to(device), t, f"m{k}")
                for k, (m, t) in enumerate(zip(models, tokenizers))]

    on_device = members(args.device)
    placed = on_device[0].prefill([on_device[0].encode("Question:")]).device
    print(f"member log-probs live on: {placed}")
    scoring = [LoglikelihoodRequest(Prompt(text=r.prompt.text), " the answer") for r in REQUESTS[:2]]
    differ = 0
    for name, make in methods().items():
        cpu, gpu = make(members("cpu")), make(on_device)
        texts = [[g.text for g in method.generate(REQUESTS)] for method in (cpu, gpu)]
        scores = [[round(s.logprob, 3) for s in method.loglikelihood(scoring)] for method in (cpu, gpu)]
        same = texts[0] == texts[1]
        differ += not same
        print(f"{name}: generations {'identical' if same else 'DIFFER'} "
              f"({sum(a == b for a, b in zip(*texts))}/{len(REQUESTS)}); scores cpu {scores[0]} cuda {scores[1]}")
    ok = differ == 0 and str(placed).startswith(args.device.split(":")[0])
    print("CUDA path: " + ("same outputs as CPU" if ok else f"{differ} method(s) differ"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
