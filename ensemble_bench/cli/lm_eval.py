"""``ensbench-lm-eval``: lm-eval's own command line with every ensbench method registered as a model.

lm-eval parses the command line and runs the evaluation, so every stock flag works. For an ensbench
model (``--model gac``, ...) this module first settles what lm-eval cannot know, and afterwards
writes the run in ensbench's layout:

* the method run is the one ``--model`` names (a different ``method`` in ``--model_args`` is refused);
* ``--device``: members without a device of their own are placed on it, and the results record where
  the members ran (``cpu``), never lm-eval's default ``cuda:0``;
* ``--batch_size auto``: the batch_size in ``--model_args``, else ``build.AUTO_BATCH_SIZE``;
* ``--output_path DIR``: the run folder is ``DIR/<method>-<member>+<member>`` (or ``DIR/<name>`` with
  ``name`` in ``--model_args``): recipe.yaml, the row's folder (lm-eval's results and samples files,
  timing.json) and summary.md, so ``ensbench table``, ``compare`` and ``plot`` read it;
* with the hub offline (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE), a task whose data ensbench packages
  reads the local copy, and every task is loaded before any model, so missing data is one line;
* ``--threads N`` (ensbench's own flag, default ``$ENSBENCH_THREADS``): torch's CPU threads, as
  ``ensbench run --threads`` sets them; ``--limit`` must be positive;
* for every model: the checks of lm_eval_checks.py (nesting, ``--model``, ``--num_fewshot``,
  ``--gen_kwargs``, and task code only with ``--allow_task_code``, ensbench's own flag);
* while requests run, a progress line per finished batch (examples done, elapsed time, ETA) on stderr.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
import sys
import tempfile
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import yaml

from ensemble_bench.errors import EnvironmentFault, UserError, working_folder_fault

if (_NO_FOLDER := working_folder_fault()) is not None:  # before build imports torch (see working_folder_fault)
    from ensemble_bench.cli.faults import exit_code

    sys.exit(exit_code(_NO_FOLDER))

from ensemble_bench import settings  # noqa: E402
from ensemble_bench.cache import atomic_write_text  # noqa: E402
from ensemble_bench.cli.lm_eval_checks import check_nesting, check_run  # noqa: E402
from ensemble_bench.recipe import Recipe, Row, parse_recipe  # noqa: E402
from ensemble_bench.run.build import recipe_from_model_args  # noqa: E402
from ensemble_bench.run.folder import (  # noqa: E402
    LM_EVAL_OUTPUT,
    RECIPE,
    SUMMARY,
    newest_samples,
    read_json,
    results_files,
    write_recipe,
    write_row_timing,
)
from ensemble_bench.tasks import Benchmark, get_benchmark, list_benchmarks  # noqa: E402
from ensemble_bench.tasks.ties import position_ties  # noqa: E402

DEVICE = re.compile(r"^(cpu|cuda(:\d+)?|mps)$")
HELP = "(ensbench-lm-eval run --help)"
MOST_NAME = 120  # characters of a run folder's name before it is shortened with a hash


@dataclass(frozen=True)
class Plan:
    """What one ``ensbench-lm-eval run`` of an ensbench model evaluates and where it writes."""

    recipe: Recipe  # the one-row recipe of --model_args, named like its run folder
    row: Row
    run_dir: Path | None  # None without --output_path (or with a .json one: lm-eval's files only)
    tasks: list[str]  # lm-eval's task names as --tasks resolved them
    offline: bool  # every task reads ensbench's packaged copy


def main() -> None:
    """The entry point: exit 0 done, 2 a user error, 1 an environment fault (one line each), 70 a bug."""
    from ensemble_bench.cli.faults import exit_code  # the one handler of every fault, shared with ensbench

    try:
        run_cli()
    except SystemExit:
        raise
    except BaseException as err:  # noqa: BLE001 - every fault ends here: one line, or a bug report
        sys.exit(exit_code(err))


def run_cli() -> None:
    """lm-eval's command line (sys.argv), an ensbench model's run prepared before and written after."""
    from lm_eval._cli import HarnessCLI
    from lm_eval.config.evaluate_config import EvaluatorConfig
    from lm_eval.utils import setup_logging

    from ensemble_bench.run.lm import LM_CLASSES, register_all
    from ensemble_bench.run.runner import patch_lm_eval

    patch_lm_eval()
    register_all()
    setup_logging()
    parser = HarnessCLI()
    add_own_flags(parser)
    check_nesting(sys.argv[1:])  # lm-eval's JSON parsing of --model_args recurses once per level
    args = lm_eval_step(parser.parse_args)
    if getattr(args, "command", None) != "run":
        return parser.execute(args)
    threads = vars(args).pop("threads", 0)  # ensbench's flags: lm-eval's config does not take them
    allow_task_code = vars(args).pop("allow_task_code", False)
    check_limit(getattr(args, "limit", None))
    with quiet_lm_eval():  # lm-eval reads args again when it runs, and warns (--limit) or prints (--config) then
        config = lm_eval_step(EvaluatorConfig.from_cli, args)
    check_run(config, allow_task_code)  # before lm-eval matches the tasks: a task YAML in --tasks runs its code then
    if config.model not in LM_CLASSES:
        set_threads(threads)
        return parser.execute(args)
    with tempfile.TemporaryDirectory(prefix="ensbench-tasks-") as tasks_dir:
        plan = prepare(args, config, LM_CLASSES[config.model].method_name, Path(tasks_dir))
        set_threads(threads)
        with request_progress():
            parser.execute(args)
    if plan.run_dir is not None and _writes_files():
        write_run(plan)


def _writes_files() -> bool:
    """One process alone, or rank 0 of a launcher's (lm-eval writes its files there: run/ranks.py)."""
    from ensemble_bench.run.ranks import launched

    ranks = launched()
    return ranks is None or ranks.rank == 0


