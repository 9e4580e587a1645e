"""Argument types and actions for command lines built on the library (``kvsim``, ``python -m
hwbackend.replay.cli``, benchmarks): each parses one option value or raises ``argparse.ArgumentTypeError`` with the
reason, which argparse prints with the option's name."""
from __future__ import annotations

import argparse
import sys


def size_arg(text: str) -> int:
    """A byte size with a unit (``2MiB``, ``256KiB``), in bytes."""
    from sim.units import parse_size_bytes
    try:
        return parse_size_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_float(text: str) -> float:
    """A number > 0 (infinity is the caller's to refuse, naming what it would break)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value



def int_at_least(minimum: int):
    """A parser of whole numbers >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


class DeprecatedAlias(argparse.Action):
    """A hidden old spelling of an option (``add_argument("--first", dest="num_requests", action=DeprecatedAlias,
    new="--num-requests", type=...)``): stores the value and prints a one-line deprecation warning."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        kwargs["help"] = argparse.SUPPRESS
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"kvsim: warning: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)
