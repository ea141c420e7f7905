"""Notes the plan gives before anything loads (plan.py): a parameter that does nothing for a task type
(issue 47: `core: true` on multiple choice for GaC)."""

import textwrap

from tests.cli_helpers import dry_run

RECIPE = textwrap.dedent("""\
    name: notes
    members:
      - {{model: smollm2-135m, name: smollm2}}
      - {{model: qwen2.5-0.5b, name: qwen2.5}}
    methods:
      - {{name: gac, label: gac}}
      - {{name: gac, label: gac-core, core: true, core_beta: 3.0}}
      - {{name: unite, label: unite-core, primary: qwen2.5, core: true}}
      - {{name: sweetspan, label: sweetspan-8, span_words: 8}}
    tasks:
      {tasks}
    data: offline
    output: {output}
    """)


def notes(monkeypatch, capsys, tmp_path, tasks: str) -> list[str]:
    code, out = dry_run(monkeypatch, capsys, tmp_path, RECIPE.format(tasks=tasks, output=tmp_path / "results"))
    assert code == 0, out.err
    return [line for line in out.out.splitlines() if line.startswith("note: row ")]


def test_the_plan_names_parameters_that_do_nothing_on_multiple_choice(monkeypatch, capsys, tmp_path):
    found = notes(monkeypatch, capsys, tmp_path, "[{name: piqa, limit: 2}, {name: nq, limit: 2}]")
    assert found == [
        "note: row gac-core: core, core_beta do nothing on the multiple-choice benchmarks (piqa): GaC scores an "
        "option by the weighted average of its members' sequence probabilities",
        "note: row sweetspan-8: span_words does nothing on the multiple-choice benchmarks (piqa): span-level "
        "methods score an option by their members' mean log-likelihood (no spans, no lead)"]  # UniTE's CoRE acts


def test_no_such_note_without_a_multiple_choice_benchmark(monkeypatch, capsys, tmp_path):
    assert notes(monkeypatch, capsys, tmp_path, "[{name: nq, limit: 2}]") == []
