"""The summary's warning about multiple-choice questions decided by position (tasks/ties.py): a row whose
choices tied for the best score on some questions, read from its timing.json (``position_ties``)."""

from __future__ import annotations

from pathlib import Path

from ensemble_bench.run.folder import TIMING, read_json


def tie_warnings(run_dir: Path, labels: list[str]) -> list[str]:
    """One line per row and task with questions whose best score two or more choices share."""
    lines = []
    for label in labels:
        timing = run_dir / label / TIMING
        stats = read_json(timing) if timing.exists() else None
        counts = stats.get("position_ties") if isinstance(stats, dict) else None
        for task, count in (counts if isinstance(counts, dict) else {}).items():
            if isinstance(count, dict) and count.get("tied"):
                lines.append(f"{label}, {task}: {count['tied']} of {count['questions']} questions had two or more "
                             "choices tied for the best score; lm-eval took the first of them, so those answers "
                             "(and their part of the accuracy) were decided by the choices' order")
    return lines


def tie_section(run_dir: Path, labels: list[str]) -> str:
    """The summary's Markdown section of :func:`tie_warnings` (empty when there is none)."""
    lines = tie_warnings(run_dir, labels)
    return "\n## Ties decided by position\n\n" + "".join(f"- warning: {line}\n" for line in lines) if lines else ""
