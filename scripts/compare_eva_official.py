"""EVA against the authors' code (xydaytoy/EVA) on the packaged Qwen2.5-0.5B (main) + SmolLM2-135M
(auxiliary) pair: 40 NQ prompts, greedy, 20 new tokens, CPU, float32.

The reference is read at run time from a git snapshot (default /work/.mirror/xydaytoy+EVA/repo; get
one with ``git clone https://github.com/xydaytoy/EVA``) into a temporary folder, never copied here.
What runs of it, and how:

- the seed dictionary: identity.py's rule (shared ``get_vocab()`` strings), re-stated here, as the
  script itself only writes files under /data; output embeddings = the ``lm_head`` rows (hidden.py);
- the mapping: vecmap/map_embeddings.py's ``main()`` with ``--supervised``, its embeddings handed in
  and out through its own ``embeddings.read`` / ``write`` (patched: no text files of 150k x 896 floats).
  One adaptation: its orthogonal step's SVD is made thin, as the two models' widths differ (896 vs
  576) and the full SVD cannot re-weight them; for equal widths the two are the same;
- the similarity matrix: vecmap/eval_translation_scipy_matrix.py's ``main()`` (``--retrieval csls
  --neighborhood 1``, numpy path: arrays answer its CuPy ``.get()``; ``save_npz`` captured);
- decoding: ensemble/eva_multi.py's own ``eval_local`` (``drop`` filter, n=5, top-k 320), on CPU,
  with a plain prompt schema for both models (it imports ``save_dirs`` and ``get_dev_df`` from a
  task_info.py that defines neither; both are unused for NQ and given as None).

Ours: ``Eva`` with the same settings (overlap learned, canonical feeding). Each prompt is reported
equal, a prefix (one side stopped), or divergent; at a divergence both sides' fused distributions
are recomputed on the shared text with each side's map, to tell a map difference from a float
near-tie (its margin) or a feeding difference.

    python scripts/compare_eva_official.py [--prompts 40] [--tokens 20] [--reference DIR] [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np  # noqa: E402
import scipy.sparse  # noqa: E402
import torch  # noqa: E402

MIRROR = Path("/work/.mirror/xydaytoy+EVA/repo")
FILES = ["ensemble/eva_multi.py", "model_info.py", "task_info.py", "vecmap/map_embeddings.py",
         "vecmap/eval_translation_scipy_matrix.py", "vecmap/embeddings.py", "vecmap/cupy_utils.py"]
MAIN, AUX = "qwen", "smol"
INSTRUCTION = "Please answer the following question, your answer should be as simple as possible.\n"


def extract_reference(repo: Path, folder: Path) -> None:
    if not repo.exists():
        sys.exit(f"no snapshot of xydaytoy/EVA at {repo}: "
                 "git clone https://github.com/xydaytoy/EVA and pass --reference")
    for name in FILES:
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(subprocess.run(["git", "-C", str(repo), "show", f"HEAD:{name}"], check=True,
                                          capture_output=True).stdout)


class CupyLike(np.ndarray):
    """A numpy array that answers CuPy's ``.get()`` (the retrieval script calls it)."""

    def get(self):
        return np.asarray(self)


@contextlib.contextmanager
def patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def run_main(module, argv):
    with patched(sys, "argv", argv):
        module.main()


def official_matrix(folder: Path, aux_tok, main_tok, x: np.ndarray, z: np.ndarray):
    """Their seed dictionary, mapping and CSLS matrix [V_aux, V_main] (scipy CSR)."""
    sys.path[:0] = [str(folder / "vecmap"), str(folder)]
    embeddings = importlib.import_module("embeddings")
    mapper = importlib.import_module("map_embeddings")
    retrieval = importlib.import_module("eval_translation_scipy_matrix")
    aux_vocab, main_vocab = aux_tok.get_vocab(), main_tok.get_vocab()
    dictionary = folder / "aux-main.dict"
    dictionary.write_text("".join(f"{aux_vocab[t]} {main_vocab[t]}\n" for t in set(aux_vocab) & set(main_vocab)))
    test = folder / "aux-main-test.dict"
    test.write_text("".join(f"{i} 0\n" for i in range(x.shape[0])))
    arrays = {"aux.emb": x, "main.emb": z}
    for name in arrays:
        (folder / name).touch()  # the scripts open their input files; ``read`` answers from ``arrays``
    written = {}

    def read(file, dtype="float", **_):
        matrix = np.array(arrays[Path(file.name).name], dtype=dtype)
        return [str(i) for i in range(matrix.shape[0])], matrix.view(CupyLike)

    def write(words, matrix, file):
        written[Path(file.name).name] = np.asarray(matrix)

    real_svd = np.linalg.svd
    with patched(embeddings, "read", read), patched(embeddings, "write", write), \
            patched(np.linalg, "svd", lambda m, full_matrices=True, **kw: real_svd(m, full_matrices=False, **kw)):
        run_main(mapper, ["map", "--supervised", str(dictionary), *(str(folder / n) for n in
                          ("aux.emb", "main.emb", "aux.mapped", "main.mapped"))])
    arrays.update({"aux.mapped": written["aux.mapped"], "main.mapped": written["main.mapped"]})
    saved = {}
    with patched(embeddings, "read", read), patched(scipy.sparse, "save_npz", lambda path, m: saved.update(m=m)):
        run_main(retrieval, ["eval", str(folder / "aux.mapped"), str(folder / "main.mapped"), "-d", str(test),
                             "--retrieval", "csls", "--neighborhood", "1", "--precision", "fp32"])
    return saved["m"].tocsr(), len(set(aux_vocab) & set(main_vocab))


