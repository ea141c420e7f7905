"""lm-eval's own data parallelism: ``torchrun`` / ``accelerate launch`` ranks of ``ensbench-lm-eval`` (run/ranks.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ensemble_bench.errors import EnvironmentFault, UserError
from ensemble_bench.run.build import recipe_from_model_args
from ensemble_bench.run.ranks import Ranks, as_one_process, launched, placed_on_rank

PAIR = [{"model": "m", "name": "a"}, {"model": "n", "name": "b"}]


def test_the_launchers_environment_names_the_rank():
    assert launched({}) is None and launched({"WORLD_SIZE": "1", "RANK": "0"}) is None
    assert launched({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}) == Ranks(3, 4, 1)
    assert launched({"WORLD_SIZE": "2", "RANK": "1"}) == Ranks(1, 2, 0)
    with pytest.raises(EnvironmentFault, match="RANK=None: a launcher's rank must be a whole number"):
        launched({"WORLD_SIZE": "2"})
    with pytest.raises(EnvironmentFault, match="RANK=2 is outside WORLD_SIZE=2"):
        launched({"WORLD_SIZE": "2", "RANK": "2"})


def test_each_local_rank_takes_gpus_of_its_own():
    recipe = recipe_from_model_args({"members": [{**PAIR[0], "device": "cuda"}, {**PAIR[1], "device": "cuda:1"}]},
                                    "gac", {})
    assert [m.device for m in placed_on_rank(recipe, Ranks(0, 2, 0), gpus=4).members] == ["cuda:0", "cuda:1"]
    assert [m.device for m in placed_on_rank(recipe, Ranks(3, 4, 1), gpus=4).members] == ["cuda:2", "cuda:3"]
    with pytest.raises(EnvironmentFault, match=r"needs GPUs 2-3 .* but this machine has 3"):
        placed_on_rank(recipe, Ranks(1, 2, 1), gpus=3)
    on_cpu = recipe_from_model_args({"members": PAIR}, "gac", {})
    assert placed_on_rank(on_cpu, Ranks(1, 2, 1), gpus=0) == on_cpu  # each rank's copy on the CPU


@pytest.mark.parametrize("model_args, refused", [
    ({"members": PAIR, "replicas": 2}, "placement: ray under a launcher"),
    ({"members": [{**PAIR[0], "device_map": "auto"}, PAIR[1]]}, "member a: device_map under a launcher"),
    ({"members": [PAIR[0], {**PAIR[1], "backend": "vllm"}]}, "member b: backend vllm under a launcher"),
])
def test_what_a_rank_cannot_place_is_refused(model_args, refused):
    with pytest.raises(UserError, match=refused + r" \(WORLD_SIZE=2\): use one process with placement replicas"):
        placed_on_rank(recipe_from_model_args(model_args, "gac", {}), Ranks(0, 2, 0))


class StandInTask:
    """A task of ``documents`` documents, two requests each, as lm-eval's Task builds them for a rank."""

    config = SimpleNamespace(task="stand_in")

    def __init__(self, documents: int):
        self.documents, self.asked = documents, None

    def build_all_requests(self, *, rank: int = 0, world_size: int = 1, limit=None):
        self.asked = (rank, world_size)
        ids = range(self.documents)[rank::world_size]
        self._instances = [SimpleNamespace(doc_id=doc_id, choice=c) for doc_id in ids for c in range(2)]


def test_each_rank_builds_every_documents_requests_and_keeps_its_own():
    build = as_one_process(StandInTask.build_all_requests)
    task = StandInTask(5)
    build(task, rank=1, world_size=2, limit=5)
    assert task.asked == (0, 1) and [(r.doc_id, r.choice) for r in task._instances] == [(1, 0), (1, 1), (3, 0), (3, 1)]
    with pytest.raises(UserError, match=r"task stand_in: 1 document\(s\) for 2 ranks: give each rank one at least"):
        build(StandInTask(1), rank=0, world_size=2)


