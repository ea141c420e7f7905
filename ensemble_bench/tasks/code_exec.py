"""Running generated programs for pass@k (MBPP, HumanEval), offline and isolated.

lm-eval's stock code metric loads ``evaluate``'s ``code_eval`` from the hub. Here each program
(the model's code followed by the benchmark's tests) runs in its own ``python -I`` subprocess,
in an empty temporary directory, with a wall-clock timeout and resource limits (address space,
CPU seconds, file size, no core dumps); it passes when it exits with status 0. On timeout its whole
process group is killed. Around that, ``tasks/isolation.py`` adds what Linux offers without root,
chosen at run time: no network, and a filesystem view without the user's home and the project
(``code_execution_isolation``: none | network | network+filesystem; docs/code_execution.md).
It only runs with the recipe's consent (``Consent``): ``allow_code_execution: true``, and without any
isolation also ``allow_unisolated_execution: true``. The consent is written into the run's own hooks
module (``hooks_source``), which the task YAMLs' ``!function`` metrics name: nothing is set in the
process's environment, so one run's consent never reaches another's tasks.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ensemble_bench.errors import UserError
from ensemble_bench.tasks.isolation import Sandbox, detect

TIMEOUT_S = 10.0
MEMORY_MB = 1024
FILE_MB = 16


def _limits(memory_mb: int, cpu_s: int):
    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_MB << 20, FILE_MB << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the program's process group (children it left in the group too)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def run_in(folder: str, program: str, timeout_s: float = TIMEOUT_S, memory_mb: int = MEMORY_MB,
           sandbox: Sandbox | None = None) -> bool:
    """Whether ``program``, written into ``folder`` (empty), exits with status 0 within the limits."""
    box = sandbox or detect()
    work = box.workdir(folder)
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "program.py"), "w") as handle:
        handle.write(program)
    box.prepare(folder)
    argv = [box.python, "-I", "program.py"]
    process = subprocess.Popen(box.command(folder, argv), cwd=work, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                               env={"PATH": os.environ.get("PATH", "")},
                               preexec_fn=_limits(memory_mb, math.ceil(timeout_s)))
    try:
        status = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        status = None
    _kill_group(process)
    process.wait()
    return status == 0


def run_program(program: str, timeout_s: float = TIMEOUT_S, memory_mb: int = MEMORY_MB,
                sandbox: Sandbox | None = None) -> bool:
    """Whether ``program`` exits with status 0 within the limits (in a fresh temporary folder)."""
    with tempfile.TemporaryDirectory(prefix="ensbench-exec-") as folder:
        return run_in(folder, program, timeout_s, memory_mb, sandbox)


def isolation_level() -> str:
    """The ``code_execution_isolation`` of this machine: none, network or network+filesystem."""
    return detect().level


def check_isolation(allow_unisolated: bool, say=print) -> str:
    """Say the isolation level in one line; refuse (UserError) when there is none and the recipe
    does not allow that. Returns the level."""
    box = detect()
    say(box.describe())
    if box.level == "none" and not allow_unisolated:
        raise UserError(f"refusing to run model-written code without isolation ({box.missing}): install "
                        "util-linux's unshare and allow user namespaces, or set allow_unisolated_execution: true")
    return box.level


def estimate_pass_at_k(samples: int, correct: int, k: int) -> float:
    """The unbiased estimator 1 - C(n - c, k) / C(n, k) (Chen et al., 2021)."""
    if samples - correct < k:
        return 1.0
    return 1.0 - math.comb(samples - correct, k) / math.comb(samples, k)


@dataclass(frozen=True)
class Consent:
    """What the run allows: running generated programs at all, and running them where no isolation works."""

    run_code: bool = False
    unisolated: bool = False

    def require(self) -> None:
        if not self.run_code:
            raise RuntimeError("running generated code needs the recipe's allow_code_execution: true")
        if detect().level == "none" and not self.unisolated:
            raise RuntimeError("no isolation for generated code on this machine: it needs the recipe's "
                               "allow_unisolated_execution: true")


NO_CONSENT = Consent()


def score_candidates(tests: str, candidates: Sequence[str], k: int = 1, consent: Consent = NO_CONSENT) -> float:
    """pass@k of one problem: each candidate program followed by the tests."""
    consent.require()
    correct = sum(run_program(f"{code}\n\n{tests}\n") for code in candidates)
    return estimate_pass_at_k(len(candidates), correct, k)


def scoring_hooks(consent: Consent) -> tuple[Callable[..., float], Callable[..., float]]:
    """lm-eval's metric functions for MBPP (pass_at_1) and HumanEval (pass_at_k) under ``consent``; named
    like the stock metrics, so result keys stay "pass_at_1,none" etc."""

    def pass_at_1(references: list[str], predictions: list[str]) -> float:
        """MBPP: the generated code followed by the problem's assert statements."""
        return score_candidates(references[0], [predictions[0]], k=1, consent=consent)

    def pass_at_k(references: list[str], predictions: list[list[str]], k: list[int] | int = 1) -> float:
        """HumanEval: each program (prompt + completion) followed by the test and check(entry_point); MBPP's
        pass_at_k variant: each sampled program followed by the problem's assert statements."""
        k = k[0] if isinstance(k, list) else k
        if len(predictions[0]) < k:
            raise ValueError(f"pass@{k} needs at least {k} programs per problem (the task's repeats), got "
                             f"{len(predictions[0])}")
        return score_candidates(references[0], predictions[0], k=k, consent=consent)

    return pass_at_1, pass_at_k


def hooks_source(consent: Consent) -> str:
    """The module written beside a run's code tasks that their ``!function`` metrics and filter name."""
    return ("from ensemble_bench.tasks.code_exec import (Consent, build_programs, keep_all,  # noqa: F401\n"
            "                                           scoring_hooks)\n"
            f"pass_at_1, pass_at_k = scoring_hooks(Consent(run_code={consent.run_code}, "
            f"unisolated={consent.unisolated}))\n")


def keep_all(resps, docs: list[dict]) -> list[list[str]]:
    """MBPP pass@k filter: every program sampled for a problem (lm-eval's default keeps the first only)."""
    return [list(resp) for resp in resps]


def build_programs(resps: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """HumanEval filter: the function's prompt (signature and docstring) before each completion."""
    return [[doc["prompt"] + completion for completion in resp] for resp, doc in zip(resps, docs)]
