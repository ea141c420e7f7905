"""Building a row's model: members (loaded once, shared between rows) and the method over them.

Used by the runner (one method per row of a recipe) and by the lm-eval adapter (``--model_args``
of the stock lm-eval CLI hold a recipe fragment).
"""

from __future__ import annotations

from ensemble_bench.members import Member, load_member
from ensemble_bench.members.remote import RemoteMember, connect, launch, wait_placed
from ensemble_bench.methods import Method, MethodParams, get_method
from ensemble_bench.recipe import Recipe, Row, parse_recipe, plan_rows, validate_method


class MemberPool:
    """Loads each recipe member once and shares it between rows."""

    def __init__(self, recipe: Recipe):
        self.recipe = recipe
        self._loaded: dict[int, Member] = {}
        self._actors: dict[int, object] = {}  # placement ray: every member's actor, loading side by side

    def get(self, index: int) -> Member:
        if index not in self._loaded:
            spec = self.recipe.members[index]
            placement = self.recipe.placement
            if placement.kind == "ray":  # the model in a Ray actor; members/remote.py
                connect(placement.address, placement.num_cpus, placement.num_gpus)
                if not self._actors:
                    self._actors = {i: launch(s.load_kwargs(), s.actor_options()) for i, s in enumerate(self.recipe.members)}
                    members = self.recipe.members
                    wait_placed({members[i].label: a for i, a in self._actors.items()}, placement.schedule_timeout)
                self._loaded[index] = RemoteMember(spec.load_kwargs(), actor=self._actors[index])
            else:
                self._loaded[index] = load_member(**spec.load_kwargs())
        return self._loaded[index]


def row_params(recipe: Recipe, row: Row) -> MethodParams:
    """The validated parameters of one planned row, defaults filled in."""
    if row.spec is None:
        return get_method(row.method).Params()
    return validate_method(recipe, recipe.ensembles[row.spec], "recipe", overrides=dict(row.overrides))[1]


def build_method(recipe: Recipe, row: Row, pool: MemberPool) -> Method:
    """The method of one planned row, over the pool's members."""
    members = [pool.get(i) for i in row.members]
    return get_method(row.method)(members, row_params(recipe, row), batch_size=recipe.batch_size)


def build_from_model_args(data: dict, method_name: str | None, extra: dict) -> tuple[Row, Method]:
    """For the stock lm-eval CLI: ``--model_args`` holds a recipe fragment (members, method); the
    row it plans (the last) and its method."""
    data.setdefault("name", "cli")
    data.setdefault("tasks", ["piqa"])
    data.setdefault("method", method_name or "single")
    if extra.get("batch_size") and "batch_size" not in data:
        data["batch_size"] = int(extra["batch_size"])
    recipe = parse_recipe(data, "--model_args")
    row = plan_rows(recipe)[-1]
    return row, build_method(recipe, row, MemberPool(recipe))
