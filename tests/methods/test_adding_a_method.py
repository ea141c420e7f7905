"""Adding a method is one module, one registry line and one contract entry: the example of
docs/adding_a_method.md, taken from the page itself, is registered here and then runs from a
recipe and through the lm-eval adapter."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from ensemble_bench.decoding.speculation_stats import SteadyCosts, SteadyPace
from ensemble_bench.members import LocalMember
from ensemble_bench.methods import METHODS, get_method, register_method
from ensemble_bench.methods.single import Single
from tests.cli_helpers import run_cli
from tests.tiny import REQUESTS, outputs

pytestmark = pytest.mark.usefixtures("offline_data")
PAGE = Path(__file__).resolve().parents[2] / "docs" / "adding_a_method.md"


def example_module(folder: Path, monkeypatch):
    """The page's module (its first python block), written to ``folder`` and imported."""
    code = re.search(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S).group(1)
    path = folder / "shortest.py"
    path.write_text(code, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("shortest_example", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # pydantic resolves the annotations there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def shortest(tmp_path, monkeypatch):
    """The example method, registered for one test (the registry line), then removed."""
    cls = register_method(example_module(tmp_path, monkeypatch).Shortest)
    yield cls
    METHODS.pop(cls.name)
    if (lm := sys.modules.get("ensemble_bench.run.lm")) is not None:  # its lm-eval model goes with it
        lm.LM_CLASSES.pop(cls.name, None)


def test_the_registry_line_makes_the_method_and_its_lm_eval_model(shortest):
    import ensemble_bench.run.lm as lm

    assert get_method("shortest") is shortest and lm.LM_CLASSES["shortest"] is lm.ShortestLM
    assert lm.ShortestLM.method_name == "shortest" and "shortest" in list(lm.LM_CLASSES)
    with pytest.raises(ValueError, match="already registered"):
        register_method(type("Other", (shortest,), {}))


def test_the_contract_guard_wants_its_entry(shortest, monkeypatch):
    contract = pytest.importorskip("tests.methods.test_method_contract")
    with pytest.raises(AssertionError):
        contract.test_every_registered_method_has_a_contract_entry()
    monkeypatch.setitem(contract.CONTRACT_PARAMS, "shortest", [{}, {"count": "words", "lead": 1}])
    monkeypatch.setitem(contract.SCORING_IDENTITY, "shortest", "choice")
    contract.test_every_registered_method_has_a_contract_entry()


def test_a_member_with_itself_is_the_member_alone(shortest, bpe_model, bpe_tokenizer):
    twins = [LocalMember(bpe_model, bpe_tokenizer, name) for name in ("a", "b")]
    alone = outputs(Single(twins[:1], Single.Params(), batch_size=2))
    assert outputs(shortest(twins, shortest.Params.model_validate({"main": "b"}), batch_size=2)) == alone


@pytest.mark.slow
def test_it_runs_from_a_recipe(shortest, tiny_dirs, tmp_path, monkeypatch, capsys):
    recipe = {"name": "toy", "members": [{"model": tiny_dirs[0], "name": "bpe"}, {"model": tiny_dirs[1], "name": "sp"}],
              "method": {"name": "shortest", "main": "sp", "count": "words"},
              "tasks": [{"name": "gsm8k", "shots": 1, "limit": 1}, {"name": "piqa", "limit": 2}],
              "data": "offline", "output": str(tmp_path / "results")}
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(recipe))
    code, out = run_cli(monkeypatch, capsys, "run", str(path))
    assert code == 0, out.err
    [run_dir] = (tmp_path / "results" / "toy").iterdir()
    timing = json.loads((run_dir / "shortest" / "timing.json").read_text())
    assert timing["method"] == "shortest" and timing["params"] == {"lead": "sp", "count": "words"}
    assert timing["shortest"]["lead_index"] == 1 and timing["tokens_generated"] > 0


def test_it_runs_through_the_lm_eval_adapter(shortest, tiny_dirs):
    from lm_eval.api.instance import Instance
    from lm_eval.api.registry import get_model

    from ensemble_bench.run.lm import register_all

    register_all()
    args = {"members": [{"model": tiny_dirs[0], "name": "a"}, {"model": tiny_dirs[1], "name": "b"}],
            "method": {"name": "shortest", "lead": "b"}}
    lm = get_model("shortest").create_from_arg_string(json.dumps(args), {"batch_size": 2})
    assert lm.method.name == "shortest" and lm.method.lead == 1
    request = Instance(request_type="generate_until", doc={}, idx=0,
                       arguments=(REQUESTS[0].prompt.text, {"until": ["\n"], "max_gen_toks": 4}))
    [answer] = lm.generate_until([request])
    assert isinstance(answer, str) and lm.get_model_info()["ensbench"]["method"] == "shortest"


def token_level_example(folder: Path, monkeypatch):
    """The page's second module (section 5: a token-level method that decodes speculatively)."""
    code = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)[-1]
    path = folder / "confident.py"
    path.write_text(code, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("confident_example", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_the_token_level_example_decodes_speculatively_with_its_every_token_outputs(
        tmp_path, monkeypatch, bpe_model, bpe_tokenizer, sp_model, sp_tokenizer):
    from ensemble_bench.decoding.speculative import Speculable

    cls = register_method(token_level_example(tmp_path, monkeypatch).Confident)
    try:
        members = [LocalMember(bpe_model, bpe_tokenizer, name="bpe"), LocalMember(sp_model, sp_tokenizer, name="sp")]
        plain = cls(members, cls.Params(), batch_size=2)
        drafted = cls(members, cls.Params(speculative=3, proposer=1), batch_size=2)
        drafted.speculation.costs, drafted.speculation.pace = SteadyCosts(), SteadyPace()  # drafts whatever the load
        assert isinstance(drafted, Speculable) and drafted.speculation is not None
        assert outputs(drafted) == outputs(plain)
        own = drafted.info()[drafted.name]
        assert own["speculative_acceptance_rate"] is not None  # drafts were verified, not skipped
        twins = [LocalMember(bpe_model, bpe_tokenizer, name="a"), LocalMember(bpe_model, bpe_tokenizer, name="b")]
        assert outputs(cls(twins, cls.Params())) == outputs(Single(twins[:1], Single.Params()))
    finally:
        METHODS.pop(cls.name)
        if (lm := sys.modules.get("ensemble_bench.run.lm")) is not None:  # its lm-eval model goes with it
            lm.LM_CLASSES.pop(cls.name, None)
