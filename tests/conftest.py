import os

import pytest
import torch

import tests.environment  # noqa: F401  (pins the environment the tests expect, before any test module loads)

torch.set_num_threads(1)

from tests.tiny import byte_bpe_tokenizer, sentencepiece_tokenizer, tiny_llama  # noqa: E402


@pytest.fixture(scope="session")
def bpe_tokenizer():
    return byte_bpe_tokenizer()


@pytest.fixture(scope="session")
def sp_tokenizer():
    return sentencepiece_tokenizer()


@pytest.fixture(scope="session")
def bpe_model(bpe_tokenizer):
    return tiny_llama(len(bpe_tokenizer), seed=1)


@pytest.fixture(scope="session")
def sp_model(sp_tokenizer):
    return tiny_llama(len(sp_tokenizer), seed=2)


@pytest.fixture(scope="session")
def offline_data():
    """The offline benchmark copies (built once, cached under $ENSBENCH_CACHE)."""
    from ensemble_bench.tasks import get_benchmark
    from ensemble_bench.tasks.offline import ensure_offline_data

    return ensure_offline_data([get_benchmark("piqa"), get_benchmark("gsm8k")])


@pytest.fixture(scope="session")
def pair(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    """Makes the two tiny members with different tokenizers, fresh on every call: byte-level BPE ("a"
    unless named) first, SentencePiece ("b") second."""
    from ensemble_bench.members import LocalMember

    def make(first: str = "a", second: str = "b") -> list:
        return [LocalMember(bpe_model, bpe_tokenizer, first), LocalMember(sp_model, sp_tokenizer, second)]
    return make


@pytest.fixture(params=["bpe", "sp"])
def same_model(request):
    """Makes members over one tiny model (byte-level BPE, then SentencePiece) by name."""
    from ensemble_bench.members import LocalMember

    tokenizer = request.getfixturevalue(f"{request.param}_tokenizer")
    model = request.getfixturevalue(f"{request.param}_model")
    return lambda name: LocalMember(model, tokenizer, name)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """Two tiny models with different tokenizers, saved as ordinary local model directories."""
    dirs = []
    for name, tokenizer in (("tiny-bpe", byte_bpe_tokenizer()), ("tiny-sp", sentencepiece_tokenizer())):
        path = tmp_path_factory.mktemp(name)
        tiny_llama(len(tokenizer), seed=len(dirs) + 1).save_pretrained(path)
        tokenizer.save_pretrained(path)
        dirs.append(str(path))
    return dirs


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster on the CPU for the session (4 logical CPUs, no dashboard); skips without ray.
    Four, not the machine's 2: ``ray_members``' two actors hold a CPU each for the whole session, and two
    replicas (tests/run/test_replicas.py) must still be placed beside them."""
    import logging

    ray = pytest.importorskip("ray")
    from ensemble_bench.members.remote import LOCAL_SYSTEM_CONFIG  # as connect() starts Ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
             _system_config=LOCAL_SYSTEM_CONFIG)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def ray_members(ray_cluster, tiny_dirs):
    """(local members, the same members in Ray actors) over the two ``tiny_dirs`` models."""
    from ensemble_bench.members import load_member
    from ensemble_bench.members.remote import RemoteMember, launch

    loads = [{"model": path, "name": name} for path, name in zip(tiny_dirs, ("bpe", "sp"))]
    actors = [launch(load, {"num_cpus": 1}) for load in loads]  # both load side by side
    remote = [RemoteMember(load, actor=actor) for load, actor in zip(loads, actors)]
    yield [load_member(**load) for load in loads], remote
    for member in remote:
        member.close()


def pytest_collection_modifyitems(config, items):
    """``long`` tests (minutes each here) run only with ENSBENCH_LONG_TESTS=1 (``make test-long``)."""
    if os.environ.get("ENSBENCH_LONG_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="a long test: make test-long runs it (ENSBENCH_LONG_TESTS=1)")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)
