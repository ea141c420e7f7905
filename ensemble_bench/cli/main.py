"""The ``ensbench`` command line."""

from __future__ import annotations

import os
import sys

# tqdm reads its settings when it is first imported: silence the libraries' own bars (GGUF
# conversion, lm-eval's request loops) before anything imports them; runs show one rich bar.
os.environ.setdefault("TQDM_DISABLE", "1")
from pathlib import Path

import typer
from rich import box
from rich.table import Table

from ensemble_bench import settings
from ensemble_bench.cache import atomic_write_text
from ensemble_bench.cli.faults import BUG, INTERRUPTED, PipeConsole, exit_code, interrupted, set_resumable
from ensemble_bench.cli.progress import BarProgress, PlainProgress
from ensemble_bench.errors import EnvironmentFault, UserError, several, working_folder_fault

# The commands import the rest of the package inside themselves: recipes, methods, members, the
# runner and the reports load torch, transformers, lm-eval or pandas, which `ensbench --help` and a
# one-line usage error should not wait seconds for.


def _plain_help_names() -> None:
    """Help as click writes it: a flag shows no ``<bool>`` type and a command's arguments read ``RECIPE``,
    not ``{recipe}`` (typer >= 0.2x renders its own help; older versions have neither hook and need none)."""
    core = getattr(typer, "core", None)
    option, argument = getattr(core, "TyperOption", None), getattr(core, "TyperArgument", None)
    if option is not None and hasattr(option, "display_type_rich") and not hasattr(option, "_ensbench_plain"):
        typed = option.display_type_rich

        def display_type_rich(self, ctx):
            return None if getattr(self, "is_flag", False) and self.metavar is None else typed(self, ctx)

        option.display_type_rich, option._ensbench_plain = display_type_rich, True
    if argument is not None and hasattr(argument, "_usage_display_name"):
        def usage_name(self) -> str:
            name = self.metavar or self.name.upper()
            return (name if self.required else f"[{name}]") + ("..." if self.nargs != 1 else "")

        argument._usage_display_name = usage_name


_plain_help_names()
app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Benchmark training-free ensembles of LLMs with different tokenizers.")
console = PipeConsole()


