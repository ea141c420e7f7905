"""Hostile inputs for tests/cli/test_fuzz.py, and an in-process runner that checks what the CLI did.

Recipes: the shipped recipes (every file under recipes/) with one to three mutations each (wrong
types; negative, huge, NaN and inf numbers; unknown and repeated keys and entries; unicode, path-like
and very long strings; deep nesting; anchors, aliases and alias bombs), written back as YAML text.
Argument vectors: every command of ``ensbench``, with options drawn from its real option names and
hostile or plausible values, pointed at a sandbox folder holding fake finished runs.

Every CLI call runs inside a sandbox (a fresh temporary folder that is also the working directory
and $HOME) with a time limit; the sandbox tree is compared before and after the call.
"""

import contextlib
import copy
import io
import math
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import typer.main
import yaml
from hypothesis import strategies as st

from ensemble_bench.cli import main as cli
from ensemble_bench.methods import METHODS
from ensemble_bench.recipe import MemberSpec, MethodSpec, PlacementSpec, Recipe, TaskSpec
from tests.fake_runs import BASE_RECIPE, ROWS, fake_run
from tests.tolerances import HANG_GUARD_S

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = {str(p.relative_to(ROOT)): yaml.safe_load(p.read_text()) for p in sorted((ROOT / "recipes").rglob("*.yaml"))}
# CPU seconds one CLI call may use: an alias bomb or a quadratic loop shows as a hang instead of stalling the
# suite. CPU time, not wall time: other processes loading the machine do not add to it.
CALL_LIMIT_S = 20
CACHE = os.environ.get("ENSBENCH_CACHE") or str(Path.home() / ".cache" / "ensbench")  # the real one, before $HOME moves
MPL_CONFIG = tempfile.mkdtemp(prefix="ensbench-fuzz-mpl-")  # matplotlib's font cache, outside every sandbox
MAX_ERROR_CHARS = 20_000  # an error is one clear line: an alias bomb echoed back in full is not

# --- values ---------------------------------------------------------------------------------------------------
NAN, INF = float("nan"), float("inf")
SPECIAL_NUMBERS = [-1, 0, 1, -(2**63), 2**64, 10**30, 99999999999, 2**32, 1e308, -1e-300, NAN, INF, -INF, 0.5, -0.0]
PATH_LIKE = ["../x", "../../victim", "/etc", "/", "~", "~/x", "~root", "$HOME/x", "${HOME}", ".", "..", "a/b",
             "./out", "", " ", "-", "--help", "x" * 300, "a\\b", "nul", "out\nnext", "%s%n", "{0}", "[red]x[/red]",
             "caf\u00e9", "\u202eevil", "\U0001f600", "\u0000"]
PLAUSIBLE = ["gac", "single", "unite", "piqa", "nq", "gsm8k", "smollm2-135m", "qwen2.5-0.5b", "average", "cpu",
             "cuda:0", "float16", "auto", "ray", "hub", "offline", "local"]
TAGS = ["!!python/object/apply:os.system ['touch pwned']", "!!python/name:os.system", "!!binary aGVsbG8=",
        "!!set {a: null}", "!!timestamp 2001-12-14", "!!float nan", "!!int 99999999999999999999", "!!str 3",
        "*undefined_alias", "&a [*a]"]


class Raw(str):
    """YAML text put verbatim in place of a value (nesting and aliases that a dump cannot write)."""


def deep_flow(depth: int, mapping: bool) -> Raw:
    return Raw(("{a: " * depth + "1" + "}" * depth) if mapping else ("[" * depth + "]" * depth))


def alias_bomb(width: int, depth: int) -> Raw:
    """A flow list whose last entry expands to width**depth strings through nested aliases."""
    levels = ["&b0 [lol]"] + [f"&b{d} [{', '.join([f'*b{d - 1}'] * width)}]" for d in range(1, depth + 1)]
    return Raw("[" + ", ".join(levels) + "]")