def add_own_flags(parser) -> None:
    """``--threads`` and ``--allow_task_code`` on lm-eval's ``run`` command (shown in its --help)."""
    run = parser._subparsers.choices["run"]
    group = run.add_argument_group("ensbench")
    group.add_argument("--threads", type=int, default=settings.threads(), metavar="<n>",
                       help="torch CPU threads (0: torch's default; $ENSBENCH_THREADS), as ensbench run --threads")
    group.add_argument("--allow_task_code", action="store_true",
                       help="let the tasks import and run their own Python (!function), unsandboxed, as a "
                            "recipe's allow_task_code: true")


def check_limit(limit) -> None:
    """``--limit`` is a count (1 or more) or a fraction in (0, 1); anything else is refused before any
    model loads (lm-eval itself fails on a negative one only after loading them)."""
    if limit is not None and not 0 < limit < float("inf"):
        raise UserError(f"--limit {limit:g}: give a positive number of examples, or a fraction between 0 and 1 {HELP}")


def set_threads(threads: int) -> None:
    """torch's CPU threads, as ``ensbench run --threads`` sets them (0 leaves torch's choice)."""
    if threads < 0:
        raise UserError(f"--threads {threads}: give 0 (torch's default) or a positive number {HELP}")
    if threads > 0:
        import torch

        torch.set_num_threads(threads)


@contextmanager
def request_progress(write=None):
    """While lm-eval runs an ensbench model: a line on stderr per finished batch of requests (examples
    done of the pass, elapsed time, ETA) and per member load or stage of a long first use, as ``ensbench
    run`` prints them to a log."""
    from ensemble_bench.cli.main import PlainProgress
    from ensemble_bench.members import load_listener
    from ensemble_bench.run.lm import EnsembleLM

    plain = PlainProgress(write=write or (lambda text, flush=True: print(text, file=sys.stderr, flush=flush)))
    EnsembleLM.default_progress = staticmethod(lambda label, done, total: plain.on_progress(label, done, total))
    try:
        with load_listener(plain.on_load):
            yield plain
    finally:
        EnsembleLM.default_progress = None


@contextmanager
def quiet_lm_eval():
    """lm-eval's warnings and printed lines held back: for ensbench's own reading of the command line, so that
    lm-eval's reading says them once."""
    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def lm_eval_step(step, *args):
    """One of lm-eval's own checks of the command line; its ValueError is a user error of one line."""
    try:
        return step(*args)
    except (ValueError, FileNotFoundError) as err:
        raise UserError(f"{str(err).strip().splitlines()[0]} {HELP}") from None


