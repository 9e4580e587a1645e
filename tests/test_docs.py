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