def _show_version(asked: bool) -> None:
    if asked:
        from ensemble_bench import __version__

        print(f"ensbench {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                          help="Print the version and exit.")) -> None:
    """Benchmark training-free ensembles of LLMs with different tokenizers."""


def _quiet_libraries() -> None:
    """Our progress bar replaces the libraries' own bars and warnings during a run. sqlitedict (lm-eval's
    response cache) logs a failed write from its worker thread as some 60 lines of stack and raises it
    again at the next call, where it becomes our one line (disk full, read-only): its log says nothing more.
    A failed commit, which sqlitedict does not keep, is kept the same way (``cache_thread``)."""
    import logging

    import datasets
    import transformers

    from ensemble_bench.run.cache_thread import quiet_cache_thread

    logging.getLogger("sqlitedict").setLevel(logging.CRITICAL)
    quiet_cache_thread()

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity_error()


def _run_with_progress(setup):
    """Run the recipe with a live bar per row on a terminal, progress lines otherwise (progress.py): the
    members loading, the examples done per task, the row's elapsed time and an ETA."""
    from rich.progress import Progress

    from ensemble_bench.members import load_listener
    from ensemble_bench.report.summary import write_summary
    from ensemble_bench.run.runner import run_recipe

    if not console.is_terminal:
        plain = PlainProgress()
        with load_listener(plain.on_load):
            return run_recipe(setup, write_summary, progress=plain.on_progress, on_row=plain.on_row)
    with Progress(*BarProgress.columns(), console=console) as progress:
        bars = BarProgress(progress)
        with load_listener(bars.on_load):
            return run_recipe(setup, write_summary, progress=bars.on_progress, on_row=bars.on_row)


@app.command()
def run(recipe: Path = typer.Argument(..., help="YAML recipe"),
        dry_run: bool = typer.Option(False, "--dry-run", help="Validate, check the machine (models, packages, data, "
                                                              "output folder, devices, network) and print the plan; "
                                                              "load nothing."),
        fresh: bool = typer.Option(False, "--fresh", help="Start a new run even if an unfinished one exists, and "
                                                          "compute every row (no finished row of another run reused)."),
        reuse: bool = typer.Option(False, "--reuse",
                                   help="If this exact recipe has a finished run, show it; run nothing."),
        threads: int = typer.Option(settings.threads, metavar="N",
                                    help="torch CPU threads (0: default; $ENSBENCH_THREADS)."),
        limit: int = typer.Option(None, min=1, metavar="N", help="Override: at most this many examples of every task."),
        tasks: str = typer.Option(None, metavar="NAMES",
                                  help="Override: only these benchmarks, comma-separated (e.g. piqa,nq)."),
        batch_size: int = typer.Option(None, "--batch-size", min=1, metavar="N",
                                       help="Override: the recipe's batch_size."),
        output: str = typer.Option(None, metavar="DIR",
                                   help="Override: the folder results go to (~ and $VARS expanded)."),
        seed: int = typer.Option(None, min=0, metavar="N",
                                 help="Override: the recipe's seed (lm-eval's few-shot sampling and random seeds)."),
        set_: list[str] = typer.Option(None, "--set", metavar="KEY=VALUE",
                                       help="Override any field: --set method.weights=[2,1] (dotted path, list "
                                            "indices, a YAML value; repeatable).")):
    """Run a recipe: every row (members alone, the ensemble) on every task; write results and a table."""
    from ensemble_bench.cli.plan import plan_tables
    from ensemble_bench.recipe import load_recipe
    from ensemble_bench.recipe.overrides import option_overrides, parse_set
    from ensemble_bench.run.folder import SUMMARY
    from ensemble_bench.run.ranks import refuse_recipe_run
    from ensemble_bench.run.runs import finished_run
    from ensemble_bench.run.setup import run_setup

    refuse_recipe_run()
    overrides = option_overrides(limit, tasks, batch_size, output, seed) + [parse_set(text) for text in set_ or []]
    loaded = load_recipe(recipe, overrides)
    setup = run_setup(loaded, str(recipe), fresh, dry_run)  # resolved once: the plan prints it, the run acts on it
    console.print(*plan_tables(setup), sep="\n", soft_wrap=True)  # a path is never broken
    if setup.problems:
        raise several(EnvironmentFault, list(setup.problems))
    if dry_run:
        return
    done = finished_run(loaded, setup.output_root) if reuse and not fresh else None
    if done is not None:
        print((done / SUMMARY).read_text())
        console.print(f"results (reused): {done}", soft_wrap=True)
        return
    _quiet_libraries()
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    set_resumable(True)  # rows finished and answers in the response caches are kept: an interrupted run resumes
    run_dir = _run_with_progress(setup)
    print((run_dir / SUMMARY).read_text())  # scores with intervals, then what the ensemble changed
    console.print(f"results: {run_dir}", soft_wrap=True)


@app.command()
def select(runs: list[Path] = typer.Argument(..., help="finished runs, or results/<recipe> folders (their newest run)"),
           max_models: int = typer.Option(3, min=1, help="Most models to choose."),
           gap: float = typer.Option(0.10, min=0.0, max=1.0,
                                     help="Largest score gap to the best model (0.10 = 10 points)."),
           length_ratio: float = typer.Option(2.0, min=1.0, help="Largest ratio of mean response lengths."),
           tasks: str = typer.Option("", help="Comma-separated benchmarks to judge on (default: all shared)."),
           method: str = typer.Option("unite", help="Method of the written recipe."),
           out: Path = typer.Option(Path("selected.yaml"), help="Where to write the recipe.")):
    """UniTE's determine-then-ensemble: pick compatible models from earlier runs; write a recipe."""
    import yaml

    from ensemble_bench.methods import method_spec
    from ensemble_bench.methods.unite_selection import select_models
    from ensemble_bench.recipe import parse_recipe
    from ensemble_bench.report.out_files import checked_files, user_path
    from ensemble_bench.report.select import load_candidates, selected_recipe
    from ensemble_bench.report.tables import resolve_run

    method_spec(method)
    [out] = checked_files(user_path(out), [""])
    decisions = select_models(load_candidates([resolve_run(run) for run in runs]), max_models, gap, length_ratio,
                              [t for t in tasks.split(",") if t] or None)
    table = Table(title=f"determine-then-ensemble (gap <= {gap:.2f}, length ratio <= {length_ratio:g}, "
                        f"at most {max_models})")
    for column in ("model", "score %", "gap (points)", "mean words", "length ratio", "decision"):
        table.add_column(column)
    for d in decisions:
        words = d.candidate.mean_words
        table.add_row(d.candidate.label, f"{100 * d.score:.1f}", "" if d.gap is None else f"{100 * d.gap:.1f}",
                      "" if words is None else f"{words:.1f}",
                      "" if d.length_ratio is None else f"{d.length_ratio:.2f}", d.verdict)
    console.print(table)
    chosen = [d for d in decisions if d.verdict.startswith("chosen")]
    if len(chosen) < 2:
        raise UserError("only one model passes the criteria: nothing to ensemble (no recipe written)")
    data = selected_recipe(decisions, method, out.stem)
    parse_recipe(data, str(out))
    atomic_write_text(out, yaml.safe_dump(data, sort_keys=False))
    console.print(f"recipe: {out}")


def _with_interval(check, which: str) -> str:
    """An accuracy in % with its 95% Wilson interval, or a latency ratio."""
    value = check.baseline if which == "baseline" else check.current
    interval = check.interval(which)
    if check.what == "latency ratio" or interval is None:
        return f"{value:.3f}" if check.what == "latency ratio" else f"{100 * value:.1f}"
    return f"{100 * value:.1f} [{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]"


@app.command()
def regress(current: Path = typer.Argument(..., help="finished run, or results/<recipe> (its newest run)"),
            baseline: Path = typer.Option(..., help="finished run of the same recipe (or a folder holding one)"),
            confidence: float = typer.Option(0.95, min=0.5, max=0.9999,
                                             help="one-sided confidence of the accuracy check"),
            latency_tolerance: float = typer.Option(0.25, min=0.0, help="allowed growth of ms/token / sum(members)")):
    """Fail (exit 1) when accuracy drops beyond a binomial interval or the latency ratio grows."""
    from ensemble_bench.report.regress import compare, load_rows, recipe_difference
    from ensemble_bench.report.summary import finished_recipe
    from ensemble_bench.report.tables import resolve_run

    current, baseline = resolve_run(current), resolve_run(baseline)
    difference = recipe_difference(finished_recipe(current), finished_recipe(baseline))
    if difference:
        raise UserError(f"{baseline}: not a run of the same recipe as {current} ({difference}); "
                        "compare against a baseline run of this recipe")
    checks = compare(load_rows(current), load_rows(baseline), confidence, latency_tolerance)
    console.print(f"regress: {current} vs {baseline}", soft_wrap=True)
    console.print(f"accuracy in % [95% Wilson interval], limit: one-sided {confidence:.0%} binomial bound; "
                  f"latency: ratio to the same run's members x {1 + latency_tolerance:g}")
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False)  # fits 80 columns
    for column in ("row", "check", "baseline", "current", "limit", "verdict"):
        table.add_column(column, no_wrap=True)
    for c in checks:
        scale = 1 if c.what == "latency ratio" else 100
        allowed = f"{c.allowed:.3f}" if scale == 1 else f"{max(0.0, 100 * c.allowed):.1f}"
        table.add_row(c.row, c.what, _with_interval(c, "baseline"), _with_interval(c, "current"),
                      ("<= " if c.what == "latency ratio" else ">= ") + allowed,
                      "ok" if c.passed else "[bold red]REGRESSED[/]")
    console.print(table)
    failed = [c for c in checks if not c.passed]
    if failed:
        console.print(f"{len(failed)} of {len(checks)} checks regressed")
        raise typer.Exit(1)
    console.print(f"all {len(checks)} checks passed")