# --- before lm-eval runs ------------------------------------------------------------------------------
def prepare(args, config, method_name: str, tasks_dir: Path) -> Plan:
    """Check everything that would stop the run before a model loads, and rewrite ``args`` so that
    lm-eval runs it: members placed, the device recorded, results in the run folder, offline tasks."""
    model_args = dict(config.model_args or {})
    _check_batch_size(args, model_args)
    extra = {"batch_size": config.batch_size, "max_batch_size": config.max_batch_size, "device": _device(args)}
    recipe = recipe_from_model_args(model_args, method_name, extra)
    row = recipe.plan[-1]
    recipe = recipe.model_copy(update={"name": model_args.get("name") or run_name(row, recipe)})
    output = config.output_path
    run_dir = Path(output) / recipe.name if output and not output.endswith(".json") else None
    _check_machine(recipe, run_dir)
    task_manager = lm_eval_step(config.process_tasks)  # resolves config.tasks; one line for an unknown task
    names = [task for task in config.tasks if isinstance(task, str)]  # (a task YAML file comes as its config)
    packaged = offline_tasks(names, tasks_dir, task_manager.task_index) if settings.hub_offline() else {}
    if settings.hub_offline():
        check_tasks_load(task_manager, [packaged.get(task, task) if isinstance(task, str) else task
                                        for task in config.tasks])
    args.include_path = [str(tasks_dir), *([config.include_path] if config.include_path else [])]
    args.model_args = {**model_args, "members": [_with_device(given, spec)
                                                 for given, spec in zip(model_args["members"], recipe.members)]}
    args.device = ",".join(dict.fromkeys(m.device if m.device_map is None else "device_map" for m in recipe.members))
    if run_dir is not None:
        args.output_path = str(_row_dir(run_dir, row) / LM_EVAL_OUTPUT)
        (run_dir / SUMMARY).unlink(missing_ok=True)  # the run is finished again when it is written anew
    return Plan(recipe, row, run_dir, names, bool(names) and len(packaged) == len(names))


def _check_batch_size(args, model_args: dict) -> None:
    """A batch size given both as --batch_size and in --model_args must agree."""
    asked = getattr(args, "batch_size", None)  # lm-eval leaves it out of args when not given
    given = model_args.get("batch_size")
    if asked is not None and given is not None and not str(asked).startswith("auto") and str(asked) != str(given):
        raise UserError(f"--batch_size {asked} but --model_args sets batch_size {given}: give it once")


def _device(args) -> str | None:
    """``--device`` if given (lm-eval's own default, cuda:0, is not used: members default to cpu)."""
    device = getattr(args, "device", None)
    if device is not None and not DEVICE.match(device):
        raise UserError(f"--device: {device!r} is not a device (cpu, cuda, cuda:N or mps) {HELP}")
    return device


def _with_device(given: dict, spec) -> dict:
    """A --model_args member with the device it is placed on written out (the results record it)."""
    return given if spec.device_map is not None else {**given, "device": spec.device}


def _row_dir(run_dir: Path, row: Row) -> Path:
    from ensemble_bench.run.folder import inside

    return inside(run_dir, row.label)


def run_name(row: Row, recipe: Recipe) -> str:
    """The run folder's name: the method and its members' labels (``gac-qwen2.5-0.5b+smollm2-135m``),
    shortened with a hash of the full name when long."""
    name = f"{row.method}-{'+'.join(recipe.members[i].label for i in row.members)}"
    if len(name) <= MOST_NAME:
        return name
    return f"{name[:MOST_NAME - 9]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def _check_machine(recipe: Recipe, run_dir: Path | None) -> None:
    """The recipe preflight of ``ensbench run`` (models, packages, devices, output and cache folders).
    The data is checked by loading the tasks (hub offline) or by lm-eval itself, so the preflight
    sees the recipe with data: offline and its placeholder task (built in: no task lines), which needs no
    network."""
    from ensemble_bench import settings
    from ensemble_bench.run.folder import output_root
    from ensemble_bench.run.preflight import preflight

    settings.check_environment()
    output = str(run_dir.parent) if run_dir is not None else recipe.output
    checked = recipe.model_copy(update={"data": "offline", "output": output})
    problems = preflight(checked, "--model_args", output_root(checked), [])
    if problems:
        raise EnvironmentFault("; ".join(problems))


