"""The package layout's rules (docs/architecture.md), checked on the source: no import cycles among the
library's modules (module-level and function-local imports alike), no library module imports the
command line (``cli``), ``sim``'s sub-packages (issue 29) and their import rule (``sim`` never imports
``analysis``, ``traces``, ``hwbackend`` or ``cli``; no simulation package imports the front end
``sim.frontend``), and the size limits (a module at most 600 lines, a class at most 300)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

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


SIM_PACKAGES = ("core", "memory", "timing", "setup", "results", "cluster", "frontend")
"""``sim``'s sub-packages (docs/architecture.md); beside them ``sim`` holds only ``units`` and ``lazy``."""
SIM_TOP_MODULES = {"sim", "sim.units", "sim.lazy", "sim.compiled"}
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300
SIZE_EXCEPTIONS: set[str] = set()
"""Modules and classes allowed over the limits (``path`` or ``path:Class``): none since the split of issue 29's
last five (each entry must still be over its limit: the list only shrinks)."""


def _oversized(root: Path, base: Path = REPO_ROOT) -> set[str]:
    """``path`` of each module over :data:`MAX_MODULE_LINES` and ``path:Class`` of each class over
    :data:`MAX_CLASS_LINES` under ``root`` (paths relative to ``base``, the repository)."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(base).as_posix()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found.add(name)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                found.add(f"{name}:{node.name}")
    return found


def test_sim_is_grouped_into_its_sub_packages():
    """Every module of ``sim`` lives in one of its sub-packages (each with an ``__init__`` that documents its
    public API), apart from the units, the lazy-export helper and the list of compiled modules."""
    for package in SIM_PACKAGES:
        init = REPO_ROOT / "sim" / package / "__init__.py"
        assert init.is_file() and ast.get_docstring(ast.parse(init.read_text())), package
    top = {name for name in _modules() if name.startswith("sim") and name.count(".") <= 1
           and name.partition(".")[2] not in SIM_PACKAGES}
    assert top == SIM_TOP_MODULES


def test_sim_never_imports_the_packages_above_it():
    """The simulator is the bottom of the house: no module of ``sim`` imports ``analysis``, ``traces``,
    ``hwbackend`` or the command line (the run result and its summary live in :mod:`sim.results.summary`)."""
    above = ("analysis", "traces", "hwbackend", "cli")
    offenders = sorted(f"{name} -> {dep}" for name, deps in _import_graph().items() if name.split(".")[0] == "sim"
                       for dep in deps if dep.split(".")[0] in above)
    assert offenders == []


def test_the_simulation_never_imports_the_front_end():
    """Option parsing, argparse types and flag names live in ``sim.frontend``, which the command lines and
    ``analysis`` use; no other part of ``sim`` imports it."""
    offenders = sorted(f"{name} -> {dep}" for name, deps in _import_graph().items()
                       if name.startswith("sim") and not name.startswith("sim.frontend")
                       for dep in deps if dep.startswith("sim.frontend"))
    assert offenders == []


def test_module_and_class_sizes_stay_within_the_limits():
    """No module of ``sim`` above 600 lines and no class above 300, apart from :data:`SIZE_EXCEPTIONS`, each
    of which is still over its limit (a split one leaves the list)."""
    oversized = _oversized(REPO_ROOT / "sim")
    assert oversized - SIZE_EXCEPTIONS == set()
    assert SIZE_EXCEPTIONS - oversized == set()


def test_the_size_check_sees_a_long_module_and_a_long_class(tmp_path):
    """The size check is not vacuous: a 601-line module and a 301-line class are found, a 300-line one not."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 601)
    (tmp_path / "pkg" / "klass.py").write_text("class Big:\n" + "    x = 1\n" * 300 + "class Small:\n    y = 2\n")
    (tmp_path / "pkg" / "fits.py").write_text("class Fits:\n" + "    x = 1\n" * 299)
    assert _oversized(tmp_path / "pkg", tmp_path) == {"pkg/long.py", "pkg/klass.py:Big"}


def test_paths_anchored_at_the_repository_root_still_find_it_after_the_move():
    """sim.setup.model_files resolves ``models/x.json`` against the repository root, and catalogue default
    profiles live in its ``profiles/``: the anchors must be the root (where pyproject.toml is), not ``sim/``."""
    from sim.setup import model_files
    assert (model_files.REPO_ROOT / "pyproject.toml").is_file() and (model_files.REPO_ROOT / "profiles").is_dir()


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
"""A command-line flag as written in a string (``--token-budget``)."""
COMMAND_EXAMPLE = re.compile(r"\bkvsim(?:[ \t]+[\w./=:-]+)+")
"""A whole command to run (``kvsim calibrate --from-run RUN_DIR``, ``kvsim --help``): an instruction naming another
command's flags, not the flag of a caller's option; removed before the scan."""
FLAG_ALLOWED = {("sim/setup/config.py", "--usd-per-gpu-hour")}
"""Strings of the simulation core that must name a flag: ``GPUSpec.price_source`` of a price given on the
command line, a value recorded in ``config.json`` (changing it would change every such run directory)."""


def _flags_in_strings(root: Path, base: Path = REPO_ROOT) -> set[tuple[str, str]]:
    """``(path, flag)`` of each ``--flag`` in a string constant (docstrings and f-string parts included) of the
    modules under ``root`` outside ``sim/frontend``."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(base).as_posix()
        if "/frontend/" in f"/{name}":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.update((name, flag) for flag in FLAG.findall(COMMAND_EXAMPLE.sub("", node.value)))
    return found


def test_the_simulation_core_names_fields_not_flags():
    """No string of ``sim`` outside ``sim.frontend`` names a command-line flag (issue 29 item 4): the core's
    errors name the configuration field (``token_budget=0: must be >= 1``, the fields in ``exc.fields``) and each
    front end names its own flag or key (:mod:`sim.frontend.flags`, :func:`sim.frontend.policy_spec.policy_config_error`);
    :data:`FLAG_ALLOWED` lists the documented exceptions, each still present (the list only shrinks)."""
    found = _flags_in_strings(REPO_ROOT / "sim")
    assert found - FLAG_ALLOWED == set()
    assert FLAG_ALLOWED - found == set()


def test_the_flag_scan_sees_a_flag_in_an_error_and_a_docstring(tmp_path):
    """The scan is not vacuous: a flag in an f-string message and in a docstring is found, one in ``frontend/``
    and one inside a whole ``kvsim ...`` command is not, and neither is a field name or ``x--y``."""
    (tmp_path / "core").mkdir()
    (tmp_path / "frontend").mkdir()
    (tmp_path / "core" / "m.py").write_text('"""Set by ``--seed``."""\n'
                                            'def f(x):\n    raise ValueError(f"--token-budget {x}: must be >= 1")\n'
                                            'A = "token_budget=0, a--b; run kvsim calibrate --from-run RUN"\n')
    (tmp_path / "frontend" / "o.py").write_text('B = "--max-batch"\n')
    assert _flags_in_strings(tmp_path, tmp_path) == {("core/m.py", "--seed"), ("core/m.py", "--token-budget")}