@app.command()
def table(runs: list[Path] = typer.Argument(..., help="finished runs, or results/<recipe> folders (their newest run)"),
          layout: str = typer.Option(None, help="a paper's table: gac_table3, unite_table4, deepen_table1, ... "
                                               "(default: every row by every benchmark of the runs)"),
          paper: bool = typer.Option(False, "--paper", help="add the paper's published numbers and the differences"),
          block: str = typer.Option(None, help="only this block of the paper's table"),
          out: Path = typer.Option(None, help="write <out>.md, <out>.tex and <out>.csv (default: print Markdown)")):
    """The runs' rows by their benchmarks, or our results in the layout of a paper's table."""
    from ensemble_bench.report.out_files import checked_files, user_path
    from ensemble_bench.report.tables import make_table, render

    formats = {".md": "markdown", ".tex": "latex", ".csv": "csv"}
    targets = checked_files(user_path(out), list(formats)) if out is not None else []
    frame, chosen = make_table(runs, layout, with_paper=paper, block=block)
    if not targets:
        print(render(frame, chosen, "markdown"))
        return
    for target in targets:
        atomic_write_text(target, render(frame, chosen, formats[target.suffix]))
    console.print("wrote " + ", ".join(map(str, targets)), soft_wrap=True)


@app.command()
def plot(runs: list[Path] = typer.Argument(..., help="finished runs, or results/<recipe> folders (their newest run)"),
         out: Path = typer.Option(..., help="path stem: writes <out>.png and <out>.svg"),
         param: str = typer.Option(None, help="a swept method parameter (threshold, span_words, k); "
                                               "default: accuracy vs latency of every row"),
         title: str = typer.Option("", help="figure title")):
    """Accuracy vs latency per row, or accuracy vs a swept parameter (members' best as dashed lines)."""
    from ensemble_bench.report.out_files import checked_files, user_path
    from ensemble_bench.report.plots import PLOT_SUFFIXES, parameter_records, plot_accuracy_latency, plot_parameter

    out = user_path(out)
    checked_files(out, PLOT_SUFFIXES)  # before the runs are read: a bad --out costs nothing
    records = parameter_records(runs, param)
    written = (plot_parameter(records, param, out, title or f"accuracy vs {param}") if param else
               plot_accuracy_latency(records, out, title or "accuracy vs latency"))
    console.print("wrote " + ", ".join(str(p) for p in written))


