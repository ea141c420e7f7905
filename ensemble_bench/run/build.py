"""Building a row's model: members (loaded once, shared between rows) and the method over them.

Used by the runner (one method per row of a recipe) and by the lm-eval adapter (``--model_args``
of the stock lm-eval CLI hold a recipe fragment).
"""

from __future__ import annotations

from ensemble_bench.errors import UserError
from ensemble_bench.members import Member, load_member
from ensemble_bench.members.remote import RemoteMember, connect, launch, wait_placed
from ensemble_bench.methods import ALONE, Method, get_method, is_alone
from ensemble_bench.recipe import Recipe, Row, parse_recipe


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
                    self._actors = {i: launch(s.load_kwargs(), s.actor_options())
                                    for i, s in enumerate(self.recipe.members)}
                    members = self.recipe.members
                    wait_placed({members[i].label: a for i, a in self._actors.items()}, placement.schedule_timeout)
                self._loaded[index] = RemoteMember(spec.load_kwargs(), actor=self._actors[index])
            else:
                self._loaded[index] = load_member(**spec.load_kwargs())
        return self._loaded[index]


def build_method(recipe: Recipe, row: Row, pool: MemberPool) -> Method:
    """The method of one planned row, over the pool's members."""
    members = [pool.get(i) for i in row.members]
    return get_method(row.method)(members, row.params, batch_size=recipe.batch_size)


AUTO_BATCH_SIZE = 8  # ``--batch_size auto`` without a batch_size in --model_args (no memory probe)
ONE_ROW_ONLY = ("methods", "sweep", "singles")  # recipe keys that plan several rows


def build_from_model_args(data: dict, method_name: str | None, extra: dict) -> tuple[Recipe, Row]:
    """For the stock lm-eval CLI: ``--model_args`` holds a recipe fragment (members, method, seed,
    sampling, replicas); the recipe it stands for and the row it plans."""
    recipe = recipe_from_model_args(data, method_name, extra)
    return recipe, recipe.plan[-1]


def recipe_from_model_args(data: dict, method_name: str | None, extra: dict) -> Recipe:
    """The one-row recipe a ``--model_args`` fragment stands for under ``--model method_name``, with
    lm-eval's ``batch_size`` / ``max_batch_size`` / ``device`` (``extra``) applied: the method is the
    model's (a different ``method`` is refused), members without a device of their own go on
    ``device``, and the batch size is ``batch_size_of``'s."""
    data = dict(data)
    several = [key for key in ONE_ROW_ONLY if key in data]
    if several and method_name is not None:
        raise UserError(f"--model_args: '{several[0]}' plans several rows, but lm-eval evaluates one model (--model "
                        f"{method_name}): leave it out, or use ensbench run with a recipe")
    if "replicas" in data:  # short for placement: {kind: ray, replicas: n} (run/replicas.py)
        placement = data.get("placement") if isinstance(data.get("placement"), dict) else {}
        data["placement"] = {"kind": "ray", **placement, "replicas": data.pop("replicas")}
    data.setdefault("name", "cli")
    data.setdefault("tasks", ["piqa"])  # a placeholder: lm-eval's --tasks decide what is evaluated
    data["method"] = method_entry(data.get("method"), method_name)
    data["batch_size"] = batch_size_of(data.get("batch_size"), extra)
    if extra.get("device") is not None and isinstance(data.get("members"), list):
        data["members"] = [_placed(member, extra["device"]) for member in data["members"]]
    recipe = parse_recipe(data, "--model_args")
    if is_alone(recipe.ensembles[0].name) and len(recipe.members) != 1:
        raise UserError(f"--model_args: method '{recipe.ensembles[0].name}' evaluates one member alone, got "
                        f"{len(recipe.members)} members: give one")
    return recipe


def method_entry(given, method_name: str | None):
    """The ``method`` of a --model_args fragment under ``--model method_name``: the model's method,
    with the fragment's parameters; a fragment naming another method is refused."""
    if method_name is None:
        return given if given is not None else ALONE
    named = given if isinstance(given, str) else given.get("name") if isinstance(given, dict) else None
    if named is not None and named != method_name:
        raise UserError(f"--model {method_name} but --model_args names method '{named}': the model is the method "
                        f"(use --model {named}, or leave the name out of --model_args)")
    return {**given, "name": method_name} if isinstance(given, dict) else method_name


def batch_size_of(given, extra: dict) -> int:
    """The batch size: ``--batch_size N``; ``auto`` (or ``auto:N``) is the fragment's batch_size, else
    AUTO_BATCH_SIZE, at most ``--max_batch_size``. A batch_size in the fragment wins over lm-eval's
    default of 1 (lm-eval passes 1 when --batch_size is not given)."""
    asked = extra.get("batch_size")
    if isinstance(asked, str) and asked.startswith("auto"):
        size = given if given is not None else AUTO_BATCH_SIZE
        most = extra.get("max_batch_size")
        return min(size, most) if isinstance(size, int) and most else size
    if given is not None or asked is None:
        return given if given is not None else 1
    try:
        return int(asked)
    except (TypeError, ValueError):
        raise UserError(f"--batch_size: a whole number, 'auto' or 'auto:N', got {asked!r}") from None


def _placed(member, device: str):
    """A --model_args member on ``device`` unless it names a device or a device_map of its own."""
    if not isinstance(member, dict) or "device" in member or "device_map" in member:
        return member
    return {**member, "device": device}