numbers = st.one_of(st.sampled_from(SPECIAL_NUMBERS), st.integers(), st.floats())
texts = st.one_of(
    st.sampled_from(PATH_LIKE + PLAUSIBLE),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=30),
    st.builds(lambda s, n: s * n, st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=4),
              st.integers(100, 2000)),
)
raw_yaml = st.one_of(
    st.builds(deep_flow, st.sampled_from([30, 300, 3000, 30000]), st.booleans()),
    # at most 2 million strings written out: enough to pass any sane limit, never enough to fill the memory
    st.tuples(st.integers(2, 9), st.integers(1, 8)).filter(lambda s: s[0] ** s[1] <= 2_000_000)
    .map(lambda s: alias_bomb(*s)),
    st.sampled_from(TAGS).map(Raw),
)
small_values = st.recursive(st.none() | st.booleans() | numbers | texts,
                            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
                            max_leaves=6)
hostile_values = st.one_of(small_values, raw_yaml, st.lists(st.sampled_from(SPECIAL_NUMBERS), min_size=1, max_size=4))

METHOD_FIELDS = {name: sorted(m.Params.model_fields) for name, m in METHODS.items()}
FIELD_NAMES = sorted({*Recipe.model_fields, *MemberSpec.model_fields, *TaskSpec.model_fields, *MethodSpec.model_fields,
                      *PlacementSpec.model_fields, *(f for fields in METHOD_FIELDS.values() for f in fields)})
# fields read only when a row runs, and values of their type but out of their range: where the runtime
# failures of issue 30 lived (seed -1, NaN weights, shots above the data)
RUNTIME_FIELDS = ["seed", "shots", "limit", "batch_size", "weights", "weight", "threshold", "temperature", "top_p",
                  "top_k", "min_p", "repeats", "window",
                  "scores", "ece", "k", "steps", "eta", "support", "span_words", "draft_tokens", "tau",
                  "gate_threshold",
                  "candidate_floor", "filter_ratio", "chance", "num_gpus", "num_cpus", "schedule_timeout_s"]
number_lists = st.lists(st.sampled_from(SPECIAL_NUMBERS), min_size=1, max_size=4)
in_type_values = st.one_of(st.sampled_from(SPECIAL_NUMBERS), st.sampled_from(SPECIAL_NUMBERS), number_lists, texts)
keys = st.one_of(st.sampled_from(FIELD_NAMES), st.sampled_from(["", "x" * 300, "../x", "__class__", "<<"]),
                 st.integers(), st.booleans(), st.none())


