"""`ensbench run` end to end on tiny local models and the offline suite: files, table, resume."""

import json
import shutil
import sys
import textwrap

import pytest

from ensemble_bench.cli import main
from tests.tiny import byte_bpe_tokenizer, sentencepiece_tokenizer, tiny_llama

pytestmark = pytest.mark.usefixtures("offline_data")


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """Two tiny models with different tokenizers, saved as ordinary local model directories."""
    dirs = []
    for name, tokenizer in (("tiny-bpe", byte_bpe_tokenizer()), ("tiny-sp", sentencepiece_tokenizer())):
        model = tiny_llama(len(tokenizer), seed=len(dirs) + 1)
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        dirs.append(path)
    return dirs


def recipe_text(dirs, output):
    return textwrap.dedent(f"""\
        name: tiny-run
        members:
          - model: {dirs[0]}
            name: bpe
          - model: {dirs[1]}
            name: sp
        method:
          name: gac
          threshold: 0.6
          gate: bpe
        singles: true
        tasks:
          - name: piqa
            limit: 6
          - name: gsm8k
            shots: 1
            limit: 2
        batch_size: 2
        data: offline
        output: {output}
    """)


def run(monkeypatch, *args):
    monkeypatch.setattr(sys, "argv", ["ensbench", *args])
    try:
        main()
    except SystemExit as exit_info:
        return exit_info.code
    return 0


def samples_of(row_dir):
    found = {}
    for path in sorted(row_dir.glob("samples_*.jsonl")):
        task = path.name.split("_")[1]
        found[task] = [(r["doc_id"], r["filter"], r["resps"]) for r in map(json.loads, path.read_text().splitlines())]
    return found


def test_run_writes_lm_eval_files_and_summary_then_resumes(tiny_dirs, tmp_path, monkeypatch, capsys):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(recipe_text(tiny_dirs, tmp_path / "results"))
    assert run(monkeypatch, "run", str(recipe)) == 0
    [run_dir] = (tmp_path / "results" / "tiny-run").iterdir()
    for row in ("bpe", "sp", "gac"):
        assert list((run_dir / row).glob("results_*.json")) and list((run_dir / row).glob("samples_piqa_*.jsonl"))
        timing = json.loads((run_dir / row / "timing.json").read_text())
        assert timing["tokens_generated"] > 0 and timing["decode_ms_per_token"] > 0
    summary = (run_dir / "summary.md").read_text()
    assert "| bpe" in summary and "| sp" in summary and "| gac" in summary and "piqa" in summary
    results = json.loads(next((run_dir / "bpe").glob("results_*.json")).read_text())
    assert results["config"]["ensbench"]["method"] == "single"
    gac = json.loads(next((run_dir / "gac").glob("results_*.json")).read_text())["config"]["ensbench"]
    assert gac["method"] == "gac" and 0 < gac["ensembled_fraction"] <= 1 and gac["union_size"] > 400
    first = {row: samples_of(run_dir / row) for row in ("bpe", "sp", "gac")}
    assert len({doc for doc, _, _ in first["bpe"]["piqa"]}) == 6
    assert len({doc for doc, _, _ in first["bpe"]["gsm8k"]}) == 2

    # an interrupted run: the second and third rows never finished and no summary was written
    shutil.rmtree(run_dir / "sp")
    shutil.rmtree(run_dir / "gac")
    (run_dir / "summary.md").unlink()
    capsys.readouterr()
    assert run(monkeypatch, "run", str(recipe)) == 0
    assert [p.name for p in (tmp_path / "results" / "tiny-run").iterdir()] == [run_dir.name]
    assert "kept" in capsys.readouterr().out
    for row in ("sp", "gac"):
        timing = json.loads((run_dir / row / "timing.json").read_text())
        assert timing["tokens_generated"] == 0  # every answer came from the response cache
    assert {row: samples_of(run_dir / row) for row in ("bpe", "sp", "gac")} == first

    # a fresh run of the same recipe: a new directory, identical answers and scores
    assert run(monkeypatch, "run", str(recipe), "--fresh") == 0
    runs = sorted((tmp_path / "results" / "tiny-run").iterdir())
    assert len(runs) == 2
    assert {row: samples_of(runs[1] / row) for row in ("bpe", "sp", "gac")} == first
    scores = [(r / "summary.csv").read_text().split("ms/token")[0] for r in runs]
    assert scores[0] == scores[1]
