"""The summary table of one run: a row per evaluated model, a column per benchmark, latency."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from ensemble_bench.cache import atomic_write_text
from ensemble_bench.errors import EnvironmentFault, UserError
from ensemble_bench.methods import RunStats
from ensemble_bench.recipe import parse_recipe
from ensemble_bench.report.paired import comparison_records, ensemble_comparisons, row_intervals
from ensemble_bench.report.run_files import PERCENT_METRICS, RunRow, leaf_tasks, ms_per_token, row_wall_seconds
from ensemble_bench.report.tie_notes import tie_section
from ensemble_bench.report.whitespace_notes import whitespace_section
from ensemble_bench.run.folder import (
    PAIRED_CSV,
    RECIPE,
    RESULTS_GLOB,
    REUSED,
    SUMMARY,
    SUMMARY_CSV,
    TASKS,
    TIMING,
    damaged,
    is_finished,
    newest_samples,
    read_json,
    results_files,
)
from ensemble_bench.tasks import Benchmark, get_benchmark, is_builtin
from ensemble_bench.tasks.lm_eval_tasks import benchmark_from_results
from ensemble_bench.tasks.task_configs import group_name

__all__ = ["RunRow", "finished_recipe", "metric_value",
           "recipe_benchmarks", "row_scores", "run_rows", "summary_frame", "write_summary"]


def metric_value(results: dict, bench: Benchmark) -> tuple[float, int] | None:
    """(score 0..1, examples) of a benchmark's primary metric; groups fall back to a size-weighted mean."""
    found = _metric_value(results, bench)
    if found is None or bench.primary_metric.split(",")[0] not in PERCENT_METRICS:
        return found
    return found[0] / 100, found[1]


def _metric_value(results: dict, bench: Benchmark) -> tuple[float, int] | None:
    scores = results.get("results", {})
    counts = results.get("n-samples", {})
    metric = bench.primary_metric
    leaves = leaf_tasks(results.get("group_subtasks", {}), bench.task)
    found = [(scores[t][metric], counts.get(t, {}).get("effective", 0)) for t in leaves
             if t in scores and isinstance(scores[t].get(metric), (int, float))]
    total = sum(n for _, n in found)
    if bench.task in scores and isinstance(scores[bench.task].get(metric), (int, float)):
        return float(scores[bench.task][metric]), total
    if not found or total == 0:
        return None
    return sum(v * n for v, n in found) / total, total


def recipe_benchmarks(run_dir: Path, recipe) -> list[Benchmark]:
    """The recipe's tasks as Benchmarks: built-in ones from the registry, any other lm-eval task with the
    primary metric its results files in ``run_dir`` record (first metric, or the group's aggregate).
    Folders set aside (``.<row>.damaged``) are not read."""
    if all(is_builtin(t.name) for t in recipe.tasks):
        return [get_benchmark(t.name, t.variant) for t in recipe.tasks]
    paths = [p for p in results_files(run_dir, nested=True)
             if not any(part.startswith(".") for part in p.relative_to(run_dir).parts)]
    results = [read_json(path) for path in paths]
    return [benchmark_from_results(t.name, t.variant, results) for t in recipe.tasks]


def _row_results(row_dir: Path) -> list[dict]:
    return [read_json(p) for p in results_files(row_dir, nested=True)]


def row_scores(row_dir: Path, benches: list[Benchmark]) -> dict[str, tuple[float, int]]:
    """benchmark name -> (score, examples) from a row's lm-eval result files (the last file wins)."""
    found: dict[str, tuple[float, int]] = {}
    for results in _row_results(row_dir):
        for bench in benches:
            value = metric_value(results, bench)
            if value:
                found[bench.name] = value
    return found


def finished_recipe(run_dir: Path):
    """The recipe of a finished run folder (UserError if it is not one)."""
    if not is_finished(run_dir) or not (run_dir / RECIPE).exists():
        raise UserError(f"{run_dir}: not a finished ensbench run (no {SUMMARY} / {RECIPE})")
    path = run_dir / RECIPE
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as err:
        raise damaged(path, err) from None
    return parse_recipe(data, str(path))


def run_rows(run_dir: Path, recipe=None) -> list[RunRow]:
    """Every planned row of a run (finished unless ``recipe`` is given), in plan order."""
    recipe = recipe or finished_recipe(run_dir)
    benches = recipe_benchmarks(run_dir, recipe)
    groups = run_groups(run_dir, recipe)
    rows = []
    for plan in recipe.plan:
        timing = run_dir / plan.label / TIMING
        if not timing.exists():
            raise EnvironmentFault(f"{run_dir}: row {plan.label!r} of its recipe has no {TIMING}: run the recipe "
                                   "again to compute the row, or leave this run out")
        _check_results(timing.parent, groups)
        rows.append(RunRow(plan, read_json(timing), row_scores(timing.parent, benches)))
    return rows


