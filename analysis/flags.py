"""Flags that several ``kvsim`` sub-commands share, defined once so that each concept has one name and one
help text everywhere (issue 36; the table of every flag: docs/cli.md), and the progress display of the
long-running commands.

* ``--out``: where a command writes (a file or a directory); ``--force``: replace an existing ``--out`` that
  kvsim wrote, as a whole (anything else is refused); ``--quiet``: no progress display or per-step lines;
  ``--profile``: a calibration profile, which replaces the compute model as well as the VMM latencies.
* Every user error is one ``kvsim: error: ...`` line (:data:`ERROR_PREFIX`), warnings ``kvsim: warning:``
  and notes ``kvsim: note:``.
"""
from __future__ import annotations

import argparse
import sys

ERROR_PREFIX = "kvsim: error: "
"""The one prefix of a user error's line on stderr (then exit status 2)."""

FORCE_HELP = "replace an existing --out that kvsim wrote, as a whole (anything else is refused)"
QUIET_HELP = "no progress display or per-step lines (progress shows only when stderr is a terminal)"
PROFILE_HELP = ("calibration profile JSON (kvsim calibrate; docs/profile-format.md): replaces the compute model "
                "(iteration times, from its fitted compute section) and the VMM latencies (default: the GPU's "
                "catalogue default profile where it names one - on the h200, profiles/h200-engine.json, fitted "
                "for Llama-3 8B and Llama-3.1 8B - else the built-in roofline, not validated for the GPU and "
                "engine, with the built-in H200 VMM latencies); or the keyword roofline or none (any case) for "
                "those built-in models even where the GPU's catalogue entry names a default profile")
"""One help text for ``--profile``; its keywords are :data:`sim.setup.catalog.PROFILE_KEYWORDS` (not imported
here: ``--help`` stays light; tests/test_docs.py checks that each is named)."""


def add_out(parser: argparse.ArgumentParser, help_text: str, *, required: bool = False,
            aliases: tuple[str, ...] = (), force_extra: str = "") -> None:
    """``--out`` (with ``aliases``: old spellings, deprecated, hidden from ``--help`` but still accepted) and
    ``--force`` (:data:`FORCE_HELP`, plus ``force_extra`` for what else it means to this command)."""
    parser.add_argument("--out", required=required, default=None, help=help_text)
    for alias in aliases:
        parser.add_argument(alias, dest="out", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.add_argument("--force", action="store_true", help=FORCE_HELP + (f"; {force_extra}" if force_extra else ""))


def add_quiet(parser: argparse.ArgumentParser) -> None:
    """``--quiet`` (:data:`QUIET_HELP`)."""
    parser.add_argument("--quiet", action="store_true", help=QUIET_HELP)


def add_profile(parser: argparse.ArgumentParser) -> None:
    """``--profile PATH`` (:data:`PROFILE_HELP`)."""
    parser.add_argument("--profile", default=None, help=PROFILE_HELP)


class Progress:
    """A rich progress bar on stderr while a command works through ``total`` steps, shown only on a terminal
    and without ``quiet`` (``min_total``: shorter jobs get none); as a context manager it yields
    ``advance(done, total=None)`` or None when silent.

    Used by ``simulate`` (requests), ``compare`` (policies), ``capacity`` (search steps), ``sweep`` (points) and
    ``validate`` (its simulation)."""

    def __init__(self, total: int | None, quiet: bool, description: str, min_total: int = 0):
        self.total, self.description, self.bar, self.task = total, description, None, None
        if not quiet and (total is None or total > min_total) and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import Progress as RichProgress
            self.bar = RichProgress(transient=True, console=Console(stderr=True))

    def __enter__(self):
        if self.bar is None:
            return None
        self.bar.start()
        self.task = self.bar.add_task(self.description, total=self.total)

        def advance(done: int, total: int | None = None) -> None:
            self.bar.update(self.task, completed=done, **({"total": total} if total is not None else {}))
        return advance

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False
