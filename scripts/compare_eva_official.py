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
equal, a prefix (one side stopped), or divergent. Both loops are traced (per step: the fused top two
and each model's input ids); at the first step where they chose differently the step is recomputed
without a cache with each map on each side's input, and with our map given the code's rows of one
class at a time (``MapPair``: ids 0-2, other special tokens, the rest), which names the rule that
decides (``cause``) with each side's top-2 margin.

    python scripts/compare_eva_official.py [--prompts 40] [--tokens 20] [--reference DIR] [--threads 1]
        [--official-map FILE.npz] [--out FILE.json [--resume]] [--start N | --only 1,12-39]
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


class Recording:
    """A tokenizer that keeps the ids of every text it encodes (the official loop's input at each step)."""

    def __init__(self, tokenizer, seen: list):
        self._tokenizer, self._seen = tokenizer, seen

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def __call__(self, *args, **kwargs):
        encoded = self._tokenizer(*args, **kwargs)
        self._seen.append([int(i) for i in encoded.input_ids[0]])
        return encoded


class SlowStyle(Recording):
    """A fast tokenizer that takes one token string in ``convert_tokens_to_string``, as the slow
    tokenizers the authors load (``use_fast=False``) do; the packaged models have fast ones only."""

    def convert_tokens_to_string(self, tokens):
        return self._tokenizer.convert_tokens_to_string([tokens] if isinstance(tokens, str) else tokens)


class ArgmaxTap:
    """Their module's ``torch``, whose ``argmax`` keeps the top two of the fused vector at each step
    (the filter's own argmax calls, inside ``drop``, are not kept)."""

    def __init__(self, steps: list):
        self.steps, self.in_filter = steps, False

    def __getattr__(self, name):
        return getattr(torch, name)

    def argmax(self, values, *args, **kwargs):
        if not self.in_filter:
            self.steps.append(top_two(values[0]))
        return torch.argmax(values, *args, **kwargs)


def top_two(vector: torch.Tensor) -> tuple[list[int], list[float]]:
    top = vector.float().topk(2)
    return top.indices.tolist(), top.values.tolist()


def official_decoder(folder: Path, main, aux, matrix, tokens: int):
    """Their ``eval_local`` on CPU, one question at a time: (the text of its last input, ``tokens``
    tokens; its trace: per step the fused top two and each model's input ids)."""
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
    their_filter = eva.drop

    def decode(question: str):
        trace = {"top": [], "ids": [[], []]}
        tap = ArgmaxTap(trace["top"])

        def in_filter(*a, **kw):
            tap.in_filter = True
            try:
                return their_filter(*a, **kw)
            finally:
                tap.in_filter = False

        with patched(eva, "torch", tap), patched(eva, "drop", in_filter):
            text = eva.eval_local(args, main.model, [aux.model], [], SlowStyle(main.tokenizer, trace["ids"][0]),
                                  [Recording(aux.tokenizer, trace["ids"][1])], [sparse],
                                  [{"qText": question}])[0]["pred_all"]
        return text, trace

    return decode


def prompt_text(question: str) -> str:
    return INSTRUCTION + "Question: " + question + "\n" + "Answer:"


def ours_decoder(members, tokens: int):
    """``Eva`` with the same settings (its map built, or read from the cache, here), one question at a
    time: (its text; its trace: per step the fused top two and each member's ids)."""
    from ensemble_bench.members import Prompt
    from ensemble_bench.methods import GenerationRequest
    from ensemble_bench.methods.eva import Eva, EvaParams
    method = Eva(members, EvaParams(lead=0))
    own_fuse = method.fuse

    def decode(question: str):
        trace = {"top": [], "ids": [[], []]}

        def fuse(projected):
            fused = own_fuse(projected)
            trace["top"].append(top_two(fused[0]))
            for index, member in enumerate(members):
                trace["ids"][index].append(member.row_ids()[0])
            return fused

        with patched(method, "fuse", fuse):
            text = method.generate([GenerationRequest(Prompt(text=prompt_text(question)), (), tokens)])[0].text
        return text, trace

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


def member_probs(members, feeding: list[list[int]], k: int = 320) -> list[torch.Tensor]:
    """Each member's top-k probabilities after its ids (a full forward, no cache)."""
    from ensemble_bench.methods.eva import top_k_probs
    out = []
    for member, ids in zip(members, feeding):
        with torch.no_grad():
            logits = member.model(input_ids=torch.tensor([ids])).logits[:, -1, :].float()
        out.append(top_k_probs(torch.log_softmax(logits, dim=-1), k))
    return out


def fused_with(probs: list[torch.Tensor], projector, n: int = 5) -> tuple[torch.Tensor, list[bool], int]:
    """EVA's fused vector [V_main] from the main model's and the projected auxiliary's probabilities;
    which of the two the filter kept; the projected auxiliary's top token."""
    from ensemble_bench.methods.eva import faithful
    dists = [probs[0], projector(probs[1])]
    kept = faithful(dists, n)
    if not kept.any():
        kept[:] = True
    share = 1.0 / kept.sum(dim=0).float()
    fused = sum(torch.where(kept[i, :, None], share[:, None] * dists[i], 0.0) for i in (1, 0))[0]
    return fused, kept[:, 0].tolist(), int(dists[1][0].argmax())


class MapPair:
    """Both maps as [V_aux, V_main] CSR matrices, and the rows whose targets differ, each under the
    code's rule that parts them (docs/fidelity.md, EVA):
    ``zero_two``: one of the auxiliary's ids 0-2, or a row either map sends to the main model's ids 0-2;
    ``special``: (else) an auxiliary special token, or a target among the main model's special or padded ids;
    ``rest``: (else) the other rows whose targets differ."""

    def __init__(self, ours, theirs, aux_special: frozenset[int], lead_text: list[int]):
        self.ours = scipy.sparse.csr_matrix((ours.weight.numpy(), (ours.src.numpy(), ours.dst.numpy())),
                                            shape=theirs.shape)
        self.theirs = theirs.tocsr()
        mine, other = (abs(m).sign() for m in (self.ours, self.theirs))
        differ = np.asarray(abs(mine - other).sum(axis=1)).ravel() > 0
        nontext = np.ones(theirs.shape[1], dtype=np.float32)
        nontext[lead_text] = 0
        rows = np.arange(theirs.shape[0])
        to_zero_two = np.asarray((mine[:, :3] + other[:, :3]).sum(axis=1)).ravel() > 0
        to_special = (mine @ nontext + other @ nontext) > 0
        zero_two = differ & ((rows < 3) | to_zero_two)
        special = differ & ~zero_two & (np.isin(rows, sorted(aux_special)) | to_special)
        self.classes = {"zero_two": zero_two, "special": special, "rest": differ & ~zero_two & ~special}

    def with_theirs(self, rows: np.ndarray):
        """Our map with their rows where ``rows`` is set, as a projector."""
        swap = scipy.sparse.diags(rows.astype(np.float32))
        return projector((self.ours - swap @ self.ours + swap @ self.theirs).tocsr())

    def counts(self) -> dict:
        return {name: int(rows.sum()) for name, rows in self.classes.items()}


def crowding_check(members, pair: MapPair) -> dict:
    """For the ``rest`` rows where the code keeps a subset of our ten targets: does its top 10 (our ten
    scores with the main model's ids 0-2 scored as it scores them, 2 cos: their hubness is never
    computed) hold exactly as many of ids 0-2 as the places it lost?"""
    from ensemble_bench.vocab.eva_map import seed_pairs, supervised_mapping
    aux, main = members[1], members[0]
    x = aux.model.get_output_embeddings().weight.detach().float().numpy()[:aux.vocab.size]
    z = main.model.get_output_embeddings().weight.detach().float().numpy()[:main.vocab.size]
    xw, zw = supervised_mapping(x, z, *seed_pairs(aux.vocab, main.vocab))
    zero_two = 2 * unit_rows(xw) @ unit_rows(zw[:3]).T
    verdict = {"lost == ids 0-2 in its top 10": 0, "otherwise": 0, "ours keeps < 10: not checked": 0}
    for row in np.flatnonzero(pair.classes["rest"]):
        mine, other = pair.ours.getrow(row), pair.theirs.getrow(row)
        if not other.nnz or not set(other.indices) < set(mine.indices):
            continue
        if mine.nnz != 10:
            verdict["ours keeps < 10: not checked"] += 1
            continue
        scores = [(float(v), False) for v in mine.data] + [(float(c), True) for c in zero_two[row]]
        taken = sum(is_zero_two for _, is_zero_two in sorted(scores, reverse=True)[:10])
        verdict["lost == ids 0-2 in its top 10" if taken == 10 - other.nnz else "otherwise"] += 1
    return verdict


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)


