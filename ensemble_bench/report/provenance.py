"""What a table must say about its numbers, beside them: whose number is whose (the legend), the shots
and example counts behind each score (as columns where the rows of one benchmark differ, else in a
note), and no average over benchmarks scored by different metrics (accuracy with exact match).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ensemble_bench.run.folder import RESULTS_GLOB, parse_json

NOT_RUN = "not run"
ROW_COLUMN = "ensbench row"  # the label of our result row that fills a paper row (the paper's own: "paper row")


def column_key(benchmark: str) -> str:
    """A benchmark's column in a table (``flores_en-de`` -> ``flores_en_de``)."""
    return benchmark.replace("-", "_")


def legend(with_paper: bool) -> str:
    """The line under a paper-layout table that says whose number is whose."""
    cells = ("cells: ours / paper (difference, ours - paper), scores in %; '–': not measured by ours"
             if with_paper else "cells: our scores in %; the paper's own numbers beside them: --paper")
    return (f"{cells}; '{ROW_COLUMN}': the label of our result row that fills the paper's row "
            f"('paper row', as the paper names it); '{NOT_RUN}': no row of ours fills it")


def run_shots(run_dir: Path, recipe, benches) -> dict[str, int | None]:
    """Benchmark column -> the shots its prompts had in this run: the recipe's, else a built-in benchmark's
    default, else what lm-eval's results files record (``n-shot``); None when nothing says."""
    own = [task.shots if task.shots is not None else bench.default_shots if bench.builtin else None
           for task, bench in zip(recipe.tasks, benches)]
    recorded: dict[str, int] = {}
    for path in sorted(run_dir.glob(f"*/{RESULTS_GLOB}")) if None in own else []:  # only when the recipe leaves
        with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):  # some task's shots open
            recorded = {**dict(parse_json(path).get("n-shot", {})), **recorded}
    shots = {}
    for given, bench in zip(own, benches):
        found = recorded.get(bench.task)
        shots[column_key(bench.name)] = given if given is not None else found if isinstance(found, int) else None
    return shots


def mixed_metrics(columns: Sequence[str], metrics: dict[str, str]) -> list[str]:
    """``"<benchmark>: <metric>"`` per one of ``columns`` when they are not all scored by one metric (an
    average over them would mix e.g. accuracy with exact match); [] when they are."""
    named = {column: metrics[column] for column in columns if column in metrics}
    return [f"{column}: {metric}" for column, metric in named.items()] if len(set(named.values())) > 1 else []


def average_note(columns: Sequence[str], metrics: dict[str, str]) -> list[str]:
    """Why the average is left out, when the benchmarks are scored by different metrics."""
    mixed = mixed_metrics(columns, metrics)
    return [f"avg left out: the benchmarks are scored by different metrics ({', '.join(mixed)})"] if mixed else []


def setup_text(shots: int | None, examples: int | None) -> str:
    """``5-shot, n=50`` (``?`` where not known)."""
    return f"{'?' if shots is None else shots}-shot, n={'?' if examples is None else examples}"


def add_setups(records: list[dict], columns: Sequence[str], rows: Sequence[Any]) -> list[str]:
    """Put "<benchmark> shots" and "<benchmark> n" into ``records`` (one per table line, our row for it in
    ``rows``: a ``tables.OurRow``, None where there is none) beside each benchmark whose rows differ in
    shots or examples; return a note naming the setup of the benchmarks where every row has the same."""
    same = []
    for column in columns:
        setups = [(row.shots.get(column), row.examples[column]) if row is not None and column in row.examples
                  else None for row in rows]
        distinct = {setup for setup in setups if setup is not None}
        if len(distinct) == 1:
            same.append(f"{column} {setup_text(*distinct.pop())}")
        elif distinct:
            for index, setup in enumerate(setups):
                cells = {f"{column} shots": setup[0] if setup else None, f"{column} n": setup[1] if setup else None}
                records[index] = _inserted(records[index], column, cells)
    return [f"shots and examples, the same in every row: {'; '.join(same)}"] if same else []


def setup_frame(records: list[dict]) -> pd.DataFrame:
    """The table of ``records``, its "<benchmark> shots" and "<benchmark> n" columns whole numbers (not
    floats: a column with empty cells would turn 5 into 5.0)."""
    frame = pd.DataFrame.from_records(records)
    for column in frame.columns:
        if column.endswith((" shots", " n")) and column[:column.rindex(" ")] in frame.columns:
            frame[column] = frame[column].astype("Int64")
    return frame


def _inserted(record: dict, column: str, cells: dict) -> dict:
    """``record`` with ``cells`` placed after ``column`` and its interval columns."""
    after = f"{column} high" if f"{column} high" in record else column
    out = {}
    for key, value in record.items():
        out[key] = value
        if key == after:
            out.update(cells)
    return out


__all__ = ["NOT_RUN", "ROW_COLUMN", "add_setups", "average_note", "column_key", "legend", "mixed_metrics",
           "run_shots", "setup_frame", "setup_text"]
