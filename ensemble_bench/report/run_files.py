"""Reading the files of a run folder (named and parsed by run/folder.py): one row of a run (``RunRow``),
the leaf tasks of an lm-eval group, the metrics lm-eval reports on 0-100, a row's wall time and the
hardware a run ran on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ensemble_bench.methods import RunStats, read_stats
from ensemble_bench.recipe import Row
from ensemble_bench.run.folder import read_json, results_files

# lm-eval reports these corpus metrics (sacrebleu) on 0-100; every score in a report is 0..1
PERCENT_METRICS = ("bleu", "chrf", "ter")


@dataclass(frozen=True)
class RunRow:
    """One evaluated row of a run: its plan, its timing.json and its scores."""
    plan: Row
    timing: dict
    scores: dict[str, tuple[float, int]]  # benchmark name -> (score 0..1, examples)

    @property
    def stats(self) -> RunStats:
        """The row's timing.json as the typed run statistics (parameters named as this code names them)."""
        return read_stats(self.timing)


def leaf_tasks(group_subtasks: dict, name: str) -> list[str]:
    children = group_subtasks.get(name)
    if children is None:
        return [name]
    return [leaf for child in children for leaf in leaf_tasks(group_subtasks, child)]


def row_wall_seconds(row_dir: Path) -> float | None:
    """A row's evaluation time in seconds: lm-eval's ``total_evaluation_time_seconds`` summed over
    the row's results files (one per benchmark evaluation); None when none records it."""
    times = [read_json(path).get("total_evaluation_time_seconds") for path in results_files(row_dir, nested=True)]
    found = [float(t) for t in times if isinstance(t, (int, float, str)) and _is_number(t)]
    return sum(found) if found else None


def _is_number(value) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _env_line(env: str, key: str) -> str | None:
    """The value of ``key: value`` in lm-eval's ``pretty_env_info``, unless not collected."""
    match = re.search(rf"^{re.escape(key)}:\s*(.+)$", env, re.MULTILINE)
    value = match.group(1).strip() if match else None
    return None if value in (None, "", "N/A", "Could not collect") else value


def run_hardware(run_dir: Path, recipe) -> str:
    """What a run's members ran on, as its results files record it: ``cpu (Intel(R) Xeon(R) ...)``,
    or the GPU models for members on ``cuda``; ``unknown`` where the files do not say."""
    files = results_files(run_dir, nested=True)
    env = str(read_json(files[0]).get("pretty_env_info", "")) if files else ""
    devices = sorted({member.device.split(":")[0] for member in recipe.members})
    if devices == ["cpu"]:
        model = _env_line(env, "Model name")
        return f"cpu ({model})" if model else "cpu"
    gpus = _env_line(env, "GPU models and configuration")
    return gpus or f"{'+'.join(devices)} (model not recorded)"


def ms_per_token(stats: RunStats) -> float | None:
    """A row's ms/token: decode time per step, or, when every request finished in its first round
    (a SweetSpan row whose answers fit one span), the first round's time per token of it."""
    return stats.decode_ms_per_token if stats.decode_ms_per_token is not None else stats.first_round_ms_per_token