class SlowStyle:
    """A fast tokenizer that takes one token string in ``convert_tokens_to_string``, as the slow
    tokenizers the authors load (``use_fast=False``) do; the packaged models have fast ones only."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)

    def convert_tokens_to_string(self, tokens):
        return self._tokenizer.convert_tokens_to_string([tokens] if isinstance(tokens, str) else tokens)


def official_decoder(folder: Path, main, aux, matrix, tokens: int):
    """Their ``eval_local`` on CPU, one question at a time (it returns the text of its last input:
    ``tokens`` tokens)."""
    sys.path[:0] = [str(folder / "ensemble"), str(folder)]
    model_info = importlib.import_module("model_info")
    schema = {"instruction_prefix": "", "instruction_suffix": "", "input_prefix": "", "input_suffix": "\n"}
    model_info.prompt_schemas.update({MAIN: schema, AUX: schema})
    task_info = importlib.import_module("task_info")
    for missing in ("save_dirs", "get_dev_df"):  # eva_multi imports names its task_info.py lacks (unused for nq)
        setattr(task_info, missing, getattr(task_info, missing, None))
    eva = importlib.import_module("eva_multi")
    eva.device0 = eva.device1 = "cpu"
    sparse = torch.sparse_coo_tensor(np.array(matrix.nonzero()), matrix.data, matrix.shape).t().to(torch.float32)
    args = SimpleNamespace(task="nq", model=MAIN, aux_models=[AUX], aux_method="drop", drop=5, topk=320,
                           MAX_NEW_TOKEN=tokens)
    main.model.generation_config.eos_token_id = main.tokenizer.eos_token_id
    return lambda question: eva.eval_local(args, main.model, [aux.model], [], SlowStyle(main.tokenizer),
                                           [aux.tokenizer], [sparse], [{"qText": question}])[0]["pred_all"]


def prompt_text(question: str) -> str:
    return INSTRUCTION + "Question: " + question + "\n" + "Answer:"


def ours_decoder(members, tokens: int):
    """``Eva`` with the same settings (its map built, or read from the cache, here), one question at a time."""
    from ensemble_bench.members import Prompt
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.eva import Eva, EvaParams
    method = Eva(members, EvaParams(lead=0))

    def decode(question: str) -> str:
        return method.generate([GenerationRequest(Prompt(text=prompt_text(question)), (), tokens)])[0].text

    return decode, method


def map_agreement(ours, matrix) -> dict:
    """Row by row: the same lead targets, and the largest weight difference where they are."""
    theirs = matrix.tocsr()
    mine: dict[int, dict[int, float]] = {}
    for a, b, w in zip(ours.src.tolist(), ours.dst.tolist(), ours.weight.tolist()):
        mine.setdefault(a, {})[b] = w
    same, differ, worst = 0, 0, 0.0
    for row in range(theirs.shape[0]):
        start, end = theirs.indptr[row], theirs.indptr[row + 1]
        other = dict(zip(theirs.indices[start:end].tolist(), theirs.data[start:end].tolist()))
        if set(other) == set(mine.get(row, {})):
            same += 1
            worst = max([worst, *(abs(other[j] - mine[row][j]) for j in other)])
        else:
            differ += 1
    return {"rows_same_targets": same, "rows_other_targets": differ, "max_weight_diff_same_rows": worst}


def fused_at(members, text: str, projector, n: int = 5, k: int = 320) -> torch.Tensor:
    """EVA's fused vector [V_main] after ``text`` (each member encodes the text itself, as their loop does)."""
    from ensemble_bench.methods.eva import faithful, top_k_probs
    dists = []
    for index, member in enumerate(members):
        ids = torch.tensor([member.tokenizer(text).input_ids])
        with torch.no_grad():
            logits = member.model(input_ids=ids).logits[:, -1, :].float()
        probs = top_k_probs(torch.log_softmax(logits, dim=-1), k)
        dists.append(probs if index == 0 else projector(probs))
    order = [1, 0]
    kept = faithful(dists, n)
    if not kept.any():
        kept[:] = True
    share = 1.0 / kept.sum(dim=0).float()
    return sum(torch.where(kept[i, :, None], share[:, None] * dists[i], 0.0) for i in order)[0]


