"""Whitespace that lm-eval doubles (issue 39, item 1): the documented task template renders single spaces
through lm-eval, the plan warns about a template that doubles its delimiter's space, the summary warns
about answers that miss only by whitespace, and `ensbench compare` shows whitespace."""

import json
import re
import textwrap
from pathlib import Path

import pytest

from ensemble_bench.report.compare import build_report, render_markdown
from ensemble_bench.report.whitespace_notes import whitespace_section, whitespace_warnings
from ensemble_bench.tasks.whitespace import answer_warning, doubled_target, template_warning, whitespace_misses
from tests.cli_helpers import run_cli
from tests.fake_runs import fake_run

REPO = Path(__file__).resolve().parents[2]
CAPITALS = [("France", "Paris"), ("Russia", "Moscow"), ("Germany", "Berlin")]


def documented_task_yaml(data_file: Path) -> str:
    """The task YAML of docs/own_experiment.md, its data file pointed at ``data_file``."""
    doc = (REPO / "docs" / "own_experiment.md").read_text()
    [block] = re.findall(r"```yaml\n(task: capitals\n.*?)```", doc, re.S)
    return re.sub(r"test: \S+", f"test: {data_file}", block)


def capitals_folder(root: Path, task_text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    data = root / "capitals.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is the capital of {c}?", "answer": a}) + "\n"
                            for c, a in CAPITALS))
    folder = root / "my_tasks"
    folder.mkdir()
    (folder / "capitals.yaml").write_text(task_text.replace("DATA", str(data)))
    return folder


def test_the_documented_task_yaml_renders_single_spaces_through_lm_eval(tmp_path):
    from lm_eval.tasks import TaskManager

    folder = capitals_folder(tmp_path, documented_task_yaml(tmp_path / "capitals.jsonl"))
    task = TaskManager(include_path=str(folder), include_defaults=False).load(["capitals"])["tasks"]["capitals"]
    task.set_fewshot_seed(1234)
    doc = task.test_docs()[0]
    context = task.fewshot_context(doc, num_fewshot=2)
    shown = re.findall(r"A:(\s*)(\w+)", context)
    assert len(shown) == 2 and {answer for _, answer in shown} <= {a for _, a in CAPITALS}
    assert all(space == " " for space, _ in shown), context  # "A: Moscow", never "A:  Moscow"
    assert template_warning("capitals", {"doc_to_target": "{{answer}}"}) is None


class SpacedCapitals:
    """An lm-eval model that answers each question with its capital as the members did after ``A:``: with a
    leading space (``' Paris'``), unless the prompt already ends with whitespace."""

    @staticmethod
    def make():
        from lm_eval.api.model import LM

        class Stub(LM):
            def generate_until(self, requests):
                answers = dict(CAPITALS)
                asked = [re.findall(r"capital of (\w+)\?", request.args[0])[-1] for request in requests]
                return [("" if request.args[0][-1:].isspace() else " ") + answers[country]
                        for request, country in zip(requests, asked)]

            def loglikelihood(self, requests):
                raise NotImplementedError

            def loglikelihood_rolling(self, requests):
                raise NotImplementedError

        return Stub()


