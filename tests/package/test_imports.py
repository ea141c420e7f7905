"""The package's import graph, read with ``ast``: no cycle among module-level imports (typing-only
imports under ``if TYPE_CHECKING:`` included: a circle hidden there is still a circle), and no arrow runs
back up a layer (docs/architecture.md), in function-level imports too. The layers, top to bottom:
cli -> report -> run -> recipe -> tasks -> methods -> decoding -> members -> vocab -> the utilities at the
top of the package (errors, settings, cache, fetch, yaml_limits). So the modules writing a run know nothing
of the reports reading it, the engine runs methods through their base interface only, and members and
vocab know nothing of methods, the runner, lm-eval's adapter or the CLI."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ensemble_bench"
TOP = "ensemble_bench"
LAYERS = ("cli", "report", "run", "recipe", "tasks", "methods", "decoding", "members", "vocab")  # top first
UTILITIES = ("errors", "settings", "cache", "fetch", "yaml_limits")  # import none of the layers
# union_cache.py and eva_cache.py sit at the top until they move into vocab/ (issue 48): left out of the rules
FORBIDDEN = {  # package -> modules (and their submodules) it must not import
    **{f"{TOP}.{layer}": tuple(f"{TOP}.{above}" for above in LAYERS[:i]) for i, layer in enumerate(LAYERS)},
    **{f"{TOP}.{name}": tuple(f"{TOP}.{layer}" for layer in LAYERS) for name in UTILITIES},
}
FORBIDDEN[f"{TOP}.methods"] += ("lm_eval",)  # methods and the engine run without lm-eval: its adapter is run/lm.py
FORBIDDEN[f"{TOP}.decoding"] += ("lm_eval",)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    """The modules one import statement names (relative imports resolved; ``from pkg import mod``
    names the submodule when there is one)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    base = node.module or ""
    if node.level:
        package = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
        base = f"{package}.{base}" if base else package
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(module: str, source: str | None = None) -> tuple[set[str], set[str], set[str]]:
    """(imports run when the module is imported, imports inside functions or classes' methods,
    imports for typing only) of the module's file, or of ``source`` read as that module."""
    top, inner, typing = set(), set(), set()

    def visit(node, into: set[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                into.update(imported(child, module))
            elif isinstance(child, ast.If) and is_type_checking(child):
                visit(child, typing)
            else:
                nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                visit(child, inner if nested else into)

    visit(ast.parse(source if source is not None else MODULES[module].read_text()), top)
    return top, inner, typing


GRAPH = {module: imports_of(module) for module in MODULES}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph (as a closed path), or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        state[node] = "done"
        path.pop()
        return None

    return next((c for node in sorted(edges) if node not in state and (c := visit(node))), None)


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_graph_sees_known_imports():
    assert f"{TOP}.errors" in GRAPH[f"{TOP}.cli.main"][0]
    assert "ray" in GRAPH[f"{TOP}.members.remote"][1]


def with_packages(module: str, targets: set[str]) -> set[str]:
    """``targets`` and the packages each one's import runs first (``import a.b.c`` runs ``a/b/__init__``),
    but not the packages ``module`` itself sits in (they are imported before it)."""
    found = set(targets)
    for target in targets:
        parts = target.split(".")
        found.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts)))
                     if p in MODULES and not within(module, p))
    return found


def test_no_cycle_among_module_level_imports():
    edges = {module: with_packages(module, {t for t in top | typing if t in MODULES})
             for module, (top, _, typing) in GRAPH.items()}
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_an_import_runs_the_packages_above_it():
    assert with_packages(f"{TOP}.decoding.decode", {f"{TOP}.methods.gac", f"{TOP}.decoding.stats"}) == {
        f"{TOP}.methods.gac", f"{TOP}.methods", f"{TOP}.decoding.stats"}


def test_typing_only_imports_are_in_the_graph():
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ensemble_bench.errors import UserError\n"
    top, inner, typing = imports_of(f"{TOP}.cli.main", source)
    assert typing == {f"{TOP}.errors"} and top == {"typing"} and not inner


