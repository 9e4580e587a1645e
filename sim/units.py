"""Units and human-readable quantities.

**The simulator's one time unit is the microsecond.** SimPy's ``env.now`` is in microseconds; every
duration is named ``*_us`` and every timestamp ``*_at_us``. Trace arrival times are seconds
(``arrival_s``) and are converted once, at the scheduler's boundary, with :data:`US_PER_S`.

Sizes are bytes (``*_bytes``); binary prefixes (KiB = 1024 B) are used for page sizes, decimal ones
(GB = 1e9 B) only where a datasheet states them.
"""
from __future__ import annotations

import re

US_PER_S = 1_000_000.0
US_PER_MS = 1_000.0
CLOCK_EXACT_US = 2 ** 53 * 0.1
"""The simulator clock's exact range in microseconds: 2**53 ticks of 100 ns (about 900.7 million s; the tick is
``sim.core.engine.ARRIVAL_TICKS_PER_S``'s, the Azure trace's): arrivals and durations beyond it are not times the
records hold exactly."""

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": KIB, "mib": MIB, "gib": GIB, "tib": 1024 * GIB,
}
_TIME_UNITS_US = {"us": 1.0, "ms": US_PER_MS, "s": US_PER_S, "min": 60 * US_PER_S}
_NUMBER_UNIT = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size_bytes(text: str | int) -> int:
    """Parse a size such as ``"2MiB"``, ``"256KiB"``, ``"80GB"`` or ``4096`` into bytes.

    Args:
        text: a number with an optional unit (B, KB/MB/GB/TB decimal, KiB/MiB/GiB/TiB binary).

    Returns:
        The size in bytes (int).

    Raises:
        ValueError: naming the text when it is not a size or not a whole, positive number of bytes.
    """
    if isinstance(text, int):
        value, unit = float(text), ""
    else:
        match = _NUMBER_UNIT.match(str(text))
        if not match or match.group(2).lower() not in _SIZE_UNITS:
            raise ValueError(f"not a size: {text!r} (examples: 2MiB, 256KiB, 80GB, 4096)")
        value, unit = float(match.group(1)), match.group(2).lower()
    size = value * _SIZE_UNITS[unit]
    if not 0 < size < float("inf") or size != int(size):
        raise ValueError(f"size must be a positive, finite whole number of bytes, got {text!r}")
    return int(size)


def parse_duration_us(text: str) -> float:
    """Parse a duration such as ``"2s"``, ``"100ms"`` or ``"250us"`` into microseconds.

    Raises:
        ValueError: naming the text when it has no known unit (us, ms, s, min) or is not positive.
    """
    match = _NUMBER_UNIT.match(str(text))
    if match and not match.group(2) and float(match.group(1)) <= 0:
        raise ValueError(f"duration must be positive, got {text!r}")
    if match and not match.group(2):
        raise ValueError(f"duration {text!r} has no unit (examples: 2s, 100ms, 250us)")
    if not match or match.group(2).lower() not in _TIME_UNITS_US:
        raise ValueError(f"not a duration: {text!r} (examples: 2s, 100ms, 250us)")
    value_us = float(match.group(1)) * _TIME_UNITS_US[match.group(2).lower()]
    if value_us <= 0:
        raise ValueError(f"duration must be positive, got {text!r}")
    if value_us == float("inf"):
        raise ValueError(f"duration must be finite, got {text!r}")
    return value_us


def format_bytes(num_bytes: float) -> str:
    """Format a byte count with a binary prefix, e.g. ``2097152 -> '2 MiB'``."""
    for unit, scale in (("TiB", 1024 * GIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(num_bytes) >= scale:
            value = num_bytes / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.2f} {unit}"
    return f"{num_bytes:.0f} B"


def comma_items(text: str, where: str, noun: str = "item") -> list[str]:
    """The stripped items of a comma-separated list as written (``"a=1, b=2"`` -> ``["a=1", "b=2"]``; ``""`` ->
    ``[]``), refusing an empty item (``"a=1,"``, ``"a=1,,b=2"``: a stray comma may stand for a forgotten item),
    as the trace readers do. ``where`` starts the message (e.g. ``policy 'paged:block=16,'``), ``noun`` names an
    item (``objective`` for SLOs).

    Raises:
        ValueError: ``{where}: {noun} K of N is empty (a stray comma)``.
    """
    items = [part.strip() for part in text.split(",")]
    if items == [""]:
        return []
    if not all(items):
        raise ValueError(f"{where}: {noun} {items.index('') + 1} of {len(items)} is empty (a stray comma); "
                         f"separate the {noun}s by single commas")
    return items
