"""docs/papers.md cites every method's paper: each registered method but the baselines by its `method:`
name, and every arXiv id the method modules cite (issue 47: EVA, CoRE, AdaFuse and LVR were missing)."""

import re
from pathlib import Path

from ensemble_bench.methods import METHODS

ROOT = Path(__file__).resolve().parents[2]
BASELINES = {"single", "voting", "mbr", "rerank"}  # follow the papers' baselines (methods.md says whose)
ARXIV_ID = re.compile(r"\b2\d{3}\.\d{5}\b")


def test_the_papers_page_names_every_method_and_every_arxiv_id_the_methods_cite():
    page = (ROOT / "docs" / "papers.md").read_text(encoding="utf-8")
    named = set(re.findall(r"^\| [^|]*\(`([a-z_]+)`", page, re.MULTILINE))
    assert set(METHODS) - BASELINES <= named, sorted(set(METHODS) - BASELINES - named)
    cited = {match for path in (ROOT / "ensemble_bench" / "methods").glob("*.py")
             for match in ARXIV_ID.findall(path.read_text(encoding="utf-8"))}
    assert cited <= set(ARXIV_ID.findall(page)), sorted(cited - set(ARXIV_ID.findall(page)))
    assert "`core: true`" in page  # CoRE, a plug-in rather than a method