def _check_results(row_dir: Path, groups: list[str]) -> None:
    """One line naming a row folder with no results_*.json for one of the run's task groups (a deleted or
    replaced file), rather than blank cells, or 'nan' in a regression check."""
    recorded = {group for results in _row_results(row_dir) if isinstance(results, dict)
                and isinstance(results.get("group_subtasks"), dict) for group in results["group_subtasks"]}
    if missing := [group for group in groups if group not in recorded]:
        raise EnvironmentFault(f"{row_dir}: no {RESULTS_GLOB} of this row holds its task group {missing[0]} (the "
                               "file was deleted or replaced): run its recipe again with --fresh, or leave this run "
                               "out")


def run_groups(run_dir: Path, recipe) -> list[str]:
    """The lm-eval task groups a run evaluated (one per distinct limit), from its tasks/ folder: every row
    of a finished run has a results_*.json for each (the runner checks it before the summary)."""
    prefix = group_name(recipe.data)
    return sorted(path.stem for path in (run_dir / TASKS).glob(f"{prefix}_*.yaml")
                  if path.stem.removeprefix(f"{prefix}_").isdigit())


def _score_columns(bench: Benchmark) -> tuple[str, str, str]:
    """The summary's columns of a benchmark: its score, and the low and high ends of its 95% interval."""
    column = f"{bench.name} ({bench.primary_metric.split(',')[0]})"
    return column, f"{bench.name} low", f"{bench.name} high"


def summary_frame(run_dir: Path, recipe, intervals: dict | None = None) -> pd.DataFrame:
    """A row per evaluated model: scores in % with their 95% intervals (``intervals``: (row,
    benchmark) -> report.paired.Interval), example counts, the average (only over benchmarks scored by one
    metric: accuracy and exact match are not averaged), latency."""
    benches = recipe_benchmarks(run_dir, recipe)
    intervals = intervals or {}
    one_metric = len({bench.primary_metric.split(",")[0] for bench in benches}) == 1
    records = []
    for row in run_rows(run_dir, recipe):
        scores = row.scores
        record = {"model": row.plan.label, "method": row.plan.method}
        values = []
        for bench in benches:
            value = scores.get(bench.name)
            column, low, high = _score_columns(bench)
            interval = intervals.get((row.plan.label, bench.name))
            record[column] = round(100 * value[0], 1) if value else None
            record[low] = round(100 * interval.low, 1) if interval else None
            record[high] = round(100 * interval.high, 1) if interval else None
            record[f"n {bench.name}"] = value[1] if value else 0
            if value:
                values.append(100 * value[0])
        if one_metric:
            record["avg"] = round(sum(values) / len(values), 1) if len(values) == len(benches) else None
        record.update(timing_cells(row.stats, run_dir / row.plan.label))
        records.append(record)
    return pd.DataFrame.from_records(records)


def _rounded(value: float | None, digits: int = 1) -> float | None:
    return round(value, digits) if value else None


def timing_cells(stats: RunStats, row_dir: Path) -> dict:
    """A row's latency and counters: ms/token (generation), time to first token, ms per request
    and per scored token (multiple choice), the row's wall time, tokens, % ensembled, manipulated/step."""
    fraction = stats.ensembled_fraction
    manipulated = stats.tokens_manipulated_per_step
    return {"ms/token": _rounded(ms_per_token(stats)), "ttft ms": _rounded(stats.time_to_first_token_ms),
            "ms/request": _rounded(stats.loglikelihood_ms_per_request),
            "ms/scored token": _rounded(stats.loglikelihood_ms_per_token),
            "wall s": _rounded(row_wall_seconds(row_dir)), "tokens": stats.tokens_generated,
            "ensembled %": round(100 * fraction, 1) if fraction is not None else None,
            "manipulated/step": round(manipulated, 1) if manipulated is not None else None,
            **speculative_cells(stats)}


def speculative_cells(stats: RunStats) -> dict:
    """A speculative row's draft acceptance in % and each member's forward passes per generated token
    (``a 1.00, b 0.31``); nothing for other rows (the columns appear when some row drafts)."""
    own = stats.method_stats
    if "speculative_acceptance_rate" not in own:
        return {}
    rate = own.get("speculative_acceptance_rate")
    forwards = own.get("speculative_forwards_per_token") or {}
    return {"accepted %": round(100 * rate, 1) if isinstance(rate, (int, float)) else None,
            "forwards/token": ", ".join(f"{name} {value:.2f}" for name, value in forwards.items()
                                        if isinstance(value, (int, float))) or None}


def with_interval_cells(frame: pd.DataFrame, benches: list[Benchmark]) -> pd.DataFrame:
    """The frame for reading: each score cell ``67.0 [57.3, 75.4]``, no separate low/high columns."""
    shown = frame.astype(object).where(frame.notna(), None)
    for bench in benches:
        column, low, high = _score_columns(bench)
        if column not in shown:
            continue
        shown[column] = [None if v is None else (f"{v:.1f} [{lo:.1f}, {hi:.1f}]" if lo is not None else f"{v:.1f}")
                         for v, lo, hi in zip(shown[column], shown[low], shown[high])]
        shown = shown.drop(columns=[low, high])
    return shown


