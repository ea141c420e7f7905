"""The LaTeX `ensbench table` writes compiles: every special character of a cell, a header, the
caption or a note is escaped (a header `nq 95%` is no comment, a label `openchat_3.5` no subscript).
Compiled with pdflatex where one is installed; everywhere, read by a strict checker: braces
balanced, no unescaped special outside a command, as many `&` per tabular line as columns - 1.
The committed tables in docs/tables pass the same checker."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ensemble_bench.report.latex import cell, escape
from ensemble_bench.report.tables import build_run_table, build_table, get_layout, layouts, render
from tests.fake_runs import fake_run

DOCS_TABLES = Path(__file__).resolve().parents[2] / "docs" / "tables"
SPECIALS = "&%$#_{}~^\\"
NASTY = "openchat_3.5 & co #1 {50%} ~x^2 $5 C:\\tmp"


def strict_problems(tex: str) -> list[str]:
    """What would make this LaTeX fail or print something else than its text, one line each."""
    problems, depth, columns = [], 0, None
    for number, line in enumerate(tex.splitlines(), 1):
        if line.startswith("%"):  # a comment line (the preamble requirements)
            continue
        spec = re.search(r"\\begin\{tabular\}\{([lrc]+)\}", line)
        if spec:
            columns = len(spec.group(1))
        if columns is not None and line.lstrip().startswith("["):
            problems.append(f"line {number}: '[' read as the optional argument of the command before it")
        ampersands = 0
        position = 0
        while position < len(line):
            char = line[position]
            if char == "\\":
                command = re.match(r"\\([A-Za-z]+|.)", line[position:])
                if command is None:
                    problems.append(f"line {number}: a backslash ends the line")
                    break
                position += len(command.group(0))
                continue
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth < 0:
                    problems.append(f"line {number}: '}}' closes nothing")
                    depth = 0
            elif char == "&":
                ampersands += 1
            elif char in "%$#_~^":
                problems.append(f"line {number}: unescaped {char!r}")
            position += 1
        if ampersands and columns is not None and ampersands != columns - 1:
            problems.append(f"line {number}: {ampersands + 1} cells in a {columns}-column tabular")
        elif ampersands and columns is None:
            problems.append(f"line {number}: '&' outside a tabular")
    if depth:
        problems.append(f"{depth} '{{' never closed")
    return problems


def test_the_checker_finds_what_breaks_latex():
    assert strict_problems("a & b \\\\") == ["line 1: '&' outside a tabular"]
    assert strict_problems("\\begin{tabular}{ll}\nnq 95% & x \\\\\n") == ["line 2: unescaped '%'"]
    assert strict_problems("\\begin{tabular}{ll}\nopenchat_3.5 & {x \\\\\n") == ["line 2: unescaped '_'",
                                                                                "1 '{' never closed"]
    assert strict_problems("\\begin{tabular}{lll}\na & b \\\\\n") == ["line 2: 2 cells in a 3-column tabular"]
    assert strict_problems("\\begin{tabular}{l}\n\\midrule\n[1, 2] \\\\\n") == [
        "line 3: '[' read as the optional argument of the command before it"]
    assert strict_problems("\\begin{tabular}{ll}\nnq 95\\% & openchat\\_3.5 \\\\\n\\end{tabular}") == []


def test_escape_prints_every_special_character_as_written():
    escaped = escape(NASTY)
    assert not strict_problems(f"\\caption{{{escaped}}}")
    assert escaped == ("openchat\\_3.5 \\& co \\#1 \\{50\\%\\} \\textasciitilde{}x\\textasciicircum{}2 \\$5 "
                       "C:\\textbackslash{}tmp")


def test_a_cell_that_starts_with_a_bracket_is_no_optional_argument():
    assert cell("[4.3, 21.4]") == "{}[4.3, 21.4]" and cell("a [b]") == "a [b]"


def _compiles(tex: str, folder: Path) -> None:
    document = folder / "table.tex"
    document.write_text("\\documentclass{article}\n\\usepackage[T1]{fontenc}\n\\usepackage{booktabs}\n"
                        f"\\begin{{document}}\n{tex}\n\\end{{document}}\n", encoding="utf-8")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", document.name],
                          cwd=folder, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]


@pytest.fixture()
def nasty_run(tmp_path):
    recipe = {"name": "my_run", "members": [{"model": "smollm2-135m", "name": "openchat_3.5"},
                                          {"model": "qwen2.5-0.5b", "name": "b"}],
              "method": {"name": "gac", "label": "gac_t0.5"}, "singles": True, "data": "offline",
              "tasks": [{"name": "nq", "limit": 50}, {"name": "arc_c", "limit": 50}]}
    rows = {"openchat_3.5": ("single", {"nq": (0.04, 50), "arc_c": (0.5, 50)}, {"decode_ms_per_token": 100.0}),
            "b": ("single", {"nq": (0.06, 50)}, {"decode_ms_per_token": 250.0}),
            "gac_t0.5": ("gac", {"nq": (0.10, 50)}, {"decode_ms_per_token": 340.0})}
    return fake_run(tmp_path / "results" / "my_run" / "20260101-000000-abc", rows, recipe)


def test_a_table_without_layout_is_escaped(nasty_run, tmp_path):
    frame, layout = build_run_table([nasty_run])
    tex = render(frame, layout, "latex")
    assert not strict_problems(tex), strict_problems(tex)
    assert "openchat\\_3.5" in tex and "gac\\_t0.5" in tex and "nq 95\\%" in tex
    if shutil.which("pdflatex"):
        _compiles(tex, tmp_path)


@pytest.mark.parametrize("name", sorted(layouts()))
def test_every_layout_writes_latex_that_compiles(name, nasty_run, tmp_path):
    layout = get_layout(name)
    tex = render(build_table(layout, [nasty_run], with_paper=True), layout, "latex")
    assert not strict_problems(tex), strict_problems(tex)
    if shutil.which("pdflatex"):
        _compiles(tex, tmp_path)


@pytest.mark.parametrize("path", sorted(DOCS_TABLES.glob("*.tex")), ids=lambda p: p.name)
def test_the_committed_tables_are_escaped(path):
    assert not strict_problems(path.read_text(encoding="utf-8")), strict_problems(path.read_text(encoding="utf-8"))
