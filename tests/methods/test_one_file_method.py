"""A method added as its own files, and nothing else edited: a temporary package holding a declaration
module (``loudest_params.py``: the Params, the facts, ``@register_method``) and the module doing the work
(``loudest.py``) is found by ``discover`` and is then everywhere the registry reaches: ``ensbench list``,
the docs' parameter tables (docgen), a recipe's validation (the schema), the lm-eval models, and the
contract suite's guard, which asks for its one entry. Validating its recipe imports no implementation."""

import sys
import textwrap

import pytest

from ensemble_bench.cli import docgen
from ensemble_bench.methods import DECLARED, METHODS, describe_params, get_method, method_spec
from ensemble_bench.methods.registry import discover
from ensemble_bench.recipe import parse_recipe
from tests.cli_helpers import run_cli
from tests.toy_packages import forget_package, write_package

DECLARATION = '''\
"""The declaration of ``loudest``: the member whose answer is longest wins."""

from pydantic import Field

from ensemble_bench.methods.registry import register_method
from ensemble_bench.methods.sample_level_params import SampleLevelParams, SampleLevelSpec


class LoudestParams(SampleLevelParams):
    unit: str = Field(default="characters", description="how an answer's length is counted")


@register_method
class LoudestSpec(SampleLevelSpec):
    name = "loudest"
    implementation = "toy_methods.loudest:Loudest"
    Params = LoudestParams
'''
IMPLEMENTATION = '''\
"""``loudest``: every member answers alone; the longest answer wins."""

from ensemble_bench.methods.sample_level import SampleLevel
from toy_methods.loudest_params import LoudestSpec


class Loudest(LoudestSpec, SampleLevel):
    def _choose(self, texts, request):
        return max(range(len(texts)), key=lambda k: len(texts[k]))
'''


@pytest.fixture
def loudest(tmp_path, monkeypatch):
    write_package(tmp_path, monkeypatch, "toy_methods", {"loudest_params": DECLARATION, "loudest": IMPLEMENTATION})
    discover("toy_methods")
    yield DECLARED["loudest"]
    METHODS.pop("loudest")
    if (lm := sys.modules.get("ensemble_bench.run.lm")) is not None:
        lm.LM_CLASSES.pop("loudest", None)
    forget_package("toy_methods", ("loudest", "loudest_params"))


def test_its_declaration_registers_it(loudest):
    assert method_spec("loudest") is loudest and "toy_methods.loudest" not in sys.modules
    assert [p.name for p in describe_params("loudest")] == ["lead", "unit"]


def test_a_recipe_validates_it_without_its_implementation(loudest):
    recipe = parse_recipe({"name": "toy", "members": [{"model": "a", "name": "a"}, {"model": "b", "name": "b"}],
                           "method": {"name": "loudest", "main": "b", "unit": "words"}, "tasks": [{"name": "piqa"}]})
    [row] = recipe.plan
    assert row.method == "loudest" and row.params.unit == "words" and row.params.lead == "b"
    assert "toy_methods.loudest" not in sys.modules
    with pytest.raises(Exception, match="'c' is not a member"):  # its facts are checked: the lead member
        parse_recipe({"name": "toy", "members": [{"model": "a", "name": "a"}, {"model": "b", "name": "b"}],
                      "method": {"name": "loudest", "main": "c"}, "tasks": [{"name": "piqa"}]})


def test_building_it_imports_its_implementation(loudest):
    cls = get_method("loudest")
    assert cls.__module__ == "toy_methods.loudest" and issubclass(cls, loudest) and cls.min_members == 2


def test_list_shows_it(loudest, monkeypatch, capsys):
    code, out = run_cli(monkeypatch, capsys, "list", "--method", "loudest")
    assert code == 0 and "unit" in out.out


def test_the_docs_tables_place_it_by_its_family(loudest):
    assert docgen.families()["sample_level.md"][-1] == "loudest"
    assert "### `loudest`" in docgen.params_tables(docgen.families()["sample_level.md"])
    assert docgen.main(["--check"]) == 1  # its table is not on the page yet: docgen would write it


def test_its_lm_eval_model_is_made(loudest):
    import ensemble_bench.run.lm as lm

    assert lm.LM_CLASSES["loudest"].method_name == "loudest"


def test_the_contract_guard_asks_for_its_entry(loudest, monkeypatch):
    contract = pytest.importorskip("tests.methods.test_method_contract")
    with pytest.raises(AssertionError):
        contract.test_every_registered_method_has_a_contract_entry()
    monkeypatch.setitem(contract.CONTRACT_PARAMS, "loudest", [{}])
    monkeypatch.setitem(contract.SCORING_IDENTITY, "loudest", "choice")
    contract.test_every_registered_method_has_a_contract_entry()


def test_a_declaration_refuses_an_implementation_that_does_not_extend_it(loudest, tmp_path):
    (tmp_path / "toy_methods" / "stray.py").write_text(textwrap.dedent('''\
        from ensemble_bench.methods.single import Single


        class Stray(Single):
            pass
        '''))
    DECLARED["stray"] = type("StraySpec", (loudest,), {"name": "stray", "implementation": "toy_methods.stray:Stray"})
    try:
        with pytest.raises(TypeError, match="does not extend the declaration"):
            get_method("stray")
    finally:
        DECLARED.pop("stray")
        sys.modules.pop("toy_methods.stray", None)
