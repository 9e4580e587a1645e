"""Summaries as strict JSON (RFC 8259): a figure that could not be computed (NaN, e.g. a latency percentile of a run
that served no request, or a ratio over zero) is written as ``null``, not as Python's ``NaN`` token that strict
parsers (``jq``, JavaScript's ``JSON.parse``, Rust's serde_json) refuse, and read back as NaN.

A run's summary (:func:`sim.results.summary.summarize`) holds numbers, strings, lists and nested objects of
numbers, and no ``null`` of its own, so a ``null`` read from it is always such a figure.
"""
from __future__ import annotations

import json
import math


def finite_or_none(value):
    """``value`` with every non-finite float in it (NaN, +-inf; numpy floats too) replaced by None, through dicts,
    lists and tuples (a tuple comes back as a list, as JSON writes it)."""
    if isinstance(value, float):          # numpy.float64 is a float subclass
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(item) for item in value]
    if hasattr(value, "dtype") and getattr(value, "shape", None) == () and value.dtype.kind == "f":
        number = float(value)             # a numpy float32 scalar (not a float subclass)
        return number if math.isfinite(number) else None
    return value


def strict_json_text(value, **options) -> str:
    """``json.dumps(value, **options)`` with non-finite floats written as ``null`` (:func:`finite_or_none`) and
    ``allow_nan=False``: the text is strict JSON.

    Raises:
        TypeError: a value JSON cannot write (unless ``options`` has a ``default`` that converts it).
    """
    return json.dumps(finite_or_none(value), allow_nan=False, **options)


def nan_for_null(summary):
    """A summary read from JSON with each ``null`` (a figure written by :func:`strict_json_text` for NaN) back as
    NaN, through nested objects and lists; other values as they are. Files written before strict JSON hold
    ``NaN`` tokens, which :func:`json.loads` reads as NaN already."""
    if summary is None:
        return float("nan")
    if isinstance(summary, dict):
        return {key: nan_for_null(item) for key, item in summary.items()}
    if isinstance(summary, list):
        return [nan_for_null(item) for item in summary]
    return summary


__all__ = ["finite_or_none", "nan_for_null", "strict_json_text"]