def test_lm_evals_padding_copies_get_their_requests_answers_uncomputed(pair):
    """lm-eval evens the ranks' request counts by passing a rank's last request again (past its repeats):
    the copies get that request's own answers (its samples in turn), and nothing is drawn or computed."""
    from lm_eval.api.instance import Instance

    from ensemble_bench.decoding.request_sampling import SamplingPolicy
    from ensemble_bench.methods.gac import Gac, GacParams
    from ensemble_bench.run.lm import EnsembleLM

    def model(ranks=None) -> EnsembleLM:
        lm = EnsembleLM(Gac(pair(), GacParams(), batch_size=2), "gac", sampling=SamplingPolicy(5))
        lm.ranks = ranks
        return lm

    sampled = {"until": ["\n\n"], "max_gen_toks": 6, "temperature": 1.5}
    first, last = (Instance("generate_until", {}, (text, sampled), k, ("t", k, 2))
                   for k, text in enumerate(["The weather today", "Once upon a time there"]))
    alone = model().generate_until([first, first, last, last])
    assert alone[2] != alone[3]  # two samples of the last request
    ranked = model(Ranks(1, 2, 0))
    assert ranked.generate_until([first, first, last, last, last, last]) == alone + alone[2:]
    assert ranked.requests_computed == 4
    choice = Instance("loglikelihood", {}, ("Is it so?", " yes"), 0, ("t", 0, 1))
    assert ranked.loglikelihood([choice, choice, choice]) == model().loglikelihood([choice]) * 3
    assert ranked.requests_computed == 5


def row_files(row: Path) -> dict:
    """The row's samples (in document order: rank 0 writes its own, then the others') and its metrics. The
    filtered answers, not the raw ones: lm-eval evens the ranks' request counts with copies of a rank's last
    request, and the copies' answers are appended to that request's raw ones."""
    found = {}
    for path in sorted(row.glob("samples_*.jsonl")):
        records = map(json.loads, path.read_text().splitlines())
        found[path.name.split("_")[1]] = sorted(
            (r["doc_id"], r["filter"], r["prompt_hash"], json.dumps(r["filtered_resps"])) for r in records)
    [results] = row.glob("results_*.json")
    found["results"] = json.loads(results.read_text())["results"]
    return found


def launch(argv: list[str], processes: int, env: dict) -> subprocess.CompletedProcess:
    """``ensbench-lm-eval ARGV`` as torchrun starts it on ``processes`` ranks of this machine."""
    script = Path(sys.executable).parent / "ensbench-lm-eval"
    command = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
                "--no-python", str(script)] if processes > 1 else [str(script)])
    return subprocess.run([*command, *argv], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_two_ranks_give_one_processs_results_and_samples(tiny_dirs, offline_data, tmp_path):
    """torchrun's two ranks (each a copy of the ensemble, half of the questions) against one process, at
    batch 1: the same samples and the same metrics; timing.json says how the work was spread."""
    members = [{"model": tiny_dirs[0], "name": "a"}, {"model": tiny_dirs[1], "name": "b"}]
    args = json.dumps({"members": members, "method": {"threshold": 0.5}, "batch_size": 1})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    found = {}
    for processes in (1, 2):
        out = tmp_path / f"ranks{processes}"
        done = launch(["run", "--model", "gac", "--model_args", args, "--tasks", "piqa,gsm8k", "--limit", "3",
                       "--gen_kwargs", "max_gen_toks=6", "--log_samples", "--threads", "1", "--output_path",
                       str(out)], processes, env)
        assert done.returncode == 0, done.stderr[-3000:]
        found[processes] = out / "gac-a+b" / "gac"
    assert "gac (rank 1 of 2): " in done.stderr  # each rank's progress, named
    assert row_files(found[2]) == row_files(found[1])
    ranks = json.loads((found[2] / "timing.json").read_text())["ranks"]
    assert ranks["count"] == 2 and ranks["requests_computed"][1] > 0 and 0 < ranks["balance"] <= 1
    assert (found[2].parent / "summary.md").exists()


def test_a_recipe_run_under_a_launcher_is_one_line(tmp_path, monkeypatch, capsys):
    from tests.cli_helpers import one_line, run_cli

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    code, out = run_cli(monkeypatch, capsys, "run", str(tmp_path / "any.yaml"))
    assert code == 2 and "ensbench run under a launcher (WORLD_SIZE=2): run it as one process" in one_line(out)
