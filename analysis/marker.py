"""The marker file kvsim writes into every result directory (:data:`RESULT_MARKER`): ``--force`` replaces only a
directory that has it (:mod:`analysis.output`), and :func:`analysis.results.write_run` writes it too. A module of
its own so that both import it without importing each other."""
from __future__ import annotations

from pathlib import Path

RESULT_MARKER = ".kvsim-result"
"""Written by kvsim into every result directory it writes (:meth:`analysis.output.OutputDir.writing`,
:meth:`analysis.output.OutputDir.mark`, :func:`analysis.results.write_run`); ``--force`` replaces only a directory
that has it (results written before 2026-12-01 lack it and are refused: remove such a directory yourself)."""


def write_marker(directory) -> None:
    """Mark ``directory`` as a kvsim result."""
    (Path(directory) / RESULT_MARKER).write_text('{"format": "kvsim-result/1"}\n')


__all__ = ["RESULT_MARKER", "write_marker"]
