"""Data-parallel replicas (placement: {kind: ray, replicas: R}, run/replicas.py): the chunks left after any
set of finished chunks are the chunks one process forms; two replicas give the samples, results and
statistics of one process, byte for byte, also when they sample; a replica killed mid-run loses nothing.
"""

import json
import random
from types import SimpleNamespace

import pytest
import yaml

from ensemble_bench.recipe import parse_recipe
from ensemble_bench.run.lm import EnsembleLM
from tests.cli_helpers import row_files, run_cli


def chunker(size: int) -> EnsembleLM:
    return EnsembleLM(SimpleNamespace(batch_size=size, members=[]), "chunks")


def requests_with_shared_contexts(rng: random.Random, count: int) -> list:
    """Requests whose contexts repeat (the choices of one question) and whose lengths tie."""
    contexts = [rng.choice("ab") * rng.randint(1, 6) + str(rng.randint(0, 3)) for _ in range(count // 2 + 1)]
    return [SimpleNamespace(args=(rng.choice(contexts), f"choice {i}")) for i in range(count)]


def test_the_chunks_left_after_any_finished_chunks_are_the_chunks_one_process_forms():
    """Replicas cache whole chunks in any order; a resumed run chunks the requests left greedily. Those
    chunks must be the original chunks left (a chunk's batch decides its padding, and so its scores), also
    where sampled requests (``apart``) split a context's repeats between chunks."""
    rng = random.Random(7)
    for _ in range(600):
        size = rng.randint(1, 4)
        requests = requests_with_shared_contexts(rng, rng.randint(1, 24))
        sampled = {request.args[0] for request in requests if rng.random() < 0.3}  # their repeats: apart
        apart = frozenset(i for i, request in enumerate(requests) if request.args[0] in sampled)
        chunks = chunker(size)._chunks(requests, apart)
        finished = {n for n in range(len(chunks)) if rng.random() < 0.5}
        left = [i for n, chunk in enumerate(chunks) if n not in finished for i in chunk]
        left_apart = frozenset(k for k, i in enumerate(left) if i in apart)
        again = chunker(size)._chunks([requests[i] for i in left], left_apart)
        assert [[left[j] for j in chunk] for chunk in again] == \
            [chunk for n, chunk in enumerate(chunks) if n not in finished]


class StandInReplicas:
    """Two replicas in this process (no Ray): each chunk answered by the adapter's code of its own model, the
    chunks handed back last first, the odd ones by the second replica."""

    def __init__(self, models: list[EnsembleLM]):
        self.models, self.actors = models, models
        self.recipe = SimpleNamespace(plan=[SimpleNamespace(label="gac", method="gac")], batch_size=2)

    def begin(self, label, lm_class) -> dict:
        from ensemble_bench.run.sittings import joins

        members = [(m.name, m.uses_chat_template) for m in self.models[0].method.members]
        return {"members": members, "joins": joins(self.models[0].carried())}

    def answer(self, kind, batches):
        for number in reversed(range(len(batches))):
            answers = self.models[number % 2].answer(kind, batches[number])
            yield number % 2, number, {"answers": answers, "busy": 0.0, "counts": {}, "records": {}, "traces": []}


def test_samples_do_not_depend_on_the_replica_that_draws_them(pair):
    """The driver gives each sampled request its draw (seed, request, repeat) before its chunk goes out: chunks
    drawn by two replicas in any order hold one process's samples, repeats of a request differing."""
    from ensemble_bench.decoding.request_sampling import SamplingPolicy
    from ensemble_bench.methods.gac import Gac, GacParams
    from ensemble_bench.run.lm import ReplicatedLM
    from tests.run.test_sampled_resume import REPEATS, instances

    def model() -> EnsembleLM:
        return EnsembleLM(Gac(pair(), GacParams(), batch_size=2), "gac", sampling=SamplingPolicy(5))

    requests = instances({"temperature": 1.5, "top_p": 0.9})
    alone = model().generate_until(requests)
    replicated = ReplicatedLM(StandInReplicas([model(), model()]), "gac", sampling=SamplingPolicy(5))
    assert replicated.generate_until(requests) == alone
    assert any(len(set(alone[k:k + REPEATS])) > 1 for k in range(0, len(requests), REPEATS))


def test_replicas_need_ray_placement():
    with pytest.raises(Exception, match="replicas need kind: ray"):
        parse_recipe({"name": "r", "members": [{"model": "m"}, {"model": "n"}], "method": "gac", "tasks": ["piqa"],
                      "placement": {"replicas": 2}}, "recipe")


RECIPE = """\
name: tiny-replicas
members:
  - {{model: {bpe}, name: bpe, num_cpus: 0.5}}
  - {{model: {sp}, name: sp, num_cpus: 0.5}}
methods:
  - {{name: gac, threshold: 0.6, gate: bpe}}
  - {{name: sweetspan, span_words: 2}}
tasks:
  - {{name: gsm8k, shots: 1, limit: 3, gen_kwargs: {{max_gen_toks: 12}}}}
  - {{name: piqa, limit: 3}}
batch_size: 2
data: offline
output: {output}
{placement}
"""
TWO_REPLICAS = "placement: {kind: ray, replicas: 2}"
ROWS = ("gac", "sweetspan")
SAME = ("tokens_generated", "decode_steps", "generation_batches", "contexts_truncated", "requests_computed",
        "requests_scored", "tokens_scored", "ensembled_fraction", "params", "batch_size")


def run_recipe_text(monkeypatch, capsys, tmp_path, name, text):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    code, out = run_cli(monkeypatch, capsys, "run", str(path))
    assert code == 0, out.err
    [run_dir] = (tmp_path / name / "tiny-replicas").iterdir()
    return run_dir


def timing(run_dir, row):
    return json.loads((run_dir / row / "timing.json").read_text())


def method_counters(stats: dict, method: str) -> dict:
    """The method's own statistics that count work (not seconds)."""
    own = stats.get(method, {})
    return {k: v for k, v in own.items() if "seconds" not in k and "_ms" not in k}


@pytest.mark.slow
def test_two_replicas_give_the_samples_results_and_counts_of_one_process(ray_cluster, tiny_dirs, tmp_path,
                                                                           monkeypatch, capsys):
    bpe, sp = tiny_dirs
    one = run_recipe_text(monkeypatch, capsys, tmp_path, "one", RECIPE.format(
        bpe=bpe, sp=sp, output=tmp_path / "one", placement=""))
    two = run_recipe_text(monkeypatch, capsys, tmp_path, "two", RECIPE.format(
        bpe=bpe, sp=sp, output=tmp_path / "two", placement=TWO_REPLICAS))
    for row in ROWS:
        assert row_files(two / row) == row_files(one / row), row
        alone, replicated = timing(one, row), timing(two, row)
        assert {k: replicated.get(k) for k in SAME} == {k: alone.get(k) for k in SAME}, row
        assert method_counters(replicated, row) == method_counters(alone, row), row
        spread = replicated["replicas"]
        assert spread["count"] == 2 and sum(spread["batches"]) >= 4 and spread["wall_seconds"] > 0, spread
        assert "replicas" not in alone
    one_traces, two_traces = ((run / "sweetspan" / "span_trace.jsonl").read_text() for run in (one, two))
    assert one_traces == two_traces and one_traces


SAMPLED = ("methods:\n  - {{name: gac, threshold: 0.6, gate: bpe}}\n  - {{name: sweetspan, span_words: 2}}\n",
           "methods:\n  - {{name: gac, threshold: 0.6, gate: bpe}}\nsampling: {{temperature: 1.5, top_p: 0.9}}\n")


@pytest.mark.slow
def test_two_replicas_draw_the_samples_of_one_process(ray_cluster, tiny_dirs, tmp_path, monkeypatch, capsys):
    """Each sampled request draws from a generator seeded by the recipe's seed, the request and its repeat: the
    chunks two replicas draw hold the samples one process draws (repeats of a request differ)."""
    bpe, sp = tiny_dirs
    text = RECIPE.replace(*SAMPLED).replace("limit: 3, gen_kwargs", "limit: 3, repeats: 3, gen_kwargs")
    assert text != RECIPE and "repeats: 3" in text
    one = run_recipe_text(monkeypatch, capsys, tmp_path, "one", text.format(
        bpe=bpe, sp=sp, output=tmp_path / "one", placement=""))
    two = run_recipe_text(monkeypatch, capsys, tmp_path, "two", text.format(
        bpe=bpe, sp=sp, output=tmp_path / "two", placement=TWO_REPLICAS))
    assert row_files(two / "gac") == row_files(one / "gac")
    [samples] = (one / "gac").glob("samples_gsm8k*.jsonl")
    drawn = [json.loads(line)["resps"][0] for line in samples.read_text().splitlines()]
    assert all(len(repeats) == 3 for repeats in drawn) and any(len(set(map(str, r))) > 1 for r in drawn)
    assert timing(two, "gac")["replicas"]["count"] == 2


@pytest.mark.slow
def test_a_killed_replica_loses_nothing(ray_cluster, tiny_dirs, tmp_path):
    """The second replica is killed after the first chunk arrives: its chunk in flight goes to the other,
    and the answers equal one process's."""
    from ensemble_bench.run.build import MemberPool, build_method
    from ensemble_bench.run.lm import LM_CLASSES, ReplicatedLM
    from ensemble_bench.run.replicas import Replicas

    bpe, sp = tiny_dirs
    text = RECIPE.format(bpe=bpe, sp=sp, output=tmp_path, placement=TWO_REPLICAS)
    recipe = parse_recipe(yaml.safe_load(text), "recipe")
    row = recipe.plan[0]
    contexts = [f"Question {i}: what is {i} plus {i * 3}?" + " Think." * (i % 4) for i in range(9)]
    requests = [SimpleNamespace(args=(c, {"until": ["\n"], "max_gen_toks": 8})) for c in contexts]
    local = LM_CLASSES[row.method](build_method(recipe, row, MemberPool(recipe.model_copy(
        update={"placement": type(recipe.placement)()}))), row.label)
    expected = local.generate_until(requests)

    replicas = Replicas(recipe)
    try:
        lm = ReplicatedLM(replicas, row.label)
        killed = []

        def kill_second():
            if not killed:
                killed.append(replicas.actors[1])
                ray_cluster.kill(replicas.actors[1], no_restart=True)

        lm.after_chunk = kill_second
        assert lm.generate_until(requests) == expected
        assert killed and replicas.live == [0] and lm.requests_computed == len(requests)
    finally:
        replicas.close()


def test_replicas_in_the_recipe_text():
    parsed = parse_recipe({"name": "r", "members": [{"model": "m"}, {"model": "n"}], "method": "gac", "tasks": ["piqa"],
                           "placement": {"kind": "ray", "replicas": 3}}, "recipe")
    assert parsed.placement.replicas == 3


# --- the lm-eval route: "replicas" in --model_args ----------------------------------------------------------------
def test_replicas_in_model_args_are_ray_placement():
    from ensemble_bench.run.build import recipe_from_model_args

    members = [{"model": "m", "name": "a"}, {"model": "n", "name": "b"}]
    recipe = recipe_from_model_args({"members": members, "replicas": 2}, "gac", {})
    assert (recipe.placement.kind, recipe.placement.replicas) == ("ray", 2)
    recipe = recipe_from_model_args({"members": members, "replicas": 3, "placement": {"schedule_timeout_s": 9}},
                                    "gac", {})
    assert (recipe.placement.replicas, recipe.placement.schedule_timeout) == (3, 9)


@pytest.mark.slow
def test_the_lm_eval_route_with_two_replicas_gives_one_processs_samples(ray_cluster, tiny_dirs, offline_data,
                                                                         tmp_path, monkeypatch, capsys):
    from tests.cli.test_lm_eval_route import lm_eval

    members = [{"model": str(tiny_dirs[0]), "name": "a", "num_cpus": 0.5},
               {"model": str(tiny_dirs[1]), "name": "b", "num_cpus": 0.5}]
    found = {}
    for name, extra in (("one", {}), ("two", {"replicas": 2})):
        args = json.dumps({"members": members, "method": {"threshold": 0.5}, "batch_size": 1, **extra})
        code, out = lm_eval(monkeypatch, capsys, "run", "--model", "gac", "--model_args", args, "--tasks", "piqa",
                            "--limit", "3", "--log_samples", "--output_path", str(tmp_path / name))
        assert code == 0, out.err[-3000:]
        found[name] = tmp_path / name / "gac-a+b" / "gac"
    assert row_files(found["two"]) == row_files(found["one"])
    timing = json.loads((found["two"] / "timing.json").read_text())
    spread = timing["replicas"]
    assert spread["count"] == 2 and sum(spread["batches"]) == 3  # a question's choices: one batch