def offline_tasks(names: list[str], dest: Path, stock: dict) -> dict[str, str]:
    """Task configs in ``dest`` that point each stock task ensbench packages (a single task, not a
    group) at its local copy, under the stock task's own name, prompts and shots (``stock``: lm-eval's
    task index); task name -> its config file."""
    from ensemble_bench.tasks import flores
    from ensemble_bench.tasks.offline import ensure_offline_data, offline_overrides

    packaged = {bench.task: bench for bench in list_benchmarks()  # (Flores tasks are ensbench's own, not stock)
                if bench.offline and not (bench.is_group or bench.runs_code or bench.needs)
                and flores.parse_task(bench.task) is None}
    chosen = [packaged[name] for name in dict.fromkeys(names) if name in packaged]
    root = ensure_offline_data(chosen) if chosen else None
    written = {}
    for bench in chosen:
        config = {"task": bench.task, "include": str(stock[bench.task].yaml_path), **offline_overrides(bench, root)}
        written[bench.task] = str(dest / f"{bench.task}.yaml")
        atomic_write_text(Path(written[bench.task]), yaml.safe_dump(config, sort_keys=False))
    return written


def check_tasks_load(task_manager, tasks: list) -> None:
    """Load every task before any model, with the hub offline: data that is not on this machine is one
    line now rather than a traceback after the members have loaded."""
    try:
        task_manager.load(tasks)
    except Exception as err:  # noqa: BLE001 - whatever the datasets library raises for data it cannot find
        why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        offline = settings.hub_offline()
        raise EnvironmentFault(f"--tasks: a task's data cannot be loaded with the hub offline ({offline} is set): "
                               f"{why}") from None


# --- after lm-eval ran: the run in ensbench's layout ------------------------------------------------------
def write_run(plan: Plan) -> None:
    """timing.json beside lm-eval's files, recipe.yaml, and the summary (summary.md last: the run is
    finished), so that ``ensbench table``, ``compare`` and ``plot`` read the run folder."""
    from ensemble_bench.report.summary import write_summary

    row_dir = _row_dir(plan.run_dir, plan.row)
    newest = max(results_files(row_dir), key=lambda path: path.stat().st_mtime)
    results = read_json(newest)
    info = results.get("config", {}).get("ensbench", {})
    samples = {task: read_json(path) for task, path in newest_samples(row_dir).items()}  # with --log_samples
    write_row_timing(row_dir, plan.recipe, plan.row,
                     {**{key: value for key, value in info.items() if key not in ("label", "members")},
                      "position_ties": position_ties(samples) if samples else None})
    try:
        recipe = stored_recipe(plan, results)
    except UserError as err:
        print(f"note: {plan.run_dir} holds lm-eval's files only, not an ensbench run: {err}", file=sys.stderr)
        return
    write_recipe(plan.run_dir, recipe)
    write_summary(plan.run_dir, recipe)
    print(f"ensbench run folder: {plan.run_dir} (ensbench table / compare / plot read it)")


def stored_recipe(plan: Plan, results: dict) -> Recipe:
    """The recipe of the run as it ran: its tasks (by benchmark name where ensbench has one), shots,
    limit and data."""
    data = plan.recipe.model_dump(mode="json", exclude_none=True)
    data.update(tasks=[_task_entry(name, results.get("n-shot", {})) for name in plan.tasks],
                data="offline" if plan.offline else "hub", output=str(plan.run_dir.parent))
    limit = results.get("config", {}).get("limit")
    if isinstance(limit, (int, float)) and limit >= 1 and float(limit).is_integer():
        data["limit"] = int(limit)
    return parse_recipe(data, str(plan.run_dir / RECIPE))


BENCHMARK_OF_TASK: dict[str, Benchmark] = {bench.task: bench for bench in list_benchmarks()}


def _task_entry(task: str, shots: dict) -> dict:
    """A recipe's task entry for an lm-eval task: its benchmark (and variant) when ensbench has one."""
    bench = BENCHMARK_OF_TASK.get(task)
    entry: dict = {"name": bench.name if bench else task}
    if bench is not None and get_benchmark(bench.name) != bench:
        entry["variant"] = bench.variant
    if isinstance(shots.get(task), int):
        entry["shots"] = shots[task]
    return entry