PAIRED_NOTE = ("wins / losses: examples the ensemble scores above / below that member; p: two-sided McNemar "
               "exact test (0/1 scores) or paired bootstrap (others); answers differ: examples where the "
               "ensemble's answer is not the member's; oracle: share of examples some member gets right "
               "(the ceiling of picking per example); members agree: share where all members answer alike.")


def paired_section(comparisons) -> str:
    """The Markdown section on what each ensemble changed against its members."""
    records = comparison_records(comparisons)
    if not records:
        return ""
    table = pd.DataFrame.from_records(records).to_markdown(index=False)
    return f"\n## What the ensemble changed (paired, same examples)\n\n{table}\n\n{PAIRED_NOTE}\n"


def write_summary(run_dir: Path, recipe) -> pd.DataFrame:
    """summary.csv (scores with 95% interval columns), paired.csv, and summary.md (written last)."""
    benches = recipe_benchmarks(run_dir, recipe)
    rows = run_rows(run_dir, recipe)
    frame = summary_frame(run_dir, recipe, row_intervals(run_dir, rows, benches))
    comparisons = ensemble_comparisons(run_dir, rows, benches)
    atomic_write_text(run_dir / SUMMARY_CSV, frame.to_csv(index=False))
    if comparisons:
        atomic_write_text(run_dir / PAIRED_CSV,
                          pd.DataFrame.from_records(comparison_records(comparisons)).to_csv(index=False))
    notes = [f"- {b.name}: {b.note}" for b in set(benches) if b.note]
    header = (f"# {recipe.name}\n\nScores in % [95% interval: Wilson for 0/1 scores, bootstrap otherwise], "
              f"{decoding_words(run_dir, rows)}; ms/token = decode time per step at batch size {recipe.batch_size} "
              "(a row whose requests all finish in their first round: that round's time per token); ms/request, "
              "ms/scored token = time to score one multiple-choice option, and per token of the options; wall s = "
              "the row's evaluation time.\n\n")
    if "accepted %" in frame.columns:
        header = header[:-2] + (" accepted % = drafted tokens the ensemble kept, forwards/token = each member's "
                                "forward passes per generated token (speculative rows).\n\n")
    body = with_interval_cells(frame, benches).to_markdown(index=False, missingval="") + "\n"
    atomic_write_text(run_dir / SUMMARY, header + body + ("\n" + "\n".join(notes) + "\n" if notes else "")
                      + reuse_section(run_dir) + paired_section(comparisons)
                      + whitespace_section(run_dir, [row.plan.label for row in rows])
                      + tie_section(run_dir, [row.plan.label for row in rows]))
    return frame


def decoding_words(run_dir: Path, rows: list[RunRow]) -> str:
    """"greedy", or which rows sampled a task (their results' ``config.sampling``: docs/sampling.md)."""
    sampled = [row.plan.label for row in rows if any(
        isinstance(settings, dict) and settings.get("do_sample")
        for results in _row_results(run_dir / row.plan.label) if isinstance(results, dict)
        for settings in ((results.get("config") or {}).get("sampling") or {}).values())]
    if not sampled:
        return "greedy"
    return f"greedy except {', '.join(sampled)} (sampled: the settings are config.sampling in their results_*.json)"


def reuse_section(run_dir: Path) -> str:
    """What the run took from earlier runs (``reused.json``): rows copied whole, whose scores and
    latency are the original's, and rows that started from another run's response cache."""
    path = run_dir / REUSED
    if not path.exists():
        return ""
    lines = []
    for label, entry in read_json(path).items():
        if "from" in entry:
            lines.append(f"- {label}: copied from `{entry['from']}` (its scores and latency are that run's)")
        if "cache_from" in entry:
            lines.append(_cache_line(run_dir / label, label, entry["cache_from"]))
    return "\n## Reused from earlier runs\n\n" + "\n".join(lines) + "\n" if lines else ""


def _requests_asked(row_dir: Path) -> int:
    """The requests a row's samples hold (one per ``gen_args_<k>`` of each document, one filter's samples)."""
    total = 0
    for path in newest_samples(row_dir).values():
        samples = read_json(path)
        total += sum(len(s.get("arguments") or {}) for s in samples if s.get("filter") == samples[0].get("filter"))
    return total


def _cache_line(row_dir: Path, label: str, source: str) -> str:
    """The reuse line of a row that started from another run's response cache: how many of its requests
    that cache answered (its requests less those computed), or that it answered none."""
    said = f"- {label}: answers already in `{source}`'s response cache were reused"
    timing = row_dir / TIMING
    computed = read_json(timing).get("requests_computed") if timing.exists() else None
    asked = _requests_asked(row_dir)
    if not isinstance(computed, int) or not asked:
        return said
    if computed >= asked:
        return f"- {label}: `{source}`'s response cache held none of its {asked} requests (all computed)"
    return f"{said} ({asked - computed} of {asked} requests)"
