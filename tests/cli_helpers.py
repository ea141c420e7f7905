"""Running ``ensbench`` in-process from a test, and the recipes and readers the CLI tests share."""

import json
import re
import sys
import textwrap

from ensemble_bench.cli import main as cli

ONE_MEMBER = textwrap.dedent("""\
    name: hostile
    members:
      - model: smollm2-135m
        name: {name}
    method: single
    tasks:
      - name: piqa
        limit: 2
    data: offline
    output: {output}
""")


def run_cli(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["ensbench", *args])
    try:
        cli.main()
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    return code, capsys.readouterr()


def dry_run(monkeypatch, capsys, tmp_path, text):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    return run_cli(monkeypatch, capsys, "run", str(recipe), "--dry-run")


def raising(err):
    """A stand-in for the CLI's app that raises ``err``."""
    def app(**_):
        raise err
    return app


def one_line(out) -> str:
    """The one line on stderr (in-process runs also show lm-eval's tqdm bars: tqdm was imported before
    the CLI could turn it off)."""
    lines = [line for line in out.err.strip().splitlines() if line.strip() and not re.search(r"\d+%\|", line)]
    assert len(lines) == 1, out.err
    assert "Traceback" not in out.err + out.out
    return lines[0]


def tiny_recipe(dirs, output, limit=4):
    return textwrap.dedent(f"""\
        name: tiny-faults
        members:
          - {{model: {dirs[0]}, name: bpe}}
          - {{model: {dirs[1]}, name: sp}}
        method: {{name: gac, threshold: 0.6, gate: bpe}}
        singles: true
        tasks:
          - {{name: piqa, limit: {limit}}}
        batch_size: 2
        data: offline
        output: {output}
    """)


def row_files(row_dir):
    """What a row wrote, keyed by file kind: results (without timing and dates) and samples."""
    found = {}
    for path in sorted(row_dir.glob("samples_*.jsonl")):
        records = map(json.loads, path.read_text().splitlines())
        found[path.name.split("_")[1]] = [(r["doc_id"], r["resps"]) for r in records]
    [results] = row_dir.glob("results_*.json")
    found["results"] = json.loads(results.read_text())["results"]
    return found
