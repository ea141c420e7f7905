"""Members in Ray actors (placement: ray): the member interface equals a local member's, traffic,
placement, recipe fields (every method's results under Ray: tests/methods/test_method_contract.py).

The session's local Ray cluster on the CPU (``ray_cluster``: 4 logical CPUs, no dashboard) and its two tiny
random members saved as model directories, each loaded once locally and once in an actor
(``ray_members``), both from tests/conftest.py.
"""

import threading

import pytest
import torch

from ensemble_bench.decoding.concurrent import each, overlaps
from ensemble_bench.errors import UserError
from ensemble_bench.members import Prompt, load_member
from ensemble_bench.methods.gac import Gac, GacParams
from ensemble_bench.recipe import parse_recipe
from tests.tiny import CORPUS, REQUESTS
from tests.tolerances import HANG_GUARD_S

ray = pytest.importorskip("ray")


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)))


@pytest.mark.slow
def test_remote_member_interface_equals_local(ray_members):
    local, remote = ray_members
    loc, rem = local[1], remote[1]
    clocks = [(m.clock.prefill_calls, m.clock.decode_calls) for m in (loc, rem)]
    assert (rem.name, rem.vocab, rem.stop_ids, rem.max_length, rem.prefix_token_id) == \
        (loc.name, loc.vocab, loc.stop_ids, loc.max_length, loc.prefix_token_id)
    prompt = Prompt(messages=(("user", "What is 12 plus 30?"),))
    assert rem.render(prompt) == loc.render(prompt) and rem.word_starts(CORPUS[3]) == loc.word_starts(CORPUS[3])
    assert rem.encode_pair("Question: 2+2?", " 4") == loc.encode_pair("Question: 2+2?", " 4")
    rows = [loc.encode(CORPUS[i][:20 + 10 * i]) for i in range(3)]
    calls = [("prefill", rows), ("extend", [[5, 6], [], [7]]), ("extend_scored", [[8, 9, 10], [11], []]),
             ("crop", [len(rows[0]) + 1, len(rows[1]), len(rows[2])]), ("extend", [[], [], []]),
             ("keep", [2, 0]), ("extend_scored", [[12], [13, 14]]), ("extend", [[15], []])]
    for name, args in calls:
        a, b = getattr(loc, name)(args), getattr(rem, name)(args)
        if name == "extend_scored":
            assert same(a[0], b[0]) and a[1] == b[1], name
        elif a is not None:
            assert same(a, b), name
        assert loc.row_ids() == rem.row_ids() == rem.remote_row_ids(), name
    with pytest.raises(ValueError):
        rem.crop([10**6, 0])
    with pytest.raises(ValueError):
        rem.extend([[1]])  # the batch has two rows
    pairs_ = [(loc.encode("The quick"), loc.encode(" brown fox", add_special_tokens=False)), ([1], [5, 6])]
    assert rem.score(pairs_) == loc.score(pairs_)
    assert torch.equal(rem.input_embeddings(), loc.input_embeddings())
    calls = [(m.clock.prefill_calls - p, m.clock.decode_calls - d) for m, (p, d) in zip((loc, rem), clocks)]
    assert calls == [(1, 4)] * 2


@pytest.mark.slow
def test_remote_members_step_side_by_side(ray_members):
    """Every method's results under Ray equal local ones: tests/methods/test_method_contract.py."""
    local, remote = ray_members
    assert overlaps(remote) and not overlaps(local)  # remote: members step in threads; local: a plain loop


@pytest.mark.slow
def test_bytes_per_step(ray_members):
    """Per step, each member sends back the float32 log-probs of the rows that took tokens only."""
    _, remote = ray_members
    before = [dict(m.traffic) for m in remote]
    Gac(remote, GacParams(), batch_size=1).generate(REQUESTS[:1])
    for member, old in zip(remote, before):
        calls = member.traffic["step_calls"] - old["step_calls"]
        sent = member.traffic["step_bytes"] - old["step_bytes"]
        rows = member.traffic["rows_returned"] - old["rows_returned"]
        assert calls >= 2 and rows == calls and sent == 4 * member.vocab.size * rows  # batch of one: one row a call


@pytest.mark.slow
def test_member_pool_builds_remote_members(ray_cluster, tiny_dirs):
    from ensemble_bench.members.remote import RemoteMember
    from ensemble_bench.run.build import MemberPool

    recipe = parse_recipe({"name": "r", "members": [{"model": tiny_dirs[0], "name": "bpe", "num_cpus": 0}],
                           "method": "single", "tasks": ["piqa"], "placement": {"kind": "ray"}})
    member = MemberPool(recipe).get(0)
    try:
        assert isinstance(member, RemoteMember) and member.name == "bpe"
        local = load_member(tiny_dirs[0], name="bpe")
        assert same(member.prefill([local.encode(CORPUS[0])]), local.prefill([local.encode(CORPUS[0])]))
    finally:
        member.close()