def test_paired_and_summary_import_no_circle():
    paired, summary = f"{TOP}.report.paired", f"{TOP}.report.summary"
    assert paired in GRAPH[summary][0]
    assert summary not in set.union(*GRAPH[paired])


def test_no_cycle_hidden_in_function_level_imports():
    edges = {module: {t for t in top | inner | typing if t in MODULES}
             for module, (top, inner, typing) in GRAPH.items()}
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle (counting imports inside functions): " + " -> ".join(cycle)


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def broken_seams(graph: dict[str, tuple[set[str], set[str], set[str]]]) -> list[str]:
    """Each import (module level or in a function) of ``graph`` that FORBIDDEN bans."""
    return [f"{module} imports {target}"
            for module, (top, inner, _) in graph.items()
            for package, banned in FORBIDDEN.items() if within(module, package)
            for target in top | inner if any(within(target, b) for b in banned)]


def test_the_seams_hold():
    broken = broken_seams(GRAPH)
    assert not broken, "; ".join(broken)


def test_an_import_up_a_layer_breaks_a_seam():
    upward = {f"{TOP}.run.runner": "from ensemble_bench.report.summary import write_summary\n",
              f"{TOP}.tasks.task_sources": "def f():\n    from ensemble_bench.recipe import Recipe\n",
              f"{TOP}.cache": "from ensemble_bench.vocab.union import UnionVocab\n",
              f"{TOP}.decoding.decode": "from ensemble_bench.methods.gac import Gac\n"}
    assert len(broken_seams({module: imports_of(module, source) for module, source in upward.items()})) == 4
    downward = {f"{TOP}.report.summary": "from ensemble_bench.run.folder import SUMMARY\n",
                f"{TOP}.recipe.schema": "from ensemble_bench.tasks import get_benchmark\n"}
    assert not broken_seams({module: imports_of(module, source) for module, source in downward.items()})



# the packages whose __init__ re-exports their modules' names
HUBS = [f"{TOP}.{name}" for name in ("members", "methods", "decoding", "vocab", "report", "recipe")]


def test_no_module_imports_the_package_that_reexports_it():
    """A module of a package whose ``__init__`` re-exports its modules imports from the module that defines a
    name, never from the package (members/remote.py and members/vocab_files.py once did, inside functions, to
    break that circle). tasks/ and the root package define their own names (the benchmark registry, the
    version) and import none of the modules importing them: the cycle tests above check that."""
    inward = [f"{module} imports {package}" for module, (top, inner, typing) in GRAPH.items()
              for package in HUBS if module != package and within(module, package) and package in top | inner | typing]
    assert not inward, "; ".join(inward)


# what a recipe is checked against: the method declarations (every methods/*_params module, found, not listed)
DECLARATIONS = sorted(m for m in MODULES if within(m, f"{TOP}.methods") and m.endswith("_params"))
HEAVY = ("torch", "transformers", "lm_eval", "vllm", "ray")


def module_closure(start: str) -> set[str]:
    """Every module ``start`` imports when it is imported (module-level imports, followed in the package, with
    the packages each one runs first), outside names included."""
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        if module in MODULES:
            todo.extend(with_packages(module, GRAPH[module][0]))
    return seen


def test_method_declarations_import_no_model_code():
    """A method's declaration (its Params and facts) and the registry import no torch, transformers or lm-eval,
    so validating a recipe loads none (tests/cli/test_light_commands.py runs a dry run)."""
    assert len(DECLARATIONS) >= 16
    for module in [f"{TOP}.methods", f"{TOP}.recipe", *DECLARATIONS]:
        heavy = sorted(m for m in module_closure(module) if any(within(m, h) for h in HEAVY))
        assert not heavy, f"{module} imports {heavy}"


def test_the_closure_sees_torch():
    assert "torch" in module_closure(f"{TOP}.methods.gac")
