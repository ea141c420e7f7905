"""The benchmarks a recipe can name, and the lm-eval task or group that scores each one.

A recipe names a built-in benchmark (``gsm8k``) and optionally a variant (``mmlu`` / ``loglikelihood``);
:func:`get_benchmark` turns that into a :class:`Benchmark`, which keeps lm-eval's own task name,
shot count and primary metric key (``"<metric>,<filter>"`` as it appears in lm-eval's results).
lm-eval's own name of a built-in benchmark's task (``arc_challenge``, ``nq_open``) names that
benchmark too. Any other lm-eval task or group is resolved by :mod:`ensemble_bench.tasks.lm_eval_tasks`.
Local data and task configs are handled by :mod:`ensemble_bench.tasks.offline`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ensemble_bench.errors import UserError
from ensemble_bench.tasks.flores import FIXTURE_SHOTS as FLORES_FIXTURE_SHOTS

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

    ``offline_shots`` / ``hub_shots``: the most shots the benchmark's few-shot pool allows with
    ``data: offline`` / ``data: hub`` (None: not known). lm-eval draws the shots from the pool and,
    when the pool is the scored split, draws one more to drop the scored document: asking for more
    ends in ``Sample larger than population`` after the members are loaded. Pools per task of a
    group (MMLU: 5 dev questions per subject; BBH: 3 chain-of-thought examples per task).
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
    offline_shots: int | None = None
    hub_shots: int | None = None
    builtin: bool = True  # False: any other lm-eval task, run on its own data as lm-eval defines it
    pass_k: int | None = None  # reports pass@k from its samples: needs that many repeats at least

    def max_shots(self, data: str) -> int | None:
        """The most shots its few-shot pool allows under ``data`` ("offline" / "hub"; None: not known)."""
        return self.offline_shots if data == "offline" else self.hub_shots


# Few-shot pools (offline: tasks/offline_data.py and task_configs.offline_overrides; hub: lm-eval 0.4.13's
# stock task YAMLs). Offline copies without a train split draw shots from the scored split, the
# scored document excluded: its size minus one.
_BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("mmlu", "generative", "mmlu_flan_n_shot_generative", 5,  # dev: 5 per subject (first_n)
              "exact_match,flexible-extract", offline=True, is_group=True, offline_shots=5, hub_shots=5),
    Benchmark("mmlu", "loglikelihood", "mmlu", 5, "acc,none", offline=True, is_group=True,
              offline_shots=5, hub_shots=5),
    Benchmark("gsm8k", DEFAULT_VARIANT, "gsm8k", 5, "exact_match,flexible-extract", offline=True,
              offline_shots=1319 - 1, hub_shots=7473),  # offline: test; hub: train
    Benchmark("bbh", DEFAULT_VARIANT, "bbh_cot_fewshot", 3, "exact_match,get-answer",  # 3 listed per task
              offline=True, is_group=True, offline_shots=3, hub_shots=3),
    Benchmark("triviaqa", DEFAULT_VARIANT, "triviaqa", 5, "exact_match,remove_whitespace",
              offline=True, note=_TRIVIAQA_NOTE, offline_shots=7993 - 1, hub_shots=138384),  # hub: train
    Benchmark("nq", DEFAULT_VARIANT, "nq_open", 5, "exact_match,remove_whitespace", offline=True,
              offline_shots=3610 - 1, hub_shots=87925),  # offline: validation; hub: train
    Benchmark("piqa", DEFAULT_VARIANT, "piqa", 0, "acc,none", offline=True,
              offline_shots=1838 - 1, hub_shots=16113),  # offline: validation; hub: train
    Benchmark("arc_c", DEFAULT_VARIANT, "arc_challenge", 0, "acc,none", offline=True,
              offline_shots=1172 - 1, hub_shots=1119),  # offline: test; hub: train
    # offline: test, first_n without the scored one; hub: the 10-question prompt split
    Benchmark("mbpp", DEFAULT_VARIANT, "mbpp", 3, "pass_at_1,none", offline=True, runs_code=True,
              offline_shots=500 - 1, hub_shots=10),
    # pass@2 from 5 programs per problem sampled at temperature 0.8 (a task's repeats: at least pass_k)
    Benchmark("mbpp", "pass_at_k", "mbpp_pass_at_k", 3, "pass_at_k,all", offline=True, runs_code=True,
              offline_shots=500 - 1, hub_shots=10, pass_k=2),
    # no few-shot split: lm-eval falls back to the 164 test problems (the scored one not excluded)
    Benchmark("humaneval", DEFAULT_VARIANT, "humaneval", 0, "pass_at_k,create_test", offline=True,
              runs_code=True, offline_shots=164, hub_shots=164),
    # shots from the dev split: the fixture's first sentences offline, Flores dev (997) on the hub
    *(Benchmark(f"flores_{direction}", version, f"{version}_{direction}", 4, "bleu,none", offline=True,
                note=_FLORES_NOTE, offline_shots=FLORES_FIXTURE_SHOTS, hub_shots=997)
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
# lm-eval's name of a built-in benchmark's task or group -> that benchmark (its packaged data included)
LM_EVAL_NAMES: dict[str, Benchmark] = {bench.task: bench for bench in _BENCHMARKS if bench.task not in REGISTRY}


def is_builtin(name: str) -> bool:
    """Whether ``name`` is a built-in benchmark, by its name or by lm-eval's name of its task."""
    return name in REGISTRY or name in LM_EVAL_NAMES


def get_benchmark(name: str, variant: str | None = None) -> Benchmark:
    """The benchmark ``name`` in ``variant`` (None: its default variant); UserError if unknown."""
    if name in LM_EVAL_NAMES and variant in (None, LM_EVAL_NAMES[name].variant):
        return LM_EVAL_NAMES[name]
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


__all__ = ["DEFAULT_VARIANT", "LM_EVAL_NAMES", "REGISTRY", "Benchmark", "get_benchmark", "is_builtin",
           "list_benchmarks"]
