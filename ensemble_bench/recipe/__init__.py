"""Recipes: reading one (load), its schema and plan (schema), its error lines (lines, field_names) and
``--set`` overrides (overrides). The rest of the package imports a recipe's names from here."""

from ensemble_bench.recipe.lines import is_safe_label
from ensemble_bench.recipe.load import load_recipe, parse_recipe, task_problems
from ensemble_bench.recipe.schema import (
    LIMIT_MAX,
    SEED_MAX,
    STRICT,
    MemberSpec,
    MethodSpec,
    PlacementSpec,
    Recipe,
    Row,
    TaskSpec,
    plan_rows,
    selected_benchmarks,
    validate_method,
)
from ensemble_bench.yaml_limits import MAX_RECIPE_BYTES, MAX_YAML_DEPTH

__all__ = ["LIMIT_MAX", "MAX_RECIPE_BYTES", "MAX_YAML_DEPTH", "SEED_MAX", "STRICT", "MemberSpec", "MethodSpec",
           "PlacementSpec", "Recipe", "Row", "TaskSpec", "is_safe_label", "load_recipe", "parse_recipe", "plan_rows",
           "selected_benchmarks", "task_problems", "validate_method"]