def exact_match_of(task_text: str, tmp_path: Path) -> float:
    """The task's exact match through lm-eval's simple_evaluate, 2-shot, every question, the stub answering."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    folder = capitals_folder(tmp_path, task_text)
    results = simple_evaluate(model=SpacedCapitals.make(), tasks=["capitals"], num_fewshot=2, bootstrap_iters=0,
                              task_manager=TaskManager(include_path=str(folder), include_defaults=False),
                              fewshot_random_seed=1234, verbosity="ERROR")
    [score] = [value for key, value in results["results"]["capitals"].items() if key.startswith("exact_match,")]
    return score


def test_the_documented_task_yaml_scores_answers_that_start_with_a_space(tmp_path):
    """Issue 47: with the documented template, members answering ' Paris' scored 0 on every row."""
    assert exact_match_of(documented_task_yaml(Path("DATA")), tmp_path) == 1.0


def test_the_other_convention_a_prompt_ending_with_the_space_scores_too(tmp_path):
    task = documented_task_yaml(Path("DATA"))
    task = re.sub(r"filter_list:.*?(?=metric_list:)", "", task, flags=re.S)  # no filter: the prompt decides
    assert exact_match_of(task, tmp_path / "plain") == 0.0  # ' Paris' for 'Paris'
    spaced = task.replace('"Q: {{question}}\\nA:"', '"Q: {{question}}\\nA: "') + 'target_delimiter: ""\n'
    assert spaced != task
    assert exact_match_of(spaced, tmp_path / "spaced") == 1.0


def test_a_target_template_with_a_leading_space_is_named_once_unless_the_delimiter_adds_none():
    line = template_warning("capitals", {"doc_to_target": " {{answer}}"})
    assert line.startswith("capitals: the few-shot target ' {{answer}}' starts with whitespace")
    assert "target_delimiter ' '" in line and "\n" not in line
    assert template_warning("capitals", {"doc_to_target": " {{answer}}", "target_delimiter": ""}) is None
    assert template_warning("capitals", {"doc_to_target": "answer"}) is None  # a field: the samples decide
    assert doubled_target("t", "\tParis", "\n") is not None and doubled_target("t", "Paris") is None


def pair_recipe(tiny_dirs, folder: Path, name: str) -> Path:
    path = folder.parent / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        members:
          - {{model: {tiny_dirs[0]}, name: a}}
          - {{model: {tiny_dirs[1]}, name: b}}
        method: gac
        include_path: {folder}
        tasks: [{{name: capitals, num_fewshot: 2}}]
        data: offline
        output: {folder.parent / "results"}
        """))
    return path


@pytest.mark.parametrize("target,warned", [('" {{answer}}"', True), ('"{{answer}}"', False)])
def test_the_plan_warns_about_a_doubled_space_before_anything_loads(tiny_dirs, tmp_path, monkeypatch, capsys,
                                                                    target, warned):
    task = documented_task_yaml(Path("DATA")).replace('"{{answer}}"', target)
    recipe = pair_recipe(tiny_dirs, capitals_folder(tmp_path, task), "spaces")
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe), "--dry-run")
    assert code == 0, out.err
    lines = [line for line in out.out.splitlines() if line.startswith("warning: capitals:")]
    assert len(lines) == (1 if warned else 0), out.out


def generated(doc_id: int, answer: str, target: str, right: float, filter_name: str = "none") -> dict:
    return {"doc_id": doc_id, "doc": {"question": f"capital {doc_id}?"}, "target": target,
            "arguments": {"gen_args_0": {"arg_0": "Q: ?\nA:", "arg_1": {"until": ["\n"]}}},
            "resps": [[answer]], "filtered_resps": [answer], "filter": filter_name, "metrics": ["exact_match"],
            "doc_hash": f"d{doc_id}", "exact_match": right}


def test_answers_that_miss_only_by_whitespace_are_counted_and_warned_past_a_few():
    spaced = [generated(k, "  Berlin", "Berlin", 0.0) for k in range(3)]
    right = [generated(3, "Berlin", "Berlin", 1.0), generated(4, "Bonn", "Berlin", 0.0)]
    assert whitespace_misses(spaced + right) == (3, 5, ("  Berlin", "Berlin"))
    line = answer_warning("gemma", "capitals", spaced + right)
    assert line == ("gemma: capitals: 3 of 5 answers differ from the target only by surrounding whitespace "
                    "(e.g. '  Berlin' for 'Berlin'), so they score 0: add a remove_whitespace filter to the task's "
                    "filter_list (as lm-eval's nq_open does), or end doc_to_text with the space and set "
                    "target_delimiter: '' (docs/own_experiment.md)")
    assert answer_warning("gemma", "capitals", spaced[:2] + right) is None  # two of five: a few
    assert answer_warning("gemma", "capitals", spaced[:1]) is not None      # every answer


NQ_RECIPE = {"name": "pair", "members": [{"model": "smollm2-135m", "name": "a"},
                                        {"model": "qwen2.5-0.5b", "name": "b"}],
             "method": "gac", "singles": True, "data": "offline", "tasks": [{"name": "nq", "limit": 4}]}


