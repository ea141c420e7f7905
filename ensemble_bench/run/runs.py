"""A recipe's runs under its output folder: the unfinished one to resume, a new run folder's name, the
newest finished one; a run counts as the recipe's only if its recipe.yaml is this recipe and its rows
used the method parameters this code resolves (``params.json``)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import yaml

from ensemble_bench.errors import UserError
from ensemble_bench.methods import current_params
from ensemble_bench.recipe import Recipe, parse_recipe
from ensemble_bench.run.folder import PARAMS, RECIPE, is_finished, output_root, parse_json

log = logging.getLogger(__name__)


def _runs_of(recipe: Recipe, passed: list[tuple[Path, str]] | None = None) -> list[Path]:
    """Run folders of this exact recipe, oldest first; judged by the recipe each folder holds, so
    runs stay findable when the fingerprint's own definition changes. A run whose rows were
    computed with other method parameters than this code gives the recipe (a default changed
    since) is not this recipe's run: it is neither resumed nor reused. Each folder passed over is
    added to ``passed`` with the reason, in a few words."""
    base = output_root(recipe) / recipe.name
    fingerprint = recipe.fingerprint()
    found: list[Path] = []
    passed = [] if passed is None else passed
    for folder in sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []:
        try:
            held = parse_recipe(yaml.safe_load((folder / RECIPE).read_text()), str(folder))
        except (OSError, UserError, yaml.YAMLError) as err:
            why = str(err).splitlines()[0] if str(err).strip() else type(err).__name__
            passed.append((folder, f"its recipe.yaml cannot be read ({why})"))
            continue
        if held.model_copy(update={"output": recipe.output}).fingerprint() != fingerprint:
            passed.append((folder, "it ran another version of this recipe"))
        elif not same_params(folder, recipe):
            passed.append((folder, "its rows used other method parameters than this code gives the recipe "
                                   "(a default changed since)"))
        else:
            found.append(folder)
    return found


def resolved_params(recipe: Recipe) -> dict[str, dict]:
    """Every row's method parameters with the defaults of this code filled in (the recipe's
    fingerprint leaves defaults out, so that adding a field keeps old runs resumable)."""
    return {row.label: row.params.model_dump(mode="json") for row in recipe.plan}


def params_damage(folder: Path) -> str | None:
    """Why a run folder's PARAMS cannot be read (cut short, not JSON, not a mapping), or None (sound or absent)."""
    try:
        held = parse_json(folder / PARAMS)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        return f"{PARAMS} is damaged ({type(err).__name__})"
    return None if isinstance(held, dict) else f"{PARAMS} is damaged (not a JSON object)"


def same_params(folder: Path, recipe: Recipe) -> bool:
    """Whether a run folder's rows used the parameters this code resolves; runs written before
    PARAMS existed have none to compare and count as the same, and so does a damaged PARAMS (its
    recipe.yaml is this recipe: the run resumes, says so, and writes the file again)."""
    if params_damage(folder) is not None:
        return True
    try:
        held = parse_json(folder / PARAMS)
    except FileNotFoundError:
        return True
    method_of = {row.label: row.method for row in recipe.plan}  # stored names read as this code's (lead)
    held = {label: current_params(method_of.get(label, ""), p) if isinstance(p, dict) else p
            for label, p in held.items()} if isinstance(held, dict) else held
    return held == resolved_params(recipe)


def run_dir_of(recipe: Recipe, fresh: bool) -> tuple[Path, bool]:
    """The unfinished run of this exact recipe to resume, or a new run directory's name; whether resumed."""
    passed: list[tuple[Path, str]] = []
    unfinished = _unfinished_runs(recipe, passed)
    if unfinished and not fresh:
        return unfinished[-1], True
    for folder, why in passed if not fresh else []:  # never passed over silently
        log.warning("%s: unfinished run not resumed: %s; a new run starts", folder, why)
    return _new_run_dir(recipe), False


def _unfinished_runs(recipe: Recipe, passed: list[tuple[Path, str]]) -> list[Path]:
    """The unfinished runs of this exact recipe, oldest first; the unfinished folders of the recipe's
    name that are not its runs are added to ``passed`` with the reason."""
    found: list[tuple[Path, str]] = []
    runs = [p for p in _runs_of(recipe, found) if not is_finished(p)]
    passed += [(folder, why) for folder, why in found if not is_finished(folder)]
    return runs


def planned_run_dir(recipe: Recipe, fresh: bool = False) -> tuple[Path, bool]:
    """Where a run of the recipe will write, for its plan: the unfinished run it resumes (True), or
    its new folder (False; named by the second the run starts, shown as <date>-<time>)."""
    unfinished = _unfinished_runs(recipe, [])
    if unfinished and not fresh:
        return unfinished[-1], True
    return output_root(recipe).resolve() / recipe.name / f"<date>-<time>-{recipe.fingerprint()}", False


def _new_run_dir(recipe: Recipe) -> Path:
    """A name for a new run folder: the time (to the second) and the fingerprint, with -02, -03, ...
    when a run of the same second has it. Chosen under the recipe's run lock, so no other run of
    this name and fingerprint can take it before it is created; the names still sort oldest first."""
    base = output_root(recipe) / recipe.name
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{recipe.fingerprint()}"
    number = 1
    while (base / (name := stem if number == 1 else f"{stem}-{number:02d}")).exists():
        number += 1
    return base / name


def finished_run(recipe: Recipe) -> Path | None:
    """The newest finished run of this exact recipe, if any."""
    done = [p for p in _runs_of(recipe) if is_finished(p)]
    return done[-1] if done else None
