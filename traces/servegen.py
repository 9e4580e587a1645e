"""ServeGen-style client-mix generator (alibaba/ServeGen per-client statistics).

Data layout (``../shared/traces/servegen/data/<category>/<model>/``, Apache-2.0, Xiang
et al., arXiv 2505.09999)::

    chunk-<id>-trace.csv     no header: window_start_s, rate (req/s), cv, pattern
                             (Gamma | Weibull | empty = idle), shape, scale; 600 s windows
    chunk-<id>-dataset.json  {window_start_s (21,600 s windows): {field: "<PMF dict repr>"}}

For every client and 600 s window, inter-arrival times are drawn from the fitted family
with the fitted ``shape``, scaled so their mean is ``1 / rate`` (as ServeGen rescales to
the window rate). Lengths are drawn from the client's ``input_tokens`` /
``output_tokens`` PMFs of the enclosing 6 h window (the nearest window with data when
that one is ``"{}"``). Clients without any length data are skipped.
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from traces.canonical import build_table
from traces.csvread import check_field_counts, read_head
from traces.errors import TraceError, fail

WINDOW_S = 600.0


@dataclass(frozen=True)
class Pmf:
    """A discrete distribution of token counts."""

    values: np.ndarray
    probs: np.ndarray

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Draws n int64 token counts (each >= 1)."""
        return np.maximum(1, rng.choice(self.values, size=n, p=self.probs)).astype(np.int64)


def parse_pmf(text: str, where: str) -> Pmf | None:
    """Parses ``"{tokens: probability, ...}"``; None for ``"{}"``."""
    try:
        table = ast.literal_eval(text)
    except (ValueError, SyntaxError) as err:
        raise TraceError(f"{where}: unreadable PMF ({err})") from None
    if not table:
        return None
    values = np.rint(np.array(list(table.keys()), dtype=np.float64)).astype(np.int64)
    probs = np.array(list(table.values()), dtype=np.float64)
    if probs.sum() <= 0 or (probs < 0).any():
        raise TraceError(f"{where}: PMF probabilities must be >= 0 with a positive sum")
    return Pmf(values, probs / probs.sum())


class ClientLengths:
    """A client's length PMFs per 6 h window, parsed lazily from its dataset JSON."""

    def __init__(self, path: Path):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise fail(path, f"unreadable dataset JSON ({err})") from None
        self.path = path
        self._raw = {float(k): v for k, v in raw.items()
                     if v.get("input_tokens", "{}") != "{}"
                     and v.get("output_tokens", "{}") != "{}"}
        self.starts_s = np.array(sorted(self._raw))
        self._parsed: dict[float, tuple[Pmf, Pmf]] = {}

    def at(self, t_s: float) -> tuple[Pmf, Pmf]:
        """(input PMF, output PMF) of the window nearest (by centre) to time ``t_s``."""
        start = float(self.starts_s[np.argmin(np.abs(self.starts_s + 10800 - t_s))])
        if start not in self._parsed:
            self._parsed[start] = tuple(
                parse_pmf(self._raw[start][k], f"{self.path}: window {start:g}, field '{k}'")
                for k in ("input_tokens", "output_tokens"))
        return self._parsed[start]


def load_rates(path: Path) -> pd.DataFrame:
    """Reads a client's ``*-trace.csv`` (columns named as in the module docstring).

    Raises:
        TraceError: A line without exactly six fields (pandas would otherwise take a
            seventh as an index and shift every column), or an unreadable value.
    """
    names = ["window_start_s", "rate_per_s", "cv", "pattern", "shape", "scale"]
    read_head(path)                          # missing, empty or binary file
    check_field_counts(path, len(names), expected="a ServeGen rate line has")
    try:
        df = pd.read_csv(path, header=None, names=names, keep_default_na=False,
                         dtype={"pattern": str})
        for col in ("window_start_s", "rate_per_s", "shape"):
            df[col] = pd.to_numeric(df[col], errors="raise")
    except (ValueError, pd.errors.ParserError) as err:
        raise fail(path, f"unreadable ServeGen rate file ({err})") from None
    return df