def projector(matrix):
    """p -> p M for a [V_aux, V_main] scipy matrix (their ``spmm`` on the transposed matrix)."""
    coo = matrix.tocoo()
    transposed = torch.sparse_coo_tensor(np.array([coo.row, coo.col]), coo.data, matrix.shape).t().float().coalesce()
    return lambda probs: torch.spmm(transposed, probs.t()).t()


def first_difference(ours: dict, theirs: dict, tokens: int) -> int | None:
    """The first step at which the two loops chose different tokens (or one stopped): both choose
    main-model ids, so before it they read the same text."""
    steps = min(tokens, max(len(ours["top"]), len(theirs["top"])))
    for step in range(steps):
        if step >= len(ours["top"]) or step >= len(theirs["top"]):
            return step
        if ours["top"][step][0][0] != theirs["top"][step][0][0]:
            return step
    return None


def explain(members, pair: MapPair, ours_map, ours: dict, theirs: dict, tokens: int) -> dict:
    """At the first differing step: each side's choice, runner-up and top-2 margin as recorded; each
    model's input on both sides (the same ids, or where they part); the four recomputed cells
    {our map, their map} x {our feeding, their feeding} (which tell a map difference from a feeding
    one), each with the members the filter kept and the projected auxiliary's top token; and, on
    their feeding, our map with their rows of one class at a time (which of the code's rules decides)."""
    step = first_difference(ours, theirs, tokens)
    if step is None:
        return {"step": None}
    tokenizer = members[0].tokenizer

    def name(token_id) -> str:
        return tokenizer.convert_ids_to_tokens(int(token_id))

    def recorded(side: dict) -> dict:
        if step >= len(side["top"]):
            return {"stopped": True}
        (first, second), (best, runner_up) = side["top"][step]
        return {"choice": name(first), "second": name(second), "margin": best - runner_up}

    def cell(probs, project) -> dict:
        fused, kept, aux_top = fused_with(probs, project)
        top = fused.topk(2)
        return {"choice": name(top.indices[0]), "second": name(top.indices[1]),
                "margin": float(top.values[0] - top.values[1]), "kept": kept, "aux_top": name(aux_top)}

    out = {"step": step, "ours": recorded(ours), "official": recorded(theirs)}
    if step >= len(ours["top"]) or step >= len(theirs["top"]):
        return out
    feedings = {"our_feeding": [ids[step] for ids in ours["ids"]],
                "their_feeding": [ids[step] for ids in theirs["ids"]]}
    out["shared_tail"] = tokenizer.decode(feedings["their_feeding"][0][-8:])
    out["same_input"] = [a == b for a, b in zip(feedings["our_feeding"], feedings["their_feeding"])]
    for index, (a, b) in enumerate(zip(feedings["our_feeding"], feedings["their_feeding"])):
        if a != b:
            cut = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            names = members[index].tokenizer.convert_ids_to_tokens
            out.setdefault("input_parts", {})[members[index].name] = {
                "ours": names(a[cut:]), "official": names(b[cut:])}
    maps = {"our_map": ours_map.project, "their_map": projector(pair.theirs)}
    probs = {feeding: member_probs(members, ids) for feeding, ids in feedings.items()}
    for feeding in feedings:
        for map_name, project in maps.items():
            out[f"{map_name}+{feeding}"] = cell(probs[feeding], project)
    for rows, chosen in pair.classes.items():
        out[f"our_map_with_their_{rows}_rows"] = cell(probs["their_feeding"], pair.with_theirs(chosen))
    out["special"] = any(side["top"][step][0][0] in {0, 1, 2, *members[0].vocab.special_ids}
                         for side in (ours, theirs))
    out["cause"] = cause(out, list(pair.classes))
    return out