@pytest.mark.slow
def test_actor_load_error_is_one_line(ray_cluster):
    from ensemble_bench.members.remote import RemoteMember

    with pytest.raises(UserError, match="^quantization '3bit' is not one of") as info:
        RemoteMember({"model": "unused", "quantization": "3bit"}, {"num_cpus": 0})
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_an_unplaceable_member_ends_the_run_in_one_line_within_the_timeout(ray_cluster, tiny_dirs, offline_data,
                                                                          tmp_path, monkeypatch, capsys):
    """A member asking for 2 GPUs of a cluster with none: `ensbench run` stops after
    placement.schedule_timeout_s with one line naming it, what it asked for and what the cluster has."""
    import sys

    import yaml

    from ensemble_bench.cli.main import main
    from ensemble_bench.run import build

    timeouts = []

    def recorded(actors, timeout_s):
        timeouts.append(timeout_s)
        build_wait(actors, timeout_s)
    build_wait = build.wait_placed
    monkeypatch.setattr(build, "wait_placed", recorded)
    recipe = tmp_path / "unplaceable.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "unplaceable", "method": "single", "tasks": [{"name": "piqa", "limit": 1}], "data": "offline",
        "output": str(tmp_path / "results"), "placement": {"kind": "ray", "schedule_timeout_s": 3},
        "members": [{"model": tiny_dirs[1], "name": "huge", "num_gpus": 2}]}))
    monkeypatch.setattr(sys, "argv", ["ensbench", "run", str(recipe)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2 and timeouts == [3]  # the recipe's timeout reaches the one wait
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    [line] = [x for x in captured.err.splitlines() if "could not place" in x]
    assert "member 'huge' within 3 s: it asks for CPU 1, GPU 2; the cluster has CPU 4, GPU 0" in line, line


@pytest.mark.slow
def test_placeable_members_pass_the_placement_wait(ray_cluster, tiny_dirs):
    from ensemble_bench.members.remote import RemoteMember, launch, wait_placed

    load = {"model": tiny_dirs[0], "name": "bpe"}
    actor = launch(load, {"num_cpus": 0})  # the session's `ray_members` may hold both CPUs
    wait_placed({"bpe": actor}, HANG_GUARD_S)  # returns once placed; raises only past the guard
    member = RemoteMember(load, actor=actor)
    try:
        assert member.name == "bpe"
    finally:
        member.close()


# ------------------------------------------------------------------ concurrency helper (no Ray)
class Fake:
    def __init__(self, lane_device, remote=False):
        self.device, self.remote = lane_device, remote


def test_each_keeps_order_runs_side_by_side_and_raises_the_first_error():
    assert not overlaps([Fake("cpu"), Fake("cpu")]) and not overlaps([Fake("cuda"), Fake("cuda:0")])
    assert overlaps([Fake("cuda:0"), Fake("cuda:1")]) and overlaps([Fake("cpu"), Fake("cpu", remote=True)])
    threads = []
    together = threading.Barrier(3, timeout=HANG_GUARD_S)  # passes only with all three calls in flight at once

    def call(member, value):
        threads.append(threading.current_thread().name)
        together.wait()
        return value * 2
    members = [Fake("cpu", remote=True) for _ in range(3)]
    assert each(members, call, [1, 2, 3]) == [2, 4, 6]
    assert all(t.startswith("ensbench-member") for t in threads)
    threads.clear()
    together = threading.Barrier(1)  # the plain loop: one call at a time
    assert each([Fake("cpu"), Fake("cpu")], call, [1, 2]) == [2, 4] and threads == ["MainThread"] * 2

    def fail(member, value):
        if value:
            raise ValueError(f"member {value}")
        return each(members, lambda m: 0)  # nested: a plain loop inside a pool thread
    with pytest.raises(ValueError, match="member 1"):
        each(members, fail, [0, 1, 2])
    assert each(members, fail, [0, 0, 0]) == [[0, 0, 0]] * 3


# ------------------------------------------------------------------ recipe fields
BASE = {"name": "r", "members": [{"model": "smollm2-135m"}, {"model": "qwen2.5-0.5b"}], "method": "gac",
        "tasks": ["piqa"], "data": "offline"}
BAD = {
    "unknown placement field": ({"placement": {"kind": "ray", "adress": "auto"}}, "placement.adress: unknown field"),
    "unknown placement kind": ({"placement": {"kind": "slurm"}}, "placement.kind: Input should be 'local' or 'ray'"),
    "bad address": ({"placement": {"kind": "ray", "address": "not an address"}},
                    "placement.address: String should match"),
    "address when local": ({"placement": {"address": "auto"}},
                           "placement: address, num_cpus and num_gpus need kind: ray"),
    "schedule timeout when local": ({"placement": {"schedule_timeout_s": 30}},
                                    "placement: schedule_timeout_s needs kind: ray"),
    "zero schedule timeout": ({"placement": {"kind": "ray", "schedule_timeout_s": 0}},
                              "placement.schedule_timeout_s: Input should be greater than 0"),
    "size with address": ({"placement": {"kind": "ray", "address": "auto", "num_cpus": 4}},
                          "placement: num_cpus / num_gpus size a cluster started here"),
    "unknown member field": ({"members": [{"model": "smollm2-135m", "gpus": 1}, {"model": "qwen2.5-0.5b"}]},
                             "members[0].gpus: unknown field"),
    "negative num_gpus": ({"members": [{"model": "smollm2-135m", "num_gpus": -1}, {"model": "qwen2.5-0.5b"}]},
                          "members[0].num_gpus: Input should be greater than or equal to 0"),
    "bad resources": ({"members": [{"model": "smollm2-135m"}, {"model": "qwen2.5-0.5b", "resources": {"a100": "one"}}]},
                      "members[1].resources.a100: Input should be a valid number"),
    "bad quantization": ({"members": [{"model": "smollm2-135m", "quantization": "3bit"}, {"model": "qwen2.5-0.5b"}]},
                         "members[0].quantization: Input should be '8bit' or '4bit'"),
    "bad device_map": ({"members": [{"model": "smollm2-135m", "device_map": "everywhere"}, {"model": "qwen2.5-0.5b"}]},
                       "members[0].device_map"),
    "max_memory alone": ({"members": [{"model": "smollm2-135m", "max_memory": {0: "10GiB"}},
                                      {"model": "qwen2.5-0.5b"}]}, "members[0]: max_memory needs a device_map"),
    "device and device_map": ({"members": [{"model": "smollm2-135m", "device": "cuda", "device_map": "auto"},
                                           {"model": "qwen2.5-0.5b"}]},
                              "members[0]: set device or device_map, not both"),
    "cuda without gpus": ({"placement": {"kind": "ray"}, "members": [{"model": "smollm2-135m", "device": "cuda"},
                                                                      {"model": "qwen2.5-0.5b"}]},
                          "members[0].num_gpus: device 'cuda' under placement ray needs num_gpus > 0"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_placement_fields_are_one_line(case):
    fields, expected = BAD[case]
    with pytest.raises(UserError) as info:
        parse_recipe({**BASE, **fields}, "r.yaml")
    line = str(info.value)
    assert "\n" not in line and line.startswith("r.yaml: ") and expected in line, line


def test_good_placement_fields():
    recipe = parse_recipe({**BASE, "placement": {"kind": "ray", "address": "ray://head:10001"}, "members": [
        {"model": "smollm2-135m", "device": "cuda", "num_gpus": 1, "num_cpus": 2, "resources": {"a100": 1}},
        {"model": "qwen2.5-0.5b", "device_map": "auto", "max_memory": {0: "20GiB", "cpu": "64GiB"}, "num_gpus": 2}]})
    assert recipe.members[0].actor_options() == {"num_gpus": 1.0, "num_cpus": 2.0, "resources": {"a100": 1.0}}
    assert recipe.members[1].load_kwargs()["max_memory"] == {0: "20GiB", "cpu": "64GiB"}
    assert recipe.members[1].load_kwargs()["device_map"] == "auto"
    assert parse_recipe(BASE).fingerprint() == parse_recipe({**BASE, "placement": {"kind": "local"}}).fingerprint()


def test_quantization_without_bitsandbytes_is_one_line(monkeypatch, tmp_path):
    import ensemble_bench.run.preflight as preflight_module  # the preflight checks packages; parsing reads no machine
    from ensemble_bench.run.setup import run_setup

    monkeypatch.setattr(preflight_module, "_installed", lambda package: package != "bitsandbytes")
    fields = {"members": [{"model": "smollm2-135m", "quantization": "4bit"}, {"model": "qwen2.5-0.5b"}],
              "output": str(tmp_path)}
    with pytest.raises(UserError, match=r"^r.yaml: members\[0\].quantization: '4bit' needs the bitsandbytes package"):
        run_setup(parse_recipe({**BASE, **fields}, "r.yaml"), "r.yaml", dry_run=True)
    monkeypatch.setattr(preflight_module, "_installed", lambda package: package != "ray")
    with pytest.raises(UserError, match=r"^r.yaml: placement.kind: ray needs the ray package"):
        run_setup(parse_recipe({**BASE, "placement": {"kind": "ray"}, "output": str(tmp_path)}), "r.yaml",
                  dry_run=True)


def test_load_member_quantization_needs_bitsandbytes(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    with pytest.raises(UserError, match="^quantization '8bit' needs the bitsandbytes package"):
        load_member("unused", quantization="8bit")


@pytest.mark.slow
def test_a_local_instance_runs_member_actors_at_the_driver_s_niceness():
    """Ray gives its workers niceness 15 by default: the driver's and Ray's own threads then preempt the
    member actors. An instance connect() starts keeps them at the driver's niceness."""
    import subprocess
    import sys

    code = ("import os, ray\nfrom ensemble_bench.members.remote import connect\nconnect(num_cpus=1)\n"
            "@ray.remote\ndef niceness():\n    return os.getpriority(os.PRIO_PROCESS, 0)\n"
            "print('niceness', os.getpriority(os.PRIO_PROCESS, 0), ray.get(niceness.remote()))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD_S)
    [line] = [text for text in done.stdout.splitlines() if text.startswith("niceness")]
    _, driver, actor = line.split()
    assert actor == driver
