"""Running generated programs for pass@k (MBPP, HumanEval), offline and sandboxed.

lm-eval's stock code metric loads ``evaluate``'s ``code_eval`` from the hub. Here each program
(the model's code followed by the benchmark's tests) runs in its own ``python -I`` subprocess,
in an empty temporary directory, with a wall-clock timeout and resource limits (address space,
CPU seconds, file size, no core dumps); it passes when it exits with status 0. This is a guard
against accidents, not a security boundary: the program can still read files and use the
network. It only runs when the recipe opts in (``allow_code_execution: true``), which sets
``ENSBENCH_ALLOW_CODE_EXECUTION=1`` for the run.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

ALLOW_ENV = "ENSBENCH_ALLOW_CODE_EXECUTION"
TIMEOUT_S = 10.0
MEMORY_MB = 1024


def _limits(memory_mb: int, cpu_s: int):
    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_program(program: str, timeout_s: float = TIMEOUT_S, memory_mb: int = MEMORY_MB) -> bool:
    """Whether ``program`` exits with status 0 within the limits."""
    with tempfile.TemporaryDirectory(prefix="ensbench-exec-") as folder:
        path = os.path.join(folder, "program.py")
        with open(path, "w") as handle:
            handle.write(program)
        try:
            done = subprocess.run([sys.executable, "-I", path], cwd=folder, capture_output=True,
                                  timeout=timeout_s, env={"PATH": os.environ.get("PATH", "")},
                                  preexec_fn=_limits(memory_mb, math.ceil(timeout_s)))
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0


def estimate_pass_at_k(samples: int, correct: int, k: int) -> float:
    """The unbiased estimator 1 - C(n - c, k) / C(n, k) (Chen et al., 2021)."""
    if samples - correct < k:
        return 1.0
    return 1.0 - math.comb(samples - correct, k) / math.comb(samples, k)


def _require_opt_in() -> None:
    if os.environ.get(ALLOW_ENV) != "1":
        raise RuntimeError(f"running generated code needs the recipe's allow_code_execution: true ({ALLOW_ENV}=1)")


def score_candidates(tests: str, candidates: Sequence[str], k: int = 1) -> float:
    """pass@k of one problem: each candidate program followed by the tests."""
    _require_opt_in()
    correct = sum(run_program(f"{code}\n\n{tests}\n") for code in candidates)
    return estimate_pass_at_k(len(candidates), correct, k)


# --- lm-eval hooks (named like the stock metrics, so result keys stay "pass_at_1,none" etc.) ---
def pass_at_1(references: list[str], predictions: list[str]) -> float:
    """MBPP: the generated code followed by the problem's assert statements."""
    return score_candidates(references[0], [predictions[0]], k=1)


def pass_at_k(references: list[str], predictions: list[list[str]], k: list[int] | int = 1) -> float:
    """HumanEval: each program (prompt + completion) followed by the test and check(entry_point)."""
    k = k[0] if isinstance(k, list) else k
    return score_candidates(references[0], predictions[0], k=k)


def build_programs(resps: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """HumanEval filter: the function's prompt (signature and docstring) before each completion."""
    return [[doc["prompt"] + completion for completion in resp] for resp, doc in zip(resps, docs)]
