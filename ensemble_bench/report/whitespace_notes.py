"""The summary's warnings about whitespace, from a finished run's samples (tasks/whitespace.py): a few-shot
target that starts with whitespace its delimiter adds (once per task), and a row whose answers miss
their targets only by surrounding whitespace."""

from __future__ import annotations

from pathlib import Path

from ensemble_bench.run.folder import newest_samples, read_json, results_files
from ensemble_bench.tasks.whitespace import DEFAULT_DELIMITER, answer_warning, sample_target_warning


def _delimiters(row_dir: Path) -> dict[str, object]:
    """lm-eval task name -> its target_delimiter, from the row's results files."""
    found: dict[str, object] = {}
    for path in results_files(row_dir):
        for task, cfg in (read_json(path).get("configs") or {}).items():
            if isinstance(cfg, dict):
                found[task] = cfg.get("target_delimiter", DEFAULT_DELIMITER)
    return found


def whitespace_warnings(run_dir: Path, labels: list[str]) -> list[str]:
    """One line per task whose few-shot target doubles its delimiter's whitespace, and one per row and
    task whose answers differ from the targets only by whitespace in more than a few examples."""
    targets: dict[str, str] = {}
    answers: list[str] = []
    for label in labels:
        row_dir = run_dir / label
        delimiters = _delimiters(row_dir)
        for task, path in newest_samples(row_dir).items():
            samples = read_json(path)
            samples = [s for s in samples if s.get("filter") == samples[0].get("filter")]  # one filter's answers
            if task not in targets and (line := sample_target_warning(task, samples, delimiters.get(task, " "))):
                targets[task] = line
            if line := answer_warning(label, task, samples):
                answers.append(line)
    return [*targets.values(), *answers]


def whitespace_section(run_dir: Path, labels: list[str]) -> str:
    """The summary's Markdown section of :func:`whitespace_warnings` (empty when there is none)."""
    lines = whitespace_warnings(run_dir, labels)
    return "\n## Warnings\n\n" + "".join(f"- warning: {line}\n" for line in lines) if lines else ""