def cause(out: dict, classes: list[str]) -> str:
    """The cells' verdict: which of map and feeding turns our choice into theirs, and for the map,
    which class of rows does it alone."""
    ours, theirs = out["ours"]["choice"], out["official"]["choice"]
    if out["our_map+our_feeding"]["choice"] != ours or out["their_map+their_feeding"]["choice"] != theirs:
        return "float: the full forward does not repeat a recorded choice (near-tie)"
    map_alone = out["their_map+our_feeding"]["choice"] == theirs
    feeding_alone = out["our_map+their_feeding"]["choice"] == theirs
    if feeding_alone and not map_alone:
        return "feeding"
    deciding = [c for c in classes if out[f"our_map_with_their_{c}_rows"]["choice"] == theirs]
    rows = "+".join(deciding) if deciding else "no class alone"
    return f"map ({rows})" if map_alone and not feeding_alone else f"map ({rows}) or feeding" if map_alone \
        else f"map ({rows}) and feeding together"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--reference", type=Path, default=MIRROR)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="write the per-prompt record here (JSON)")
    parser.add_argument("--official-map", type=Path, default=None, help="keep the official matrix here (.npz) "
                        "and read it back on the next run")
    parser.add_argument("--check-crowding", action="store_true", help="recompute the mapped embeddings and "
                        "check that the rows the code keeps fewer targets in lost them to ids 0-2")
    parser.add_argument("--start", type=int, default=0, help="the first prompt run (an earlier run ended before it)")
    parser.add_argument("--only", type=indices, default=None, help="run these prompts only, e.g. 1,12-39")
    parser.add_argument("--resume", action="store_true", help="keep the records already in --out and run the "
                        "prompts it lacks")
    args = parser.parse_args()
    if args.resume and not args.out:
        sys.exit("--resume needs --out")
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
        pair = MapPair(method.projections[1], matrix, members[1].vocab.special_ids, members[0].vocab.text_ids())
        agreement["rows_differing_by_class"] = pair.counts()
        if args.check_crowding:
            agreement["crowding_check"] = crowding_check(members, pair)
        print(f"our map: {len(method.projections[1].src)} pairs from {method.projections[1].seeds} shared tokens, "
              f"{time.perf_counter() - started:.0f} s; map agreement: {json.dumps(agreement)}", flush=True)
        theirs = official_decoder(folder, members[0], members[1], matrix, args.tokens)
        records = json.loads(args.out.read_text())["records"] if args.resume and args.out.exists() else []
        done = {r["prompt"] for r in records}
        chosen = args.only if args.only is not None else range(args.start, len(questions))
        for index in [i for i in chosen if i not in done and i < len(questions)]:
            started = time.perf_counter()
            (mine, mine_trace), (other, other_trace) = ours(questions[index]), theirs(questions[index])
            a, b = mine.strip(), other.strip()
            kind = "equal" if a == b else "prefix" if (a and b.startswith(a)) or (b and a.startswith(b)) else "diverge"
            record = {"prompt": index, "kind": kind, "ours": mine, "official": other}
            if kind != "equal":
                record["why"] = explain(members, pair, method.projections[1], mine_trace, other_trace, args.tokens)
            record["seconds"] = round(time.perf_counter() - started, 1)
            records.append(record)
            print(json.dumps(record, ensure_ascii=False), flush=True)
            if args.out:  # written after every prompt: a partial run survives and can be resumed
                args.out.write_text(json.dumps({"counts": tally(records), "map": agreement, "records": records},
                                               indent=1, ensure_ascii=False))
    counts = tally(records)
    print(f"agreement: {counts['equal']}/{len(records)} equal, {counts['prefix']} prefix, "
          f"{counts['diverge']} diverge; causes: {json.dumps(counts['causes'])}")


def indices(text: str) -> list[int]:
    """'1,12-39' -> [1, 12, 13, ..., 39]."""
    out = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        try:
            out.extend(range(int(low), int(high or low) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a list of prompts: {text!r} (e.g. 1,12-39)") from None
    return out


def tally(records: list[dict]) -> dict:
    """Equal / prefix / diverge, and the divergences by the cause ``explain`` gave."""
    counts: dict = {"equal": 0, "prefix": 0, "diverge": 0, "causes": {}}
    for record in records:
        counts[record["kind"]] += 1
        if record["kind"] == "diverge":
            why = record.get("why", {}).get("cause", "not examined")
            counts["causes"][why] = counts["causes"].get(why, 0) + 1
    return counts

if __name__ == "__main__":
    main()
