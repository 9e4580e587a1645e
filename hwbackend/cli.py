"""``kvsim calibrate``: the hardware backend's subcommand, wired into ``cli.py`` through :func:`register`."""
from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``calibrate`` to the ``kvsim`` subcommands; its ``func(args) -> int`` returns the exit status.

    ``kvsim calibrate [--page-sizes 2MiB,4MiB,32MiB] [--samples N] [--out profiles/NAME.json] [--force]``
    exits 2 with one message on a machine without a usable GPU or without cuda-python, 1 when the output
    exists and ``--force`` is not given.
    """
    from hwbackend.calibrate import add_arguments

    parser = subparsers.add_parser("calibrate", help="measure CUDA VMM latencies and write a profile",
                                   description="Measure CUDA VMM call latencies on this GPU and write a "
                                               "kvsim-profile/1 JSON profile (docs/profile-format.md).")
    add_arguments(parser)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from hwbackend.calibrate import command

    return command(args, prog="kvsim")
