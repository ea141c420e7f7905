"""Whitespace that lm-eval doubles, and answers that miss only by whitespace.

lm-eval writes ``target_delimiter`` (default ``" "``) between a few-shot question and its target, so a
task whose ``doc_to_target`` starts with a space shows ``A:  Moscow`` (two spaces) in every few-shot
example; small models copy the double space and exact match scores every answer wrong. These checks
find that case before a run (from the task YAML) and after a row (from its samples), one line per task.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

DEFAULT_DELIMITER = " "  # lm-eval's target_delimiter when a task sets none
FEW = 3  # answers that differ only by whitespace: warn at this many (or when every answer does)
MAX_DEPTH = 8  # groups of groups walked when looking for the task YAMLs of a recipe task
SPACE_FIX = ("add a remove_whitespace filter to the task's filter_list (as lm-eval's nq_open does), or end "
             "doc_to_text with the space and set target_delimiter: '' (docs/own_experiment.md)")


def _adds_whitespace(delimiter: object) -> bool:
    return isinstance(delimiter, str) and delimiter[-1:].isspace()


def doubled_target(task: str, target: object, delimiter: object = DEFAULT_DELIMITER) -> str | None:
    """A line when ``target`` (a rendered few-shot target, or a ``doc_to_target`` template) starts with
    whitespace that ``delimiter`` also puts before it; None otherwise."""
    if not isinstance(target, str) or not target[:1].isspace() or not _adds_whitespace(delimiter):
        return None
    return (f"{task}: the few-shot target {target[:24]!r} starts with whitespace and lm-eval puts "
            f"target_delimiter {delimiter!r} before it, so examples read 'A:  answer' and models copy the double "
            "space: drop the leading whitespace from doc_to_target (docs/own_experiment.md)")


def template_warning(task: str, cfg: dict) -> str | None:
    """:func:`doubled_target` of a task config whose ``doc_to_target`` is a Jinja template (a field name
    or an index renders from the data: the samples check finds those)."""
    template = cfg.get("doc_to_target")
    if not isinstance(template, str) or "{{" not in template:
        return None
    return doubled_target(task, template, cfg.get("target_delimiter", DEFAULT_DELIMITER))


def _task_files(name: str, index: dict, depth: int = 0) -> Iterator[tuple[str, Path]]:
    """(task name, YAML path) of the task ``name`` names, or of every task below the group it names."""
    entry = index.get(name)
    if entry is None or depth > MAX_DEPTH:
        return
    if entry.kind == "TASK" and entry.yaml_path:
        yield name, Path(entry.yaml_path)
    members = ((entry.cfg or {}).get("task") or []) if entry.kind == "GROUP" else entry.tags
    for member in members if isinstance(members, (list, tuple)) else []:
        name = member.get("task") if isinstance(member, dict) else member
        if isinstance(name, str):
            yield from _task_files(name, index, depth + 1)


def plan_warnings(task_names: Iterable[str], index: dict) -> list[str]:
    """A line per task (among those ``task_names`` name, through ``index``, lm_eval_tasks' index) whose
    ``doc_to_target`` template starts with whitespace that its target_delimiter adds too."""
    from lm_eval.tasks._yaml_loader import load_yaml

    lines: list[str] = []
    seen: set[Path] = set()
    for name in task_names:
        for task, path in _task_files(name, index):
            if path in seen:
                continue
            seen.add(path)
            try:
                cfg = load_yaml(path, resolve_func=False)
            except Exception:  # noqa: BLE001 - lm-eval says what is wrong with a task file when it loads it
                continue
            if line := template_warning(task, cfg):
                lines.append(line)
    return lines


def recipe_warnings(recipe, index: dict | None) -> list[str]:
    """:func:`plan_warnings` of a recipe's tasks that are not built in (none when all are: their
    templates are ensbench's own), looked up in ``index`` (``recipe_tasks.task_index_of``: lm-eval's
    tasks with the include_path folders); a task the index cannot find is the preflight's to name."""
    from ensemble_bench.tasks import is_builtin

    names = [task.name for task in recipe.tasks if not is_builtin(task.name)]
    return plan_warnings(names, index) if names and index is not None else []


def _generated(sample: dict) -> str | None:
    """A generative sample's answer (its first filtered response), None for other kinds."""
    responses = sample.get("filtered_resps")
    if isinstance(responses, list):
        responses = responses[0] if len(responses) == 1 else None
    return responses if isinstance(responses, str) else None


def whitespace_misses(samples: list[dict]) -> tuple[int, int, tuple[str, str] | None]:
    """(answers that differ from their target only by surrounding whitespace, generative answers, the
    first such (answer, target))."""
    count, total, first = 0, 0, None
    for sample in samples:
        answer, target = _generated(sample), sample.get("target")
        if answer is None or not isinstance(target, str):
            continue
        total += 1
        if answer != target and answer.strip() == target.strip() and answer.strip():
            count += 1
            first = first or (answer, target)
    return count, total, first


def answer_warning(row: str, task: str, samples: list[dict]) -> str | None:
    """A line when more than a few of a row's answers (or all) miss their target only by whitespace."""
    count, total, first = whitespace_misses(samples)
    if not count or (count < FEW and count < total):
        return None
    answer, target = first
    return (f"{row}: {task}: {count} of {total} answers differ from the target only by surrounding whitespace "
            f"(e.g. {answer!r} for {target!r}), so they score 0: {SPACE_FIX}")


def sample_target_warning(task: str, samples: list[dict], delimiter: object) -> str | None:
    """:func:`doubled_target` of the first sample's rendered target."""
    targets = [s.get("target") for s in samples if isinstance(s.get("target"), str)]
    return doubled_target(task, targets[0], delimiter) if targets else None
