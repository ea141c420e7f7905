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


def latex_table(frame: pd.DataFrame, caption: str, label: str, notes: list[str] = ()) -> str:
    """A ``table`` environment with a booktabs tabular of ``frame`` (cells as text), the notes as
    paragraphs under it."""
    shown = frame.astype(object).where(frame.notna(), "")
    shown = shown.map(cell).rename(columns=cell)
    body = shown.to_latex(index=False, escape=False, caption=escape(caption), label=label_text(label))
    if notes:
        end = body.rindex("\\end{table}")
        body = body[:end] + "".join(f"\\par {escape(note)}\n" for note in notes) + body[end:]
    return body