def explain(members, ours_map, matrix, prompt: str, ours: str, theirs: str) -> dict:
    """Where the official loop decided differently: the first differing character may lie inside a
    token one side chose (Qwen2.5's '"\\n' against '"' then ' by'), so the decision point is the
    latest text, at most 16 characters back, at which the official rule's choice spans the
    difference. There: each map's choice, runner-up and top-2 margin on the same (re-tokenised) text."""
    cut = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    tokenizer = members[0].tokenizer
    theirs_t = torch.sparse_coo_tensor(np.array(matrix.nonzero()), matrix.data, matrix.shape).t().float()
    maps = {"our_map": ours_map.project, "their_map": lambda p: torch.spmm(theirs_t, p.t()).t()}

    def choice_at(point: int, name: str) -> dict:
        top = fused_at(members, prompt + theirs[:point], maps[name]).topk(2)
        return {"choice": tokenizer.decode([int(top.indices[0])]), "second": tokenizer.decode([int(top.indices[1])]),
                "margin": float(top.values[0] - top.values[1])}

    for point in range(cut, max(-1, cut - 17), -1):
        official = choice_at(point, "their_map")
        if theirs[point:].startswith(official["choice"]) and point + len(official["choice"]) > cut:
            return {"at_char": point, "shared_tail": theirs[max(0, point - 20):point], "their_map": official,
                    "our_map": choice_at(point, "our_map")}
    return {"at_char": cut, "shared_tail": theirs[max(0, cut - 20):cut], "decision_point": "not found"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--reference", type=Path, default=MIRROR)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="write the per-prompt record here (JSON)")
    parser.add_argument("--official-map", type=Path, default=None, help="keep the official matrix here (.npz) "
                        "and read it back on the next run")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from ensemble_bench.members import load_member
    from ensemble_bench.tasks.data_store import nq_questions
    questions = [q[len("Q: "):-len("?\nA:")] + "?" for q in nq_questions(args.prompts)]
    members = [load_member("qwen2.5-0.5b", chat_template=False, name="qwen2.5"),
               load_member("smollm2-135m", chat_template=False, name="smollm2")]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        extract_reference(args.reference, folder)
        started = time.perf_counter()
        x = members[1].model.get_output_embeddings().weight.detach().float().numpy()
        z = members[0].model.get_output_embeddings().weight.detach().float().numpy()
        if args.official_map and args.official_map.exists():  # a matrix this script computed before
            saved = np.load(args.official_map)
            matrix, seeds = scipy.sparse.csr_matrix((saved["data"], saved["indices"], saved["indptr"]),
                                                    shape=tuple(saved["shape"])), int(saved["seeds"])
        else:
            matrix, seeds = official_matrix(folder, members[1].tokenizer, members[0].tokenizer, x, z)
            if args.official_map:
                np.savez(args.official_map, data=matrix.data, indices=matrix.indices, indptr=matrix.indptr,
                         shape=np.array(matrix.shape), seeds=seeds)
        print(f"official map: {matrix.nnz} pairs from {seeds} shared strings, {time.perf_counter() - started:.0f} s",
              flush=True)
        started = time.perf_counter()
        ours, method = ours_decoder(members, args.tokens)
        agreement = map_agreement(method.projections[1], matrix)
        print(f"our map: {len(method.projections[1].src)} pairs from {method.projections[1].seeds} shared tokens, "
              f"{time.perf_counter() - started:.0f} s; map agreement: {json.dumps(agreement)}", flush=True)
        theirs = official_decoder(folder, members[0], members[1], matrix, args.tokens)
        records, counts = [], {"equal": 0, "prefix": 0, "diverge": 0}
        for index, question in enumerate(questions):
            mine, other = ours(question), theirs(question)
            a, b = mine.strip(), other.strip()
            kind = "equal" if a == b else "prefix" if (a and b.startswith(a)) or (b and a.startswith(b)) else "diverge"
            counts[kind] += 1
            record = {"prompt": index, "kind": kind, "ours": mine, "official": other}
            if kind == "diverge":
                record["why"] = explain(members, method.projections[1], matrix, prompt_text(question), mine, other)
            records.append(record)
            print(json.dumps(record, ensure_ascii=False), flush=True)
            if args.out:  # written after every prompt: a long run can be read while it goes on
                args.out.write_text(json.dumps({"counts": counts, "map": agreement, "records": records}, indent=1,
                                               ensure_ascii=False))
    print(f"agreement: {counts['equal']}/{len(questions)} equal, {counts['prefix']} prefix, "
          f"{counts['diverge']} diverge")


if __name__ == "__main__":
    main()