# --- recipes ----------------------------------------------------------------------------------------------------
def node_paths(node, prefix=()) -> list[tuple]:
    """The path (keys and indices) of every value below ``node``."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    found = []
    for key, value in items:
        found.append((*prefix, key))
        found.extend(node_paths(value, (*prefix, key)))
    return found


def at(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def field_owners(doc) -> list[tuple[tuple, list[str]]]:
    """(path, field names) of the recipe, each member, task and method entry, and the placement."""
    def entries(key):
        value = doc.get(key)
        return [(key,)] if isinstance(value, dict) else [(key, i) for i, v in enumerate(value) if isinstance(v, dict)] \
            if isinstance(value, list) else []
    owners = [((), sorted(Recipe.model_fields))] * 3  # the recipe's own fields as often as its entries'
    owners += [(p, sorted(MemberSpec.model_fields)) for p in entries("members")]
    owners += [(p, sorted(TaskSpec.model_fields)) for p in entries("tasks")]
    owners += [(p, sorted(PlacementSpec.model_fields)) for p in entries("placement")]
    for path in entries("method") + entries("methods"):
        method = at(doc, path).get("name")
        owners.append((path, ["label", "members", *METHOD_FIELDS.get(method if isinstance(method, str) else "", [])]))
    return owners


@st.composite
def mutation(draw, doc) -> str:
    """Apply one mutation to ``doc`` in place; return what it did, for the failure report."""
    paths = node_paths(doc)
    kind = draw(st.sampled_from(["set field", "set field", "replace", "add key", "delete", "repeat entry"]))
    if kind == "set field":
        owner, names = draw(st.sampled_from(field_owners(doc)))
        runtime = [n for n in names if n in RUNTIME_FIELDS]
        key = draw(st.sampled_from(runtime if runtime and draw(st.booleans()) else names))
        value = draw(st.one_of(in_type_values, in_type_values, hostile_values))
        at(doc, owner)[key] = value
        return f"{list(owner)}[{key!r}] = {value!r}"
    if kind == "add key" or not paths:
        owners = [()] + [p for p in paths if isinstance(at(doc, p), dict)]
        owner, key, value = draw(st.sampled_from(owners)), draw(keys), draw(hostile_values)
        at(doc, owner)[key] = value
        return f"{list(owner)}[{key!r}] = {value!r}"
    path = draw(st.sampled_from(paths))
    parent, key = at(doc, path[:-1]), path[-1]
    if kind == "replace":
        parent[key] = draw(hostile_values)
        return f"{list(path)} = {parent[key]!r}"
    if kind == "delete":
        del parent[key]
        return f"del {list(path)}"
    lists = [p for p in paths if isinstance(at(doc, p[:-1]), list)]
    if not lists:
        return "no list to repeat an entry of"
    path = draw(st.sampled_from(lists))
    parent = at(doc, path[:-1])
    same_object = draw(st.booleans())  # the same object twice is dumped as an anchor and an alias
    parent.insert(path[-1], parent[path[-1]] if same_object else copy.deepcopy(parent[path[-1]]))
    return f"repeat {list(path)}" + (" (as an alias)" if same_object else "")


def dump_yaml(doc) -> str:
    """YAML text of ``doc``; Raw values are written verbatim (dumped first as placeholders)."""
    raws: list[Raw] = []

    def placeholders(node):
        if isinstance(node, Raw):
            raws.append(node)
            return f"__RAW_{len(raws) - 1}__"
        if isinstance(node, dict):
            return {k: placeholders(v) for k, v in node.items()}
        if isinstance(node, list):
            return [placeholders(v) for v in node]
        return node
    text = yaml.safe_dump(placeholders(doc), sort_keys=False, allow_unicode=True, width=10**9)
    for number, raw in enumerate(raws):
        text = text.replace(f"__RAW_{number}__", raw, 1)
    return text


def non_finite(node) -> bool:
    """Whether a NaN or an infinity is anywhere in ``node`` (Raw YAML text not looked into)."""
    if isinstance(node, float):
        return math.isnan(node) or math.isinf(node)
    values = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    return any(non_finite(v) for v in values)


def task_key(task) -> tuple:
    if isinstance(task, str):
        return task, None
    return (task.get("name"), task.get("variant")) if isinstance(task, dict) else (repr(task), "?")


def must_be_refused(doc) -> str | None:
    """Why the dry run must refuse ``doc`` even where each field has the right type: the runtime
    failures of issue 30 that the dry run is to catch (None where no such rule applies)."""
    if non_finite(doc):
        return "a NaN or infinite number"
    seed = doc.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed <= 2**32 - 1:
        return f"seed {seed} outside 0..2**32-1"
    tasks = [repr(task_key(t)) for t in doc.get("tasks")] if isinstance(doc.get("tasks"), list) else []
    if len(set(tasks)) < len(tasks):
        return "a benchmark listed twice"
    return None


@dataclass
class RecipeCase:
    source: str
    mutations: list[str]
    text: str
    output: object  # the recipe's output: field after the mutations (the one folder a dry run may touch)
    refuse: str | None = None  # why the dry run must not accept it (must_be_refused)

    def __repr__(self) -> str:  # what hypothesis prints for a falsifying example
        shown = self.text if len(self.text) < 3000 else self.text[:3000] + f"... ({len(self.text)} chars)"
        return (f"RecipeCase(source={self.source!r}, mutations={self.mutations!r}, refuse={self.refuse!r})"
                f"\n--- recipe text ---\n{shown}")


@st.composite
def mutated_recipes(draw) -> RecipeCase:
    """A shipped recipe, pointed into the sandbox (output: out, data: offline, devices cpu), then mutated."""
    source = draw(st.sampled_from(sorted(SHIPPED)))
    doc = copy.deepcopy(SHIPPED[source])
    doc.update(output="out", data="offline")
    for member in doc.get("members", []):
        if isinstance(member, dict) and "device" in member:
            member["device"] = "cpu"
    done = [draw(mutation(doc)) for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3])))]
    text = dump_yaml(doc)
    textual = draw(st.sampled_from([None] * 8 + ["duplicate key", "duplicate key", "huge comment", "byte order mark"]))
    if textual == "duplicate key" and isinstance(doc, dict) and doc:
        key = draw(st.sampled_from([k for k in doc if isinstance(k, str)] or ["name"]))
        text += f"{key}: {draw(st.sampled_from(['1', 'x', '[]', '.nan']))}\n"
    elif textual == "huge comment":
        text += "# " + "x" * (1 << 20) + "\n"  # past 1 MiB
    elif textual == "byte order mark":
        text = "\ufeff" + text
    if textual:
        done.append(textual)
    return RecipeCase(source, done, text, doc.get("output"), must_be_refused(doc))


# --- the sandbox --------------------------------------------------------------------------------------------------
@dataclass
class Sandbox:
    """A temporary folder that is the working directory and $HOME of one CLI call, with fake runs."""

    root: Path
    runs: dict[str, Path] = field(default_factory=dict)

    @property
    def cwd(self) -> Path:
        return self.root / "cwd"

    @property
    def home(self) -> Path:
        return self.root / "home"


@contextlib.contextmanager
def sandbox():
    root = Path(tempfile.mkdtemp(prefix="ensbench-fuzz-")).resolve()
    box = Sandbox(root)
    for folder in (box.cwd, box.home):
        folder.mkdir()
    try:
        yield box
    finally:
        shutil.rmtree(root, ignore_errors=True)


def add_fake_runs(box: Sandbox) -> None:
    """Finished fake runs in the sandbox, a damaged one, and things that are no run at all."""
    results = box.cwd / "results"
    box.runs["run"] = fake_run(results / "reg" / "20260101-000000-aaaaaaaaaaaa", ROWS, BASE_RECIPE)
    box.runs["recipe folder"] = results / "reg"
    box.runs["baseline"] = fake_run(box.cwd / "baseline" / "reg" / "20250101-000000-aaaaaaaaaaaa", ROWS, BASE_RECIPE)
    damaged = fake_run(results / "damaged" / "20260101-000000-bbbbbbbbbbbb", ROWS, BASE_RECIPE)
    (damaged / "gac" / "results_1.json").write_text('{"results": {')
    box.runs["damaged"] = damaged
    (box.cwd / "empty").mkdir()
    (box.cwd / "plain.txt").write_text("not a run\n")
    (box.cwd / "taken.md").mkdir()  # `--out taken` would write taken.md over a folder
    box.runs.update(empty=box.cwd / "empty", file=box.cwd / "plain.txt")


def tree(root: Path) -> dict[str, tuple]:
    """Every entry below ``root``: its kind, size and modification time."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            found[path] = (stat.S_IFMT(info.st_mode), info.st_size if not stat.S_ISDIR(info.st_mode) else 0,
                           info.st_mtime_ns if not stat.S_ISDIR(info.st_mode) else 0)
    return found


