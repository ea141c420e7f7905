"""The one load-or-build convention of the vocabulary maps (vocab/cache.py): the key from the inputs'
fingerprints and a format version, plain tensors read with weights_only, a rebuild for any file that
cannot be read or does not fit. The union, EVA and MinED caches use it (tests/vocab/test_union_cache.py,
tests/methods/test_eva.py, tests/methods/test_packllm.py, tests/run/test_cache_integrity.py)."""

from __future__ import annotations

import pytest
import torch

from ensemble_bench.vocab import eva_cache, mined, union_cache
from ensemble_bench.vocab.cache import MapFormat, load_or_build, map_path


def ids_format() -> MapFormat:
    """A map of token ids stored as {"ids": long tensor}."""
    def read(saved):
        if not isinstance(saved, dict) or saved.get("ids") is None or saved["ids"].dtype != torch.long:
            raise ValueError("not the ids")
        return saved["ids"]
    return MapFormat("test map", lambda ids: {"ids": ids}, read)


def test_the_key_is_the_kind_the_version_and_every_fingerprint(tmp_path):
    path = map_path(tmp_path, "kind", "v1", ["a", "b"])
    assert path.parent == tmp_path and path.name.startswith("kind-") and path.suffix == ".pt"
    others = [map_path(tmp_path, "kind", "v2", ["a", "b"]), map_path(tmp_path, "kind", "v1", ["a", "c"]),
              map_path(tmp_path, "kind", "v1", ["b", "a"])]
    assert path not in others and len(set(others)) == 3


def test_built_once_then_read_back(tmp_path):
    builds: list = []
    path = tmp_path / "maps" / "m.pt"
    build = lambda: builds.append(1) or torch.arange(5)  # noqa: E731
    assert load_or_build(path, ids_format(), build).tolist() == [0, 1, 2, 3, 4]
    assert load_or_build(path, ids_format(), build).tolist() == [0, 1, 2, 3, 4]
    assert len(builds) == 1 and [p.name for p in path.parent.iterdir()] == ["m.pt"]  # no partial file left


class Evil:
    def __reduce__(self):
        return (print, ("pickled code ran",))


@pytest.mark.parametrize("content", [b"", b"not a torch file", "pickle", "other tensors"])
def test_an_unreadable_or_unfitting_file_is_rebuilt_with_a_warning(tmp_path, caplog, capsys, content):
    path = tmp_path / "m.pt"
    if content == "pickle":
        torch.save({"ids": Evil()}, path)  # weights_only refuses it: nothing runs
    elif content == "other tensors":
        torch.save({"ids": torch.zeros(3)}, path)  # float, not ids
    else:
        path.write_bytes(content)
    builds: list = []
    assert load_or_build(path, ids_format(), lambda: builds.append(1) or torch.arange(3)).tolist() == [0, 1, 2]
    assert builds == [1] and "damaged test map cache" in caplog.text
    assert "pickled code ran" not in capsys.readouterr().out
    assert torch.load(path, weights_only=True)["ids"].tolist() == [0, 1, 2]


def test_the_union_eva_and_mined_caches_follow_it():
    """Each map's module keys and reads its files through vocab/cache.py, with a version of its own."""
    for module in (union_cache, eva_cache, mined):
        assert module.load_or_build is load_or_build and module.map_path is map_path
    assert len({union_cache.VERSION, eva_cache.VERSION, mined.VERSION}) == 3
