"""Two nodes without a cluster (issue 49, item 7): Ray's test cluster (``ray.cluster_utils.Cluster``) starts
two raylets on loopback with different custom resources; the recipe's ``resources`` put the members (one
actor each) and then two replicas on the two "nodes", and the samples and results equal one process's.
The runs join the cluster as a user on one of its machines would: by its address, and by ``address: auto``.

The cluster keeps its files (and its ``ray_current_cluster`` address file, which ``auto`` reads) under its
own RAY_TMPDIR, so no other Ray instance on this machine finds it, and it listens on 127.0.0.1 only (Ray
takes 127.0.0.1 as every process's address when RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, as on a laptop).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli

RECIPE = """\
name: two-nodes
members:
  - {{model: {bpe}, name: bpe{first}}}
  - {{model: {sp}, name: sp{second}}}
methods:
  - {{name: gac, threshold: 0.6, gate: bpe}}
tasks:
  - {{name: gsm8k, shots: 1, limit: 3, gen_kwargs: {{max_gen_toks: 10}}}}
  - {{name: piqa, limit: 2}}
batch_size: 1
data: offline
output: {output}
{placement}
"""
ON_NODE_A, ON_NODE_B, HALF_A_REPLICA = (", resources: {node_a: 1}", ", resources: {node_b: 1}",
                                        ", num_cpus: 1, resources: {replica_slot: 0.5}")


@pytest.fixture
def two_nodes(monkeypatch):
    """A head node {CPU 1, node_a, replica_slot 1} and a second node {CPU 1, node_b, replica_slot 1}, both on
    127.0.0.1, in a temporary RAY_TMPDIR (short: Ray's socket paths must fit 107 bytes)."""
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    scratch = tempfile.mkdtemp(prefix="rn", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", scratch)
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a process's own address: 127.0.0.1 (not the LAN's)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # `auto` would take a token file of this machine as the cluster's
    loopback = {"node_ip_address": "127.0.0.1", "num_cpus": 1}
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={
        **loopback, "include_dashboard": False, "resources": {"node_a": 1, "replica_slot": 1}})
    cluster.add_node(**loopback, resources={"node_b": 1, "replica_slot": 1})
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        cluster.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)


def run_elsewhere(recipe: Path) -> None:
    """``ensbench run`` in a process of its own (a driver joining the cluster, as on one of its machines)."""
    done = subprocess.run([sys.executable, "-m", "ensemble_bench.cli", "run", str(recipe)], capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]


def write(tmp_path: Path, name: str, dirs, placement: str = "", first: str = "", second: str = "") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(RECIPE.format(bpe=dirs[0], sp=dirs[1], first=first, second=second, placement=placement,
                                  output=tmp_path / name))
    return path


def gac_row(tmp_path: Path, name: str) -> Path:
    [run_dir] = (tmp_path / name / "two-nodes").iterdir()
    return run_dir / "gac"


def row_files(row: Path) -> dict:
    """The row's samples (doc ids and responses) and results, over every task (without times and dates)."""
    found = {}
    for path in sorted(row.glob("samples_*.jsonl")):
        found[path.name.split("_")[1]] = [(r["doc_id"], r["resps"]) for r in map(json.loads, path.open())]
    for path in row.glob("results_*.json"):
        found.update(json.loads(path.read_text())["results"])
    return found


def actor_nodes(cluster) -> dict[str, list[str]]:
    """Class name -> the node ids its actors ran on (dead ones included), from the cluster's GCS."""
    nodes: dict[str, list[str]] = {}
    for actor in cluster.global_state.actor_table(None).values():
        nodes.setdefault(actor["ActorClassName"].rsplit(".", 1)[-1], []).append(actor["Address"]["NodeID"])
    return nodes


def listening(pids: set[int]) -> set[str]:
    """The local addresses (hex, as /proc/net shows them) of the TCP sockets these processes listen on."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:  # a process that ended meanwhile
            continue
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.add(fields[1].rsplit(":", 1)[0])
    return found


LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1


def cluster_processes(cluster) -> set[int]:
    import psutil

    pids = set()
    for node in [cluster.head_node, *cluster.worker_nodes]:
        for infos in node.all_processes.values():
            for info in infos:
                pids.add(info.process.pid)
                pids.update(child.pid for child in psutil.Process(info.process.pid).children(recursive=True))
    return pids


@pytest.mark.slow
def test_members_and_replicas_on_two_nodes_give_one_processs_outputs(two_nodes, tiny_dirs, tmp_path, monkeypatch,
                                                                      capsys):
    head, other = (node["NodeID"] for node in two_nodes.global_state.node_table())
    port = two_nodes.gcs_address.rsplit(":", 1)[1]
    code, out = run_cli(monkeypatch, capsys, "run", str(write(tmp_path, "one", tiny_dirs)))
    assert code == 0, out.err
    expected = row_files(gac_row(tmp_path, "one"))

    # each member in its own actor, one per node, joined by `address: auto`
    run_elsewhere(write(tmp_path, "members", tiny_dirs, "placement: {kind: ray, address: auto}",
                        ON_NODE_A, ON_NODE_B))
    assert row_files(gac_row(tmp_path, "members")) == expected
    assert sorted(actor_nodes(two_nodes)["_PlacedServer"]) == sorted([head, other])

    # two replicas of the whole ensemble, one per node, joined by the cluster's address
    run_elsewhere(write(tmp_path, "replicas", tiny_dirs,
                        f"placement: {{kind: ray, address: '127.0.0.1:{port}', replicas: 2}}",
                        HALF_A_REPLICA, HALF_A_REPLICA))
    assert row_files(gac_row(tmp_path, "replicas")) == expected
    assert sorted(actor_nodes(two_nodes)["ReplicaServer"]) == sorted([head, other])

    addresses = listening(cluster_processes(two_nodes))
    assert addresses and addresses <= LOOPBACK, addresses
