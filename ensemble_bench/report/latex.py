"""LaTeX that compiles whatever the text: every cell, header, caption and note escaped, so that a
header ``nq 95%`` or a row ``openchat_3.5`` is printed as written (not a comment, not a subscript)."""

from __future__ import annotations

import re

import pandas as pd

SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
            "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def escape(text: object) -> str:
    """``text`` as LaTeX prints it literally."""
    return "".join(SPECIALS.get(char, char) for char in str(text))


def cell(text: object) -> str:
    """A tabular cell: escaped, and a leading ``[`` kept from being read as the optional argument of
    the ``\\\\`` or ``\\midrule`` before it."""
    escaped = escape(text)
    return "{}" + escaped if escaped.startswith("[") else escaped


def label_text(label: str) -> str:
    """A ``\\label`` key of letters, digits, ``:``, ``.`` and ``-`` only (``tab:gac-table3``)."""
    return re.sub(r"[^A-Za-z0-9:.-]", "-", label)


PREAMBLE = ("\\usepackage{booktabs}", "\\usepackage[T1]{fontenc}")
REQUIRES = f"% ensbench table: needs {' and '.join(PREAMBLE)} in the document's preamble\n"


def latex_table(frame: pd.DataFrame, caption: str, label: str, notes: list[str] = (),
                right: list[bool] | None = None) -> str:
    """A ``table`` environment with a booktabs tabular of ``frame`` (cells as text), the notes as
    paragraphs under it, after a comment naming the packages it needs (:data:`PREAMBLE`). ``right``:
    per column, whether it is right-aligned (numbers; default: every column but the first)."""
    shown = frame.astype(object).where(frame.notna(), "")
    shown = shown.map(cell).rename(columns=cell)
    right = right if right is not None else [index > 0 for index in range(len(frame.columns))]
    body = shown.to_latex(index=False, escape=False, caption=escape(caption), label=label_text(label),
                          column_format="".join("r" if is_right else "l" for is_right in right))
    if notes:
        end = body.rindex("\\end{table}")
        body = body[:end] + "".join(f"\\par {escape(note)}\n" for note in notes) + body[end:]
    return REQUIRES + body


def standalone(table: str) -> str:
    """A whole document holding ``table`` (what :func:`latex_table` returns): compiles with pdflatex as is."""
    return ("\\documentclass{article}\n" + "".join(f"{line}\n" for line in PREAMBLE)
            + f"\\begin{{document}}\n{table}\\end{{document}}\n")
