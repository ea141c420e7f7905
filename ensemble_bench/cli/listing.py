"""What ``ensbench list`` prints: the methods (with ``--details`` each parameter's default and meaning),
the packaged offline models and the benchmarks, with a numbered note for each one that cannot run here."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ensemble_bench.tasks import list_benchmarks


def method_table(method: str) -> Table:
    """One method's parameters: name, type, default, meaning (UserError for an unknown method)."""
    from ensemble_bench.methods import describe_params

    params = Table(*("name", "type", "default", "meaning"), title=f"method {method}: parameters")
    for param in describe_params(method):
        params.add_row(*(Text(value) for value in param))
    return params


def _methods_table() -> Table:
    from ensemble_bench.methods import DECLARED, describe_params

    methods = Table(title="methods (--details: each parameter's default and meaning)")
    methods.add_column("name", no_wrap=True)
    methods.add_column("members", no_wrap=True)
    methods.add_column("parameters")
    for name, cls in sorted(DECLARED.items()):
        count = f"{cls.min_members}" + ("+" if cls.max_members is None else f"-{cls.max_members}")
        param_names = ", ".join(p.name for p in describe_params(name)) or "-"
        methods.add_row(name, "1 per row" if cls.alone else count, param_names)
    return methods


def _method_blocks() -> list:
    """Per method, a heading (its name and member count) and a grid of its parameters: ``name = default``
    beside the meaning, which wraps at words under itself (readable at 80 columns)."""
    from ensemble_bench.methods import DECLARED, describe_params

    blocks: list = [Text("methods and their parameters (name = default, meaning; ensbench list --method NAME adds "
                         "the types)", style="italic")]
    for name, cls in sorted(DECLARED.items()):
        count = "1 per row" if cls.alone else f"{cls.min_members}" + (
            "+" if cls.max_members is None else f"-{cls.max_members}")
        blocks.append(Text.assemble((name, "bold"), f"  members: {count}"))
        params = describe_params(name)
        if not params:
            blocks.append(Text("  (no parameters)"))
            continue
        grid = Table.grid(padding=(0, 2, 0, 0))
        grid.add_column(width=1)
        grid.add_column(max_width=28, overflow="fold")
        grid.add_column(ratio=1)
        for param in params:
            grid.add_row("", Text(f"{param.name} = {param.default}"), Text(param.meaning or "-"))
        blocks.append(grid)
    return blocks


def _models_table() -> Table:
    from ensemble_bench.members.sources import PACKAGED

    models = Table(title="packaged offline models (fetched from PyPI on first use)")
    models.add_column("name", no_wrap=True)
    models.add_column("what")
    for model in PACKAGED.values():
        models.add_row(model.name, model.description)
    return models


def listing(details: bool) -> list:
    """Everything ``ensbench list`` prints, in order (``details``: blocks of facts instead of short tables)."""
    methods = _method_blocks() if details else [_methods_table()]
    benchmarks = _benchmark_blocks() if details else [_benchmark_table()]
    notes = [Text(f"[{number}] {name}: {needs}") for number, (name, needs) in enumerate(_missing(), 1)]
    return [*methods, _models_table(), *benchmarks, *notes]


def _label(bench) -> str:
    return bench.name if bench.variant == "default" else f"{bench.name}/{bench.variant}"


def _offline_missing(bench) -> str | None:
    """What this machine lacks to build the benchmark's offline copy (BBH: its folder), unless built."""
    from ensemble_bench.tasks.data_store import data_root, is_complete
    from ensemble_bench.tasks.offline_data import LOCAL_DATASETS

    spec = LOCAL_DATASETS.get(bench.name) if bench.offline else None
    needs = spec.missing() if spec is not None else None
    return needs if needs and not is_complete(spec, data_root()) else None


def _missing() -> list[tuple[str, str]]:
    """(benchmark, what it needs) of the benchmarks that cannot run yet, or not with data: offline, one
    note each (naming no path of this machine)."""
    notes = []
    for b in list_benchmarks():
        if b.needs:
            notes.append((_label(b), b.needs))
        elif needs := _offline_missing(b):
            notes.append((_label(b), f"for data: offline, {needs}"))
    return notes


def _status(bench, notes: list[str]) -> str:
    """ready, or the note that says what is missing: ``needs [n]``, or ``hub only [n]`` (no offline copy here)."""
    if _label(bench) not in notes:
        return "ready"
    return f"{'needs' if bench.needs else 'hub only'} [{notes.index(_label(bench)) + 1}]"


def _offline_column(bench) -> str:
    """Whether ``data: offline`` can run the benchmark here: yes, fixture (ensbench's own small stand-in),
    no (no offline copy exists), or "not here" (one can be built, from what this machine lacks: its note)."""
    from ensemble_bench.tasks.offline_data import LOCAL_DATASETS

    spec = LOCAL_DATASETS.get(bench.name) if bench.offline else None
    if spec is None:
        return "no"
    if _offline_missing(bench):
        return "not here"
    return "fixture" if "fixture" in spec.source else "yes"


def _benchmark_table() -> Table:
    """Short columns; a benchmark that cannot run points at its numbered note below the table."""
    benches = Table(title="benchmarks (--details: where the data comes from)")
    for column in ("name", "variant", "shots", "metric", "offline", "status"):
        benches.add_column(column, no_wrap=True, overflow="fold")
    notes = [name for name, _ in _missing()]
    for b in list_benchmarks():
        benches.add_row(b.name, b.variant, str(b.default_shots), b.primary_metric.split(",")[0], _offline_column(b),
                        _status(b, notes))
    return benches


def _benchmark_blocks() -> list[Text]:
    """One block per benchmark, a fact per line (readable at 80 columns, long values wrap at words)."""
    from ensemble_bench.tasks.offline_data import LOCAL_DATASETS

    blocks = [Text("benchmarks (data: hub reads the hub dataset; data: offline a local copy built from the "
                   "offline source)", style="italic")]
    notes = [name for name, _ in _missing()]
    for b in list_benchmarks():
        spec = LOCAL_DATASETS.get(b.name) if b.offline else None
        block = Text.assemble((_label(b), "bold"), f"  {_status(b, notes)}\n")
        block.append(f"  lm-eval task: {b.task}, shots: {b.default_shots}, metric key: {b.primary_metric}\n")
        block.append(f"  hub dataset: {spec.hub_id if spec else 'the stock lm-eval task'}\n")
        block.append(f"  offline source: {spec.source if spec else 'none'}")
        blocks.append(block)
    return blocks
