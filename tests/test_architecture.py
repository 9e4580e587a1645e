"""The package layout's rules (docs/architecture.md), checked on the source: no import cycles among the
library's modules (module-level and function-local imports alike), and no library module imports the
command line (``cli``)."""
from __future__ import annotations

import ast

from tests.conftest import REPO_ROOT

PACKAGES = ("sim", "traces", "analysis", "hwbackend")


def _modules() -> dict[str, object]:
    modules = {}
    for package in PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def _import_graph() -> dict[str, set[str]]:
    """Module -> library modules it imports anywhere in its body (``from pkg import submodule`` counts as
    importing the submodule)."""
    modules = _modules()

    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(resolve(alias.name) for alias in node.names)
                deps.update("cli" for alias in node.names if alias.name == "cli")
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "cli":
                    deps.add("cli")
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(resolve(full) if full in modules else resolve(node.module))
        graph[name] = {dep for dep in deps if dep and dep != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in graph.get(node, ()):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles_in_the_library():
    assert _cycles(_import_graph()) == []


def test_no_library_module_imports_the_command_line():
    assert sorted(name for name, deps in _import_graph().items() if "cli" in deps) == []


def test_the_checker_sees_a_cycle_and_a_cli_import():
    """The checks are not vacuous: a two-module cycle is found, and the graph holds real edges."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    graph = _import_graph()
    assert "sim.setup.config" in graph["sim.core.engine"] and "hwbackend.vmm.kvcache" in graph["hwbackend.vmm.executor"]


def test_version_and_help_import_neither_pandas_nor_plotly():
    """``kvsim --version`` and every ``--help`` start without pandas or plotly (issue 18: start-up cost)."""
    import subprocess
    import sys

    code = ("import sys, cli\n"
            "for argv in (['--version'], ['--help'], ['simulate', '--help'], ['compare', '--help'],\n"
            "             ['capacity', '--help'], ['sweep', '--help'], ['traces', 'stats', '--help'], ['report', '--help']):\n"
            "    try:\n"
            "        cli.main(argv)\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print(sorted(m for m in ('pandas', 'plotly', 'simpy') if m in sys.modules), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
