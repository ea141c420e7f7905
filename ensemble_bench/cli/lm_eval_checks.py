"""What ``ensbench-lm-eval run`` checks on its command line before lm-eval acts on it, as ``ensbench run``
checks a recipe's fields, one line each and before any model loads:

* every value nests brackets at most MAX_YAML_DEPTH deep, as a recipe or ``--set`` value (lm-eval reads
  ``--model_args``, ``--gen_kwargs``, ``--samples`` and ``--metadata`` with ``json.loads`` or
  ``ast.literal_eval``, which recurse once per level) - checked before lm-eval parses the command line;
* ``--model`` names a registered model (lm-eval's or an ensbench method), before the tasks load;
* ``--num_fewshot`` is 0 or more, and ``--gen_kwargs`` obey the rules of a recipe task's ``gen_kwargs``;
* the tasks (names matched in the task index with the ``--include_path`` folder, task YAML files, a
  folder of them) import no task code unless ``--allow_task_code`` is given (tasks/task_code.py), and
  their local data is there and readable (tasks/task_sources.py ``data_problems``).
"""

from __future__ import annotations

import difflib
import fnmatch
import glob
from collections.abc import Iterator, Sequence
from pathlib import Path

from pydantic import ValidationError

from ensemble_bench.errors import UserError, lines_of, several
from ensemble_bench.yaml_limits import MAX_YAML_DEPTH

HELP = "(ensbench-lm-eval run --help)"
OPENING, CLOSING = "[{(", "]})"


def nesting(text: str) -> int:
    """How deep brackets nest in ``text`` (quotes are not told apart: no real value comes near the limit),
    counted up to one past MAX_YAML_DEPTH."""
    depth, deepest = 0, 0
    for char in text:
        if char in OPENING:
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_YAML_DEPTH:
                break
        elif char in CLOSING:
            depth = max(depth - 1, 0)
    return deepest


def check_nesting(argv: Sequence[str]) -> None:
    """UserError (one line naming the option) for a command-line value nested deeper than MAX_YAML_DEPTH."""
    option = "a value"
    for word in argv:
        if word.startswith("--") or (word.startswith("-") and word[1:2].isalpha()):
            option, _, word = word.partition("=")
        if nesting(word) > MAX_YAML_DEPTH:
            raise UserError(f"{option}: a value nested more than {MAX_YAML_DEPTH} levels deep; a recipe and --set "
                            f"nest at most {MAX_YAML_DEPTH} {HELP}")


def check_model(name: str) -> None:
    """UserError naming close matches when ``--model`` is neither one of lm-eval's models nor an ensbench
    method (lm-eval would say so only after loading every task)."""
    from lm_eval.api.registry import model_registry

    if name in model_registry:
        return
    close = difflib.get_close_matches(name, list(model_registry.keys()), n=4, cutoff=0.6)
    hint = f" (close: {', '.join(close)})" if close else ""
    raise UserError(f"--model {name!r}: no such model{hint}; ensbench's methods: ensbench list methods; lm-eval's "
                    f"models: hf, vllm, ... {HELP}")


def check_settings(num_fewshot, gen_kwargs: dict | None) -> None:
    """``--num_fewshot`` and ``--gen_kwargs`` under the rules of a recipe task's ``shots`` and ``gen_kwargs``
    (the settings lm-eval takes that a recipe does not name are lm-eval's to check)."""
    from ensemble_bench.recipe.lines import pydantic_lines
    from ensemble_bench.recipe.schema import GenKwargs

    lines = []
    if num_fewshot is not None and not (isinstance(num_fewshot, int) and num_fewshot >= 0):
        lines.append(f"--num_fewshot {num_fewshot}: give 0 or more examples {HELP}")
    known = {key: value for key, value in (gen_kwargs or {}).items() if key in GenKwargs.model_fields}
    try:
        GenKwargs.model_validate(known, strict=False)  # lm-eval reads "-5" as -5.0
    except ValidationError as err:
        lines += [f"{line} {HELP}" for line in pydantic_lines("--gen_kwargs", err, model=GenKwargs)]
    if lines:
        raise several(UserError, lines)


def _task_words(tasks) -> list[str]:
    """``--tasks`` as lm-eval splits it (commas, several words)."""
    words = tasks.split(",") if isinstance(tasks, str) else [t for task in tasks or [] if isinstance(task, str)
                                                              for t in task.split(",")]
    return [word for word in words if word]


def _selected(tasks, index: dict) -> Iterator[tuple[str, Path | None, object]]:
    """(as shown, task YAML file or None, index entry or None) of each task ``--tasks`` selects, matched as
    lm-eval's ``process_tasks`` matches them: a folder of task YAML, YAML files (globs), names (globs)."""
    words = _task_words(tasks)
    if len(words) == 1 and Path(words[0]).is_dir() and not fnmatch.filter(index, words[0]):
        words = sorted(glob.glob(str(Path(words[0]) / "*.yaml")))
    for word in words:
        if word.endswith(".yaml"):
            yield from ((path, Path(path), None) for path in sorted(glob.glob(str(Path(word).absolute()))))
        else:
            yield from ((name, None, index[name]) for name in sorted(fnmatch.filter(index, word)))


def task_lines(tasks, include_path, allow_task_code: bool) -> list[str]:
    """One line per task file lm-eval must not open, module a selected task would import and run (unless
    ``allow_task_code``), ``!function`` found nowhere, and local data that cannot be read."""
    from ensemble_bench.tasks.lm_eval_tasks import entry_yamls, task_index
    from ensemble_bench.tasks.recipe_tasks import task_data_problems
    from ensemble_bench.tasks.task_code import task_code
    from ensemble_bench.tasks.task_sources import task_file_problems

    named = [include_path] if isinstance(include_path, (str, Path)) else include_path or []
    folders = [Path(p) for p in named if Path(p).is_dir()]  # as lm-eval's TaskManager reads them (no ~)
    if lines := task_file_problems(folders):
        return [line.replace("include_path:", "--include_path:", 1) for line in lines]
    index = task_index(folders)
    lines = []
    for shown, path, entry in _selected(tasks, index):
        code, problems = task_code([path] if path is not None else entry_yamls(entry, index))
        lines += [f"--tasks: {line}" for line in problems]
        if not allow_task_code:
            lines += [f"--tasks: '{shown}' imports and runs {found.shown()} ({found.origin()}), unsandboxed: add "
                      "--allow_task_code to run it" for found in code]
        if entry is not None:
            lines += [f"--tasks: '{shown}' reads {line}" for line in task_data_problems(entry, index)]
    return list(dict.fromkeys(lines))


def check_run(config, allow_task_code: bool) -> None:
    """Every check of an ``ensbench-lm-eval run`` that lm-eval's configuration (``EvaluatorConfig``) allows
    before it loads tasks or models: all mistakes at once, one line each."""
    lines = []
    for check in (lambda: check_model(config.model), lambda: check_settings(config.num_fewshot, config.gen_kwargs)):
        try:
            check()
        except UserError as err:
            lines += lines_of(err)
    lines += task_lines(config.tasks, config.include_path, allow_task_code)
    if lines:
        raise several(UserError, lines)


__all__ = ["check_model", "check_nesting", "check_run", "check_settings", "nesting", "task_lines"]