@pytest.fixture()
def spaced_run(tmp_path):
    """A finished run whose targets start with a space (delimiter ' ') and whose row a answers '  x'."""
    rows = {label: ("single" if label != "gac" else "gac", {"nq": (0.25, 4)}, {}) for label in ("a", "b", "gac")}
    run = fake_run(tmp_path / "results" / "pair" / "20260101-000000-abc", rows, NQ_RECIPE)
    for label in rows:
        samples = [generated(k, ("  " if label == "a" else " ") + f"city{k}" if k < 3 else "other", f" city{k}",
                             1.0 if label != "a" and k < 3 else 0.0, "remove_whitespace") for k in range(4)]
        (run / label / "samples_nq_open_2026-01-01T00-00-00.0.jsonl").write_text(
            "".join(json.dumps(s) + "\n" for s in samples))
        results = json.loads((run / label / "results_1.json").read_text())
        results["configs"] = {"nq_open": {"target_delimiter": " "}}
        (run / label / "results_1.json").write_text(json.dumps(results))
    return run


def test_the_summary_names_the_doubled_target_once_and_the_row_whose_answers_miss_by_whitespace(spaced_run):
    lines = whitespace_warnings(spaced_run, ["a", "b", "gac"])
    assert len(lines) == 2 and lines[0].startswith("nq_open: the few-shot target ' city0' starts with whitespace")
    assert lines[1].startswith("a: nq_open: 3 of 4 answers differ from the target only by surrounding whitespace")
    assert whitespace_section(spaced_run, ["a", "b", "gac"]).startswith("\n## Warnings\n\n- warning: nq_open:")


def test_compare_shows_answers_and_targets_with_their_whitespace(spaced_run):
    text = render_markdown(build_report(spaced_run, benchmark=None), show=5)
    assert "  target: ' city0'" in text
    assert "  - a: '  city0' (wrong)" in text and "  - b: ' city0' (right)" in text


def test_a_run_of_the_doubled_template_warns_in_its_summary(tiny_dirs, tmp_path, monkeypatch, capsys):
    task = documented_task_yaml(Path("DATA")).replace('"{{answer}}"', '" {{answer}}"')
    recipe = pair_recipe(tiny_dirs, capitals_folder(tmp_path, task), "spaced")
    code, out = run_cli(monkeypatch, capsys, "run", str(recipe), "--limit", "2", "--threads", "1",
                        "--set", "tasks[0].gen_kwargs.max_gen_toks=4")
    assert code == 0, out.err[-2000:]
    [summary] = (tmp_path / "results" / "spaced").glob("*/summary.md")
    warnings = [line for line in summary.read_text().splitlines() if line.startswith("- warning: capitals:")]
    assert len(warnings) == 1 and re.search(r"the few-shot target ' (Paris|Moscow|Berlin)' starts", warnings[0])
    assert "warning: capitals: the few-shot target ' {{answer}}'" in out.out  # the plan, before anything loads


def test_table_latex_compare_and_plot_carry_the_summarys_whitespace_warnings(spaced_run):
    """Issue 47: `table`, LaTeX, `plot` and `compare` showed the zeros with no warning."""
    from ensemble_bench.report.latex import escape
    from ensemble_bench.report.plots import parameter_records
    from ensemble_bench.report.tables import make_table, render

    expected = whitespace_warnings(spaced_run, ["a", "b", "gac"])
    assert len(expected) == 2 and "remove_whitespace filter" in expected[1]
    frame, layout = make_table([spaced_run], None)
    markdown, latex = render(frame, layout, "markdown"), render(frame, layout, "latex")
    frame, layout = make_table([spaced_run], "deepen_table1")
    paper = render(frame, layout, "markdown")
    compared = render_markdown(build_report(spaced_run, benchmark=None), show=0)
    plotted: list[str] = []
    parameter_records([spaced_run], None, warn=plotted.append)
    for line in expected:
        assert f"- warning: {line}" in markdown and f"- warning: {line}" in paper and f"- warning: {line}" in compared
        assert f"\\par {escape('warning: ' + line)}" in latex
    assert plotted == expected