def window_iats(pattern: str, shape: float, rate_per_s: float, n: int,
                rng: np.random.Generator) -> np.ndarray:
    """Inter-arrival times (s) from the fitted family, mean ``1 / rate_per_s``."""
    if pattern == "Weibull":
        return rng.weibull(shape, n) / (rate_per_s * math.gamma(1.0 + 1.0 / shape))
    return rng.gamma(shape, 1.0 / (shape * rate_per_s), n)


def window_arrivals(row, start_s: float, end_s: float, rng: np.random.Generator,
                    rate_scale: float = 1.0) -> np.ndarray:
    """Arrival times (s) of one client in one window clipped to [start_s, end_s)."""
    rate_per_s = row.rate_per_s * rate_scale
    if rate_per_s <= 0 or row.pattern not in ("Gamma", "Weibull") or row.shape <= 0:
        return np.empty(0)
    lo, hi = max(start_s, row.window_start_s), min(end_s, row.window_start_s + WINDOW_S)
    times, t = [], row.window_start_s + rng.random() / rate_per_s
    while t < hi:
        n = int(2 * rate_per_s * (hi - t)) + 16
        gaps = window_iats(row.pattern, row.shape, rate_per_s, n, rng)
        arr = t + np.concatenate([[0.0], np.cumsum(gaps[:-1])])
        times.append(arr[arr < hi])
        t = arr[-1] + gaps[-1]
    arr = np.concatenate(times) if times else np.empty(0)
    return arr[arr >= lo]


def client_requests(trace_csv: Path, start_s: float, end_s: float,
                    rng: np.random.Generator, rate_scale: float = 1.0):
    """(arrival_s, prompt, output) arrays of one client over [start_s, end_s)."""
    lengths = ClientLengths(trace_csv.with_name(
        trace_csv.name.replace("-trace.csv", "-dataset.json")))
    if len(lengths.starts_s) == 0:
        return None
    times, prompts, outputs = [], [], []
    for row in load_rates(trace_csv).itertuples():
        if row.window_start_s + WINDOW_S <= start_s or row.window_start_s >= end_s:
            continue
        arr = window_arrivals(row, start_s, end_s, rng, rate_scale)
        if len(arr):
            pin, pout = lengths.at(arr[0])
            times.append(arr)
            prompts.append(pin.sample(len(arr), rng))
            outputs.append(pout.sample(len(arr), rng))
    if not times:
        return None
    return np.concatenate(times), np.concatenate(prompts), np.concatenate(outputs)


def servegen_mix(data_dir: str | Path, start_s: float, duration_s: float, seed: int,
                 rate_scale: float = 1.0, max_clients: int | None = None) -> pd.DataFrame:
    """Synthesises a multi-client trace from a ServeGen model pool.

    Args:
        data_dir: A pool folder, e.g. ``../shared/traces/servegen/data/reason/deepseek-r1``.
        start_s: Start of the generated span, seconds from the pool's time 0.
        duration_s: Length of the span in seconds.
        seed: Seed of the one random generator used.
        rate_scale: Multiplies every client's window rate.
        max_clients: Use only the first N clients (by numeric id), for speed.

    Returns:
        Canonical table with an extra ``client_id`` column; arrivals relative to the
        first generated request.
    """
    data_dir = Path(data_dir)
    files = sorted(data_dir.glob("chunk-*-trace.csv"), key=lambda p: int(p.name.split("-")[1]))
    if not files:
        raise TraceError(f"{data_dir}: no chunk-<id>-trace.csv files (ServeGen pool)")
    rng = np.random.default_rng(seed)
    parts = []
    for path in files[:max_clients]:
        got = client_requests(path, start_s, start_s + duration_s, rng, rate_scale)
        if got is not None:
            parts.append(got + (np.full(len(got[0]), int(path.name.split("-")[1])),))
    if not parts:
        raise TraceError(f"{data_dir}: no requests in [{start_s}, {start_s + duration_s}) s")
    arrival_s, prompt, output, client = (np.concatenate(x) for x in zip(*parts))
    order = np.argsort(arrival_s, kind="stable")
    return build_table(arrival_s[order], prompt[order], output[order],
                       f"synthetic: ServeGen client mix of {data_dir}, "
                       f"[{start_s:g}, {start_s + duration_s:g}) s, seed {seed}",
                       extra={"client_id": client[order]})
