"""README, the docs and the recipes call each packaged model by the name `ensbench list` gives it (issue 47:
the README called qwen2.5-0.5b "Qwen2.5-0.5B-Instruct", where it is the Qwen2.5-Coder-0.5B-Instruct
fine-tune): a mention with the model's family, size and a suffix (-Instruct, -Coder, -it) must be its name."""

import re
from pathlib import Path

import pytest

from ensemble_bench.members.sources import PACKAGED

ROOT = Path(__file__).resolve().parents[2]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "recipes").rglob("*.yaml"))]


def suffixed_mentions(name: str) -> re.Pattern:
    """``<family>[-<part>...]-<size>-<suffix>...`` for a listed name such as ``Qwen2.5-Coder-0.5B-Instruct``."""
    size = re.search(r"-(\d+(?:\.\d+)?[MB])\b", name).group(1)
    family = name.split("-")[0]
    return re.compile(rf"\b{re.escape(family)}(?:-[\w.]+?)*-{re.escape(size)}(?:-[A-Za-z]+)+")


NAMES = [model.description.split()[0] for model in PACKAGED.values()]


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_packaged_models_go_by_their_listed_names(path):
    text = path.read_text(encoding="utf-8")
    wrong = {m.group(0) for name in NAMES for m in suffixed_mentions(name).finditer(text) if m.group(0) != name}
    assert not wrong, f"the packaged models are {', '.join(NAMES)} (ensbench list)"


def test_the_check_finds_a_wrong_name():
    assert NAMES[:2] == ["SmolLM2-135M-Instruct", "Qwen2.5-Coder-0.5B-Instruct"]
    assert [m.group(0) for m in suffixed_mentions(NAMES[1]).finditer(
        "Qwen2.5-0.5B-Instruct, Qwen2.5-Coder-0.5B-Instruct and Qwen2.5-0.5B")] == [
        "Qwen2.5-0.5B-Instruct", "Qwen2.5-Coder-0.5B-Instruct"]
