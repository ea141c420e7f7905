"""The benchmarks a recipe can name, and the lm-eval task or group that scores each one.

A recipe names a benchmark (``gsm8k``) and optionally a variant (``mmlu`` / ``loglikelihood``);
:func:`get_benchmark` turns that into a :class:`Benchmark`, which keeps lm-eval's own task name,
shot count and primary metric key (``"<metric>,<filter>"`` as it appears in lm-eval's results).
Local data and task configs are handled by :mod:`ensemble_bench.tasks.offline`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ensemble_bench.errors import UserError

DEFAULT_VARIANT = "default"

_FLORES_NOTE = (
    "offline data is ensemble-bench's own 30-sentence parallel fixture, NOT Flores (its scores only "
    "show that the translation path works); data: hub reads facebook/flores devtest (1012 sentences)"
)
# Flores directions (tasks/flores.py): the variant is the paper's version, the default Flores-101
_FLORES_DIRECTIONS = ("en-de", "de-en", "en-ro", "ro-en")
_TRIVIAQA_NOTE = (
    "offline TriviaQA is rc.wikipedia.nocontext validation (7993 questions), a subset of the "
    "rc.nocontext validation set (17944) that lm-eval scores; scores are not comparable to published ones"
)


@dataclass(frozen=True)
class Benchmark:
    """One benchmark as a recipe names it, and how lm-eval scores it.

    ``task`` is the lm-eval task or group name; ``offline`` says whether local data can be built
    without the model hub; ``needs`` is one line naming what is missing before it can run
    (None when runnable); ``note`` is a caveat to print beside its scores. ``is_group`` says
    whether ``task`` is an lm-eval group (True) or a single task.
    """

    name: str
    variant: str
    task: str
    default_shots: int
    primary_metric: str
    offline: bool
    needs: str | None = None
    note: str | None = None
    is_group: bool = False
    runs_code: bool = False  # scored by running generated programs: needs the recipe's opt-in


_BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("mmlu", "generative", "mmlu_flan_n_shot_generative", 5,
              "exact_match,flexible-extract", offline=True, is_group=True),
    Benchmark("mmlu", "loglikelihood", "mmlu", 5, "acc,none", offline=True, is_group=True),
    Benchmark("gsm8k", DEFAULT_VARIANT, "gsm8k", 5, "exact_match,flexible-extract", offline=True),
    Benchmark("bbh", DEFAULT_VARIANT, "bbh_cot_fewshot", 3, "exact_match,get-answer",
              offline=True, is_group=True),
    Benchmark("triviaqa", DEFAULT_VARIANT, "triviaqa", 5, "exact_match,remove_whitespace",
              offline=True, note=_TRIVIAQA_NOTE),
    Benchmark("nq", DEFAULT_VARIANT, "nq_open", 5, "exact_match,remove_whitespace", offline=True),
    Benchmark("piqa", DEFAULT_VARIANT, "piqa", 0, "acc,none", offline=True),
    Benchmark("arc_c", DEFAULT_VARIANT, "arc_challenge", 0, "acc,none", offline=True),
    Benchmark("mbpp", DEFAULT_VARIANT, "mbpp", 3, "pass_at_1,none", offline=True, runs_code=True),
    Benchmark("humaneval", DEFAULT_VARIANT, "humaneval", 0, "pass_at_k,create_test", offline=True,
              runs_code=True),
    *(Benchmark(f"flores_{direction}", version, f"{version}_{direction}", 4, "bleu,none", offline=True,
                note=_FLORES_NOTE)
      for direction in _FLORES_DIRECTIONS for version in ("flores101", "flores200")),
)

# The variant used when a recipe names none; benchmarks not listed have only DEFAULT_VARIANT.
_DEFAULT_VARIANTS = {"mmlu": "generative", **{f"flores_{d}": "flores101" for d in _FLORES_DIRECTIONS}}


def _registry() -> dict[str, dict[str, Benchmark]]:
    """Benchmarks by name, then by variant."""
    table: dict[str, dict[str, Benchmark]] = {}
    for bench in _BENCHMARKS:
        table.setdefault(bench.name, {})[bench.variant] = bench
    return table


REGISTRY: dict[str, dict[str, Benchmark]] = _registry()


def get_benchmark(name: str, variant: str | None = None) -> Benchmark:
    """The benchmark ``name`` in ``variant`` (None: its default variant); UserError if unknown."""
    variants = REGISTRY.get(name)
    if variants is None:
        raise UserError(f"unknown benchmark {name!r} (known: {', '.join(sorted(REGISTRY))})")
    chosen = variant if variant is not None else _DEFAULT_VARIANTS.get(name, DEFAULT_VARIANT)
    if chosen not in variants:
        raise UserError(
            f"benchmark {name!r} has no variant {chosen!r} (variants: {', '.join(sorted(variants))})"
        )
    return variants[chosen]


def list_benchmarks() -> list[Benchmark]:
    """Every registered benchmark and variant, sorted by name then variant."""
    return sorted(_BENCHMARKS, key=lambda bench: (bench.name, bench.variant))


__all__ = ["DEFAULT_VARIANT", "REGISTRY", "Benchmark", "get_benchmark", "list_benchmarks"]
