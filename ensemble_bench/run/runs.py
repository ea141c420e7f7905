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
from ensemble_bench.run.folder import PARAMS, RECIPE, is_finished, parse_json

log = logging.getLogger(__name__)


def _runs_of(recipe: Recipe, root: Path, passed: list[tuple[Path, str]] | None = None) -> list[Path]:
    """Run folders of this exact recipe under the output folder ``root``, oldest first; judged by the recipe
    each folder holds, so
    runs stay findable when the fingerprint's own definition changes. A run whose rows were
    computed with other method parameters than this code gives the recipe (a default changed
    since) is not this recipe's run: it is neither resumed nor reused. Each folder passed over is
    added to ``passed`` with the reason, in a few words."""
    base = root / recipe.name
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


def run_dir_of(recipe: Recipe, root: Path, fresh: bool) -> tuple[Path, bool]:
    """The unfinished run of this exact recipe to resume, or a new run directory's name; whether resumed.
    Every unfinished folder of the recipe's name passed over is logged with the reason."""
    passed: list[tuple[Path, str]] = []
    resumed = None if fresh else resumed_run(recipe, root, passed)
    if resumed is not None:
        return resumed, True
    for folder, why in passed:  # never passed over silently
        log.warning("%s: unfinished run not resumed: %s; a new run starts", folder, why)
    return _new_run_dir(recipe, root), False


def resumed_run(recipe: Recipe, root: Path, passed: list[tuple[Path, str]] | None = None) -> Path | None:
    """The newest unfinished run of this exact recipe (the one a run resumes), or None; the unfinished
    folders of the recipe's name that are not its runs are added to ``passed`` with the reason."""
    found: list[tuple[Path, str]] = []
    runs = [p for p in _runs_of(recipe, root, found) if not is_finished(p)]
    if passed is not None:
        passed += [(folder, why) for folder, why in found if not is_finished(folder)]
    return runs[-1] if runs else None


def _new_run_dir(recipe: Recipe, root: Path) -> Path:
    """A name for a new run folder: the time (to the second) and the fingerprint, with -02, -03, ...
    when a run of the same second has it. Chosen under the recipe's run lock, so no other run of
    this name and fingerprint can take it before it is created; the names still sort oldest first."""
    base = root / recipe.name
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{recipe.fingerprint()}"
    number = 1
    while (base / (name := stem if number == 1 else f"{stem}-{number:02d}")).exists():
        number += 1
    return base / name


def finished_run(recipe: Recipe, root: Path) -> Path | None:
    """The newest finished run of this exact recipe under the output folder ``root``, if any."""
    done = [p for p in _runs_of(recipe, root) if is_finished(p)]
    return done[-1] if done else None