def written_outside(before: dict, after: dict, allowed: list[Path]) -> list[str]:
    """Entries added, removed or changed that are not under an allowed path prefix (the folders leading
    to an allowed path count as allowed)."""
    prefixes = [str(p) for p in allowed]
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    return sorted(p for p in changed if not any(p.startswith(a) or a.startswith(p + os.sep) for a in prefixes))


# --- running the CLI in-process ----------------------------------------------------------------------------------
class Hung(BaseException):
    """Raised by a timer when one CLI call uses more than its CPU seconds, or waits past the hang guard."""


@dataclass
class Outcome:
    argv: list[str]
    code: int | None
    out: str
    err: str
    seconds: float
    hung: str  # what stopped it: its CPU seconds, or the hang guard (a call blocked without using CPU); "" if none
    outside: list[str]

    def problems(self) -> list[str]:
        """What breaks the contract: a hang, exit 70 or an unexpected code, a traceback, a refusal without
        an `error:` line (several mistakes: one `error:` line each), a file written outside the allowed paths."""
        found = []
        if self.hung:
            found.append(self.hung)
        elif self.code not in (0, 1, 2):
            found.append(f"exit {self.code}")
        if "Traceback" in self.out + self.err:
            found.append("traceback")
        lines = [line for line in self.err.splitlines() if line.strip()]
        verdict = self.code == 1 and not lines and "checks regressed" in self.out  # regress's own exit 1
        errors = [line for line in lines if line.startswith("error: ")]
        if self.code not in (0, None) and not verdict and (not errors or len(self.err) > MAX_ERROR_CHARS):
            found.append(f"{len(errors)} error lines, {len(self.err)} characters")
        if self.code not in (0, None) and len(errors) > 1 and len(errors) != len(lines):
            found.append("several mistakes, but not one 'error:' line each")
        if self.outside:
            found.append(f"wrote outside the output: {self.outside[:5]}")
        return found

    def last_line(self) -> str:
        lines = [line for line in self.err.splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""


@contextlib.contextmanager
def patched_process(box: Sandbox, argv: list[str], env: dict[str, str]):
    """sys.argv, the environment and the working directory of one call, restored afterwards."""
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    os.environ.update(HOME=str(box.home), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", ENSBENCH_CACHE=CACHE,
                      MPLCONFIGDIR=MPL_CONFIG, **env)
    os.chdir(box.cwd)
    sys.argv = ["ensbench", *argv]
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.argv = saved_argv


def call_cli(box: Sandbox, argv: list[str], allowed: list[Path], env: dict[str, str] | None = None,
             limit_s: float = CALL_LIMIT_S) -> Outcome:
    """Run ``ensbench *argv`` in-process in the sandbox; stdout, stderr and the exit code are captured and
    the sandbox is compared before and after (only paths under ``allowed`` may change)."""
    before = tree(box.root)
    out, err, hung = io.StringIO(), io.StringIO(), []
    reasons = {signal.SIGPROF: f"used more than {limit_s} CPU seconds",
               signal.SIGALRM: f"waited past the {HANG_GUARD_S + limit_s} s hang guard"}

    def on_timer(signum, _frame):
        hung.append(reasons[signum])
        raise Hung
    previous = {signum: signal.signal(signum, on_timer) for signum in reasons}
    signal.setitimer(signal.ITIMER_PROF, limit_s)  # CPU time of this process
    signal.setitimer(signal.ITIMER_REAL, HANG_GUARD_S + limit_s)
    start = time.perf_counter()
    try:
        with patched_process(box, argv, env or {}), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
                code = 0
            except SystemExit as exit_info:
                code = exit_info.code if isinstance(exit_info.code, int) else 0 if exit_info.code is None else 1
            except Hung:
                code = None
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return Outcome(argv, code, out.getvalue(), err.getvalue(), time.perf_counter() - start, "".join(hung[:1]),
                   written_outside(before, tree(box.root), allowed))


def user_paths(box: Sandbox, text) -> list[Path]:
    """Where a path given by the user may point: as written (relative to the sandbox's working
    directory), and with a leading ~ or $HOME taken as the sandbox's home."""
    if not isinstance(text, str) or "\0" in text:
        return []
    found = [Path(os.path.abspath(box.cwd / text))]
    for home in ("~", "$HOME", "${HOME}"):
        if text.startswith(home):
            found.append(Path(os.path.abspath(str(box.home) + text[len(home):])))
    return found


def dry_run(box: Sandbox, case: RecipeCase) -> Outcome:
    recipe = box.root / "recipe.yaml"
    recipe.write_text(case.text, encoding="utf-8")
    return call_cli(box, ["run", str(recipe), "--dry-run"], user_paths(box, case.output))


# --- argument vectors ----------------------------------------------------------------------------------------------
COMMANDS = typer.main.get_command(cli.app).commands
RUN_TARGETS = ["run", "recipe folder", "baseline", "damaged", "empty", "file"]
OTHER_PATHS = ["missing", "results", "/etc", "/", "~", "../x", "-", "", "x" * 300, "caf\u00e9", "--help",
               "results/reg/"]
OUT_VALUES = ["report", "taken", "sub/report", "missing_dir/report", "~/report", "../report", ".", "", "results",
              "results/reg/20260101-000000-aaaaaaaaaaaa/summary"]
PLAUSIBLE_OPTIONS = {
    "--layout": ["gac_table3", "unite_table4", "deepen_table1", "safe_table2", "nope"],
    "--block": ["1", "nope"], "--param": ["threshold", "k", "span_words", "nope"], "--row": ["gac", "a", "b", "nope"],
    "--benchmark": ["arc_c", "nq", "piqa", "nope"], "--method": ["unite", "gac", "single", "nope"],
    "--tasks": ["arc_c", "arc_c,nq", ",", "nope"], "--title": ["t", "[bold]x[/bold]"],
    "--set": ["method.weights=[2,1]", "method.weigths=[2,1]", "seed=abc", "limit=-1", "tasks[7].limit=1",
              "methods[0].k=3", "=1", "limit", "sweep={threshold: [0.1, 0.9]}",
              f"sweep={{threshold: {alias_bomb(9, 7)}}}",
              f"description={deep_flow(3000, False)}", ".".join(["a"] * 3000) + "=1", "output=/etc",
              "members[0].model=../../x", "method.weights=[.nan, 1]", "allow_task_code=maybe"],
}
option_values = st.one_of(st.sampled_from([str(v) for v in SPECIAL_NUMBERS] + ["nan", "inf", "-inf", "1e999", "abc"]),
                          st.sampled_from(OTHER_PATHS), texts)


@dataclass
class ArgvCase:
    command: str
    argv: list[str]  # with {name} placeholders for sandbox paths
    outs: list[str]  # the --out values: the only places a report may write

    def resolve(self, box: Sandbox) -> list[str]:
        return [str(box.runs[a[1:-1]]) if a.startswith("{") and a[1:-1] in box.runs else a for a in self.argv]


@st.composite
def positionals(draw, count: int) -> list[str]:
    targets = st.one_of(st.sampled_from([f"{{{t}}}" for t in RUN_TARGETS]), st.sampled_from(OTHER_PATHS))
    return draw(st.lists(targets, min_size=0, max_size=3)) if count == -1 else [draw(targets)]


@st.composite
def option_value(draw, name: str) -> str:
    if name == "--out":  # never an absolute path or a way up: a report writes where --out says
        return draw(st.sampled_from(OUT_VALUES) | texts.map(lambda t: "o_" + t.replace("/", "_").replace("\0", "_")))
    if name == "--baseline":
        return draw(st.sampled_from(["{baseline}", "{run}", "{recipe folder}", "{damaged}", "{empty}"]) | option_values)
    return draw(st.sampled_from(PLAUSIBLE_OPTIONS.get(name, ["1", "0.5"])) | option_values)


@st.composite
def argument_vectors(draw, command: str) -> ArgvCase:
    """``command`` with random options of its own (flags, valued, repeated), hostile values and
    positionals naming fake runs and other paths; ``run`` always with --dry-run first."""
    argv, outs = [command] + (["--dry-run"] if command == "run" else []), []
    for param in COMMANDS[command].params:
        if param.opts[0].startswith("--"):
            if param.name == "dry_run" or not draw(st.booleans()):
                continue
            for _ in range(draw(st.integers(1, 2)) if param.multiple else 1):
                argv.append(param.opts[0])
                if not param.is_flag:
                    argv.append(draw(option_value(param.opts[0])))
                    outs += [argv[-1]] if param.opts[0] == "--out" else []
        elif command == "run":
            argv.append(draw(st.sampled_from(["{recipe}", "{file}", "{empty}", "missing", "/etc/hostname"])))
        else:
            argv += draw(positionals(param.nargs))
    extra = draw(st.sampled_from([None, None, None, "--bogus", "--help", "--", "-x", "--out="]))
    return ArgvCase(command, argv + ([extra] if extra else []), outs)


def argv_allowed(box: Sandbox, case: ArgvCase) -> list[Path]:
    """Where a command may write: its --out stems (select: the file itself, selected.yaml by default)."""
    outs = case.outs or (["selected.yaml"] if case.command == "select" else [])
    return [path for out in outs for path in user_paths(box, out)]


def call_with_argv(box: Sandbox, case: ArgvCase) -> Outcome:
    add_fake_runs(box)
    recipe = box.root / "recipe.yaml"
    recipe.write_text(dump_yaml({**SHIPPED["recipes/offline/demo.yaml"], "output": "out"}))
    box.runs["recipe"] = recipe
    return call_cli(box, case.resolve(box), argv_allowed(box, case) + [box.cwd / "out"])


def is_finite_json(text: str) -> bool:
    """Whether a JSON document holds no NaN or infinity (Python's json writes them as bare words)."""
    import json

    def refuse(word):
        raise ValueError(word)
    try:
        json.loads(text, parse_constant=refuse)
    except ValueError:
        return False
    return True
