"""A backend added as one module, and nothing else edited: a temporary package holding ``echo_backend.py``
(its recipe section, its loader and ``register_backend``) is found by ``discover`` and is then everywhere
the registry reaches: a recipe's ``backend:`` and its ``echo:`` section (the schema, its error lines),
``ensbench run --dry-run`` (the preflight), the rows' keys, and loading the members (here a stand-in:
a tiny random llama)."""

import pytest

from ensemble_bench.errors import UserError, lines_of
from ensemble_bench.members.backends import DECLARED, backend_spec, discover
from ensemble_bench.recipe import parse_recipe
from ensemble_bench.run.build import MemberPool
from ensemble_bench.run.row_store import _member
from tests.cli_helpers import dry_run
from tests.toy_packages import forget_package, write_package

BACKEND = '''\
"""``echo``: a stand-in engine: a tiny random llama whose weights its section's seed draws."""

from pydantic import BaseModel, ConfigDict, Field

from ensemble_bench.members.backends import Backend, register_backend


class EchoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    seed: int = Field(default=0, ge=0)


def load(model, dtype, device, chat_template, name, trust_remote_code, section, **transformers_settings):
    from ensemble_bench.members.local import LocalMember
    from tests.tiny import byte_bpe_tokenizer, tiny_llama

    tokenizer = byte_bpe_tokenizer()
    return LocalMember(tiny_llama(len(tokenizer), seed=(section or {}).get("seed", 0)), tokenizer, name or model)


register_backend(Backend(name="echo", loader="toy_backends.echo_backend:load", section=EchoArgs,
                         section_holds="stand-in settings", packages={"json": "the standard library"},
                         versions=("pydantic",)))
'''


@pytest.fixture
def echo(tmp_path, monkeypatch):
    write_package(tmp_path, monkeypatch, "toy_backends", {"echo_backend": BACKEND})
    discover("toy_backends")
    yield DECLARED["echo"]
    DECLARED.pop("echo")
    forget_package("toy_backends", ("echo_backend",))


def recipe_data(tmp_path, member, method="single"):
    return {"name": "toy", "members": [member], "method": method, "tasks": [{"name": "piqa", "limit": 2}],
            "data": "offline", "output": str(tmp_path / "out")}


def test_its_module_registers_it(echo):
    assert backend_spec("echo") is echo and echo.section.__name__ == "EchoArgs"


def test_a_recipe_names_it_and_its_section(echo, tmp_path):
    recipe = parse_recipe(recipe_data(tmp_path, {"model": "smollm2-135m", "backend": "echo", "echo": {"seed": 3}}))
    [member] = recipe.members
    assert member.backend == "echo" and member.section.seed == 3
    assert member.load_kwargs()["echo"] == {"seed": 3}


@pytest.mark.parametrize("member, expected", [
    ({"model": "smollm2-135m", "backend": "echo", "echo": {"seed": -1}},
     "r.yaml: members[0].echo.seed: Input should be greater than or equal to 0 (got -1)"),
    ({"model": "smollm2-135m", "backend": "echo", "echo": {"sed": 1}},
     "r.yaml: members[0].echo.sed: unknown field (did you mean 'seed'?)"),
    ({"model": "smollm2-135m", "echo": {"seed": 1}}, "r.yaml: members[0]: echo: stand-in settings need backend: echo"),
    ({"model": "smollm2-135m", "backend": "ech"},
     "r.yaml: members[0].backend: Input should be 'transformers', 'vllm' or 'echo' (got 'ech')"),
])
def test_its_mistakes_are_one_line_each(echo, tmp_path, member, expected):
    with pytest.raises(UserError) as info:
        parse_recipe(recipe_data(tmp_path, member), "r.yaml")
    assert lines_of(info.value) == (expected,)


def test_a_dry_run_validates_it(echo, tmp_path, monkeypatch, capsys):
    import yaml

    text = yaml.safe_dump(recipe_data(tmp_path, {"model": "smollm2-135m", "backend": "echo", "echo": {"seed": 1}}))
    code, out = dry_run(monkeypatch, capsys, tmp_path, text)
    assert code == 0, out.err


def test_a_dry_run_names_the_package_it_needs(echo, tmp_path, monkeypatch, capsys):
    import yaml

    from ensemble_bench.run import preflight

    monkeypatch.setattr(preflight, "_installed", lambda package: package != "json")
    code, out = dry_run(monkeypatch, capsys, tmp_path, yaml.safe_dump(recipe_data(
        tmp_path, {"model": "smollm2-135m", "backend": "echo"})))
    assert code != 0 and "backend: echo needs the json package (the standard library)" in out.err


def test_its_rows_are_keyed_by_it(echo, tmp_path):
    recipe = parse_recipe(recipe_data(tmp_path, {"model": "smollm2-135m", "backend": "echo", "echo": {"seed": 2}}))
    key = _member(recipe.members[0])
    assert key["backend"] == "echo" and key["echo"] == {"seed": 2} and key["engine_version"] == echo.version()
    assert echo.version() is not None  # pydantic's installed version


def test_its_members_load(echo, tmp_path):
    members = [{"model": "smollm2-135m", "name": f"m{seed}", "backend": "echo", "echo": {"seed": seed}}
               for seed in (1, 2)]
    recipe = parse_recipe({**recipe_data(tmp_path, members[0]), "members": members})
    pool = MemberPool(recipe)
    first, second = pool.get(0), pool.get(1)
    assert (first.name, second.name) == ("m1", "m2") and type(first).__name__ == "LocalMember"
    ids = first.tokenizer("a b c")["input_ids"]
    assert not first.prefill([ids]).equal(second.prefill([ids]))  # each loaded with its own section's seed
