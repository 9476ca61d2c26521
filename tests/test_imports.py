"""The package's import graph has no cycles: every ``import`` of a simulator module, at the top of a module, inside a
function or under ``TYPE_CHECKING``, is an edge, and a module's package ``__init__`` runs before it."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "simulator"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> nx.DiGraph:
    """Module -> the simulator modules it imports (a ``from pkg import name`` of a submodule names the submodule)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package
                    pkg = name.split(".") if is_package else name.split(".")[:-1]
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            for target in targets:
                while target and target not in modules:  # import a.b.c names module a.b.c (or its package)
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("simulator"):
                    graph.add_edge(name, target)
    return graph


def test_the_package_has_no_import_cycles():
    graph = import_graph()
    cycles = [c for c in nx.simple_cycles(graph) if len(c) > 1][:5]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join([*c, c[0]]) for c in cycles)


def test_the_graph_sees_function_level_imports():
    """A function-local import is an edge too (the cycles it would hide are cycles), and so is one made only for the
    type checker."""
    graph = import_graph()
    assert graph.has_edge("simulator.engine.warmup", "simulator.cluster.routing")  # inside _router
    assert graph.has_edge("simulator", "simulator.schedule.op")  # under TYPE_CHECKING
    assert len(graph.edges) > 300


def test_every_verb_runs_from_the_table_and_the_parser_loads_no_engine():
    """Every verb of the parser has its function in cli.VERBS, importable; parsing imports none of the heavy rooms
    (a fresh interpreter: ``treering --help`` answers at once)."""
    import subprocess
    import sys

    from simulator.cli import VERBS, _parser, verb

    sub = next(a for a in _parser()._actions if a.dest == "verb")
    assert set(sub.choices) == set(VERBS)
    assert all(callable(verb(name)) for name in VERBS)
    code = ("import sys, simulator.cli as c; c._parser().parse_args(['run']); "
            "print(sorted(m for m in sys.modules if m.startswith(('numba', 'pandas', 'matplotlib', 'simulator.engine',"
            " 'simulator.run', 'networkx'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_reference_lists_the_result_columns_the_code_declares():
    """docs/reference.md's "Result columns" section is what ``treering schema --columns`` prints (regenerate it with
    that command after changing a kind's columns)."""
    from simulator.run.kinds import KINDS
    from simulator.run.rows import columns_markdown

    text = (ROOT / "docs" / "reference.md").read_text()
    section = text.split("<!-- generated from simulator.run.rows: do not edit by hand -->", 1)[1]
    assert columns_markdown({k: kind.columns for k, kind in KINDS.items()}).strip() in section


def test_topo_list_and_schema_load_no_heavy_room():
    """``treering topo list`` and ``treering schema`` (a verb imports what it uses) load no compiled code, no
    dataframes, plots or graphs, nor the engine, the collectives or the run room's sweep: they answer at once."""
    import subprocess
    import sys

    heavy = ("numba", "pandas", "matplotlib", "networkx", "scipy", "simulator.engine", "simulator.collectives",
             "simulator.cluster.topology", "simulator.run.sweep", "simulator.run.kinds")
    code = ("import sys, contextlib, io, simulator.cli as c\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert c.main(['topo', 'list']) == 0 and c.main(['schema']) == 0\n"
            f"print(sorted(m for m in sys.modules if m.startswith({heavy!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