@app.command("list")
def list_things(details: bool = typer.Option(False, "--details", help="add each method's parameters (default and "
                                                                      "meaning) and where each benchmark's data "
                                                                      "comes from"),
                method: str | None = typer.Option(None, "--method",
                                                  help="one method's parameters: type, default, meaning")):
    """Methods, packaged offline models and benchmarks (what is missing as notes below the table)."""
    from ensemble_bench.cli.listing import listing, method_table

    if method is not None:  # one method's parameters (UserError for an unknown method)
        return console.print(method_table(method))
    console.print(*listing(details), sep="\n")


@app.command()
def compare(runs: list[Path] = typer.Argument(..., help="finished run, or results/<recipe> (its newest run); "
                                                        "several: their rows side by side, the first row against "
                                                        "the others"),
            row: list[str] = typer.Option(None, "--row", metavar="ROW",
                                          help="a row to compare (twice or more; default: all rows)"),
            benchmark: str = typer.Option(None, help="only this benchmark"),
            show: int = typer.Option(5, min=0, help="differing examples shown per benchmark"),
            out: Path = typer.Option(None,
                                     help="also write <out>.md (as printed) and <out>.csv (every differing example)")):
    """What the rows of a run (or of several runs) did differently: intervals, paired tests, oracle, differing
    examples."""
    from ensemble_bench.report.compare import build_report, render_csv, render_markdown
    from ensemble_bench.report.out_files import checked_files, user_path
    from ensemble_bench.report.tables import resolve_run

    targets = checked_files(user_path(out), (".md", ".csv")) if out is not None else []
    report = build_report([resolve_run(run) for run in runs], row or None, benchmark)
    text = render_markdown(report, show)
    print(text, end="")
    if targets:
        markdown, table = targets
        atomic_write_text(markdown, text)
        atomic_write_text(table, render_csv(report))
        console.print("wrote " + ", ".join(map(str, targets)), soft_wrap=True)


def main() -> None:
    """The ``ensbench`` entry point: exit 0 done, 1 regression or environment fault, 2 user error,
    70 a bug (with its traceback), 130 interrupted."""
    set_resumable(False)
    try:
        try:
            if (no_folder := working_folder_fault()) is not None:
                raise no_folder
            code = app(standalone_mode=False)  # a command's typer.Exit(n) comes back as n
            sys.stdout.flush()  # here, so that a reader gone before the last flush is handled too
        except SystemExit as done:  # click itself turns a broken pipe into exit 1: undo that
            if not isinstance(done.__context__, BrokenPipeError):
                raise
            raise done.__context__ from None
    except SystemExit:
        raise
    except BaseException as err:  # noqa: BLE001 - every fault ends here: one line, or a bug report
        try:
            code = exit_code(err)
        except BaseException:  # noqa: BLE001 - the handler itself must not end in a traceback
            code = BUG
    else:
        code = interrupted() if code == INTERRUPTED else code
    if isinstance(code, int) and code:
        sys.exit(code)


if __name__ == "__main__":
    main()
