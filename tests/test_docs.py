"""Every Python snippet of README.md and docs/*.md runs (as Ciw and SimPy test their docs).

A snippet is a fenced block opened with ```` ```python ````. The blocks of one file run in order in one
namespace (a notebook's cells), in a scratch directory whose ``../shared`` is the repository's and which holds
links to ``profiles/`` and ``models/``, so the docs' relative paths work and nothing is written into the
repository. A block that needs a GPU or runs long starts with the visible line
``# not run by tests/test_docs.py: REASON`` and is skipped with that reason.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
SKIP = re.compile(r"\A# not run by tests/test_docs\.py: (.+)")


def snippets(path: Path) -> list[tuple[int, str, str | None]]:
    """``(line, code, skip reason or None)`` for each ```` ```python ```` block of ``path``."""
    text = path.read_text(encoding="utf-8")
    found = []
    for match in BLOCK.finditer(text):
        code = match.group(1)
        skip = SKIP.match(code)
        found.append((text.count("\n", 0, match.start()) + 2, code, skip.group(1).strip() if skip else None))
    return found


RUNNABLE = [p for p in DOCS if any(reason is None for _, _, reason in snippets(p))]
SKIPPED = [(p, line, reason) for p in DOCS for line, _, reason in snippets(p) if reason is not None]


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A working directory laid out like the repository root beside ../shared."""
    work = tmp_path / "work"
    work.mkdir()
    shared = (ROOT.parent / "shared").resolve()
    if shared.exists():
        (tmp_path / "shared").symlink_to(shared, target_is_directory=True)
    for name in ("profiles", "models"):
        (work / name).symlink_to(ROOT / name, target_is_directory=True)
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(ROOT))
    return work


@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_snippets_run(path: Path, scratch, capsys):
    """The file's runnable blocks execute in order without raising (their own asserts included)."""
    if not (ROOT.parent / "shared" / "traces").is_dir():
        pytest.skip("../shared/traces is not present")
    namespace = {"__name__": "__docs__"}
    for line, code, reason in snippets(path):
        if reason is not None:
            continue
        try:
            exec(compile(code, f"{path.relative_to(ROOT)}:{line}", "exec"), namespace)
        except Exception as exc:  # noqa: BLE001 - name the block in the failure
            pytest.fail(f"{path.relative_to(ROOT)}, block at line {line}: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("path,line,reason", SKIPPED,
                         ids=[f"{p.relative_to(ROOT)}:{line}" for p, line, _ in SKIPPED])
def test_marked_snippets_are_skipped(path: Path, line: int, reason: str):
    """A block marked in its doc is listed here, skipped with the doc's own reason."""
    pytest.skip(f"{path.relative_to(ROOT)}:{line}: {reason}")


def test_snippets_found():
    """The extraction finds the documented API page's blocks (a broken fence regex would pass vacuously)."""
    api = snippets(ROOT / "docs" / "python-api.md")
    assert len(api) >= 5 and all(reason is None for _, _, reason in api)
    assert ROOT / "docs" / "python-api.md" in RUNNABLE


def test_no_undocumented_names():
    """Names the docs cite as ``analysis.NAME(`` are exported by ``analysis`` (issue 36: a documented
    ``analysis.comparison(runs)`` raised AttributeError; the export is ``analysis.compare``)."""
    import analysis
    for path in DOCS:
        for name in re.findall(r"\banalysis\.([a-z_]+)\(", path.read_text(encoding="utf-8")):
            assert name in analysis.__all__, f"{path.name}: analysis.{name}( is not an export of analysis"


# ---- the command line: one name per concept (docs/cli.md; issue 36, item 13) --------------------------------
def _subcommands() -> dict:
    """``{"simulate": parser, "traces convert": parser, ...}`` of the kvsim parser."""
    import argparse

    import cli

    found = {}

    def walk(parser, name):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child, sub in action.choices.items():
                    walk(sub, f"{name} {child}".strip())
        if name:
            found[name] = parser
    walk(cli.build_parser(), "")
    return found


def _options(parser) -> dict:
    """Option string -> action, hidden aliases left out."""
    import argparse
    return {flag: action for action in parser._actions if action.help != argparse.SUPPRESS
            for flag in action.option_strings}


WRITERS = ("simulate", "compare", "sweep", "validate", "report", "capacity", "calibrate", "traces convert")
LONG_RUNNING = ("simulate", "compare", "capacity", "sweep", "validate")


def test_every_writing_command_has_out_and_force_with_one_meaning():
    from analysis.flags import FORCE_HELP
    commands = _subcommands()
    for name in WRITERS:
        options = _options(commands[name])
        assert "--out" in options and "--force" in options, name
        assert options["--force"].help.startswith("replace an existing --out"), (name, options["--force"].help)
    for name in ("simulate", "compare", "sweep", "validate", "capacity"):
        assert _options(commands[name])["--force"].help.startswith(FORCE_HELP), name
    assert not any("--json" in _options(p) for p in commands.values())        # capacity --json: hidden alias


def test_quiet_and_profile_have_one_help_text():
    from analysis.flags import PROFILE_HELP, QUIET_HELP
    commands = _subcommands()
    for name in LONG_RUNNING:
        options = _options(commands[name])
        assert options["--quiet"].help == QUIET_HELP, name
        assert options["--profile"].help == PROFILE_HELP, name
    assert "replaces the compute model" in PROFILE_HELP
    # the keywords that force the built-in models are in the help (a new-user trial found them nowhere in it)
    from sim.setup.catalog import PROFILE_KEYWORDS
    assert all(f" {word} " in PROFILE_HELP for word in PROFILE_KEYWORDS)
    assert _options(commands["colocate"])["--profile"].help == PROFILE_HELP


def test_old_spellings_still_parse():
    """Deprecated aliases kept for scripts: capacity --json, calibrate --grid; devices as 0 or cuda:0."""
    import cli
    parser = cli.build_parser()
    assert parser.parse_args(["capacity", "--json", "x.json"]).json == "x.json"
    assert parser.parse_args(["capacity", "--out", "x.json"]).json == "x.json"
    assert parser.parse_args(["calibrate", "--grid", "g", "--grid-dir", "h"]).grid == ["g", "h"]
    assert parser.parse_args(["calibrate", "--device", "cuda:1"]).device == 1
    assert parser.parse_args(["validate", "--device", "2"]).device == "cuda:2"


def test_docs_cli_names_every_flag():
    """docs/cli.md names every visible flag of every sub-command (the table is kept in step)."""
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    missing = sorted({flag for parser in _subcommands().values() for flag in _options(parser)
                      if flag.startswith("--") and flag != "--help" and f"`{flag}" not in text})
    assert not missing


def test_one_error_prefix(capsys, tmp_path):
    """A bad flag value, a bad input and a hardware command's error all start with ``kvsim: error: ``; no
    command-line module prints another error prefix."""
    import cli
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["simulate", "--max-batch", "0"])
    assert exit_info.value.code == 2 and capsys.readouterr().err.startswith("kvsim: error: ")
    assert cli.main(["simulate", "--trace", str(tmp_path / "none.csv"), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith("kvsim: error: ")
    assert cli.main(["validate", "--hw-run", str(tmp_path / "no-run"), "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("kvsim: error: ")
    for module in ("cli.py", "analysis/cli.py", "analysis/planning/cli.py", "hwbackend/cli.py"):
        source = (ROOT / module).read_text(encoding="utf-8")
        assert not re.search(r'"kvsim (simulate|compare|calibrate|validate|capacity|sweep|report)[^"]*: ', source), module
