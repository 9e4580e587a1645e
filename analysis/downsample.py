"""Shrinking long per-iteration timelines for plotting, without hiding what matters.

A run of the full Azure conversation trace has ~620,000 iterations; a browser draws ~5,000 points per line
quickly. Three reductions, all over equal-width time buckets:

* :func:`min_max` keeps, per bucket, the points with the smallest and the largest value (in time order), so
  every spike and every dip stays visible (the idea of plotly-resampler's MinMax aggregator)::

      raw:      . .^. . . .v. .      bucket 1 | bucket 2
      kept:      ^ .         v .     (min and max of each bucket)

* :func:`min_max_band` gives, per bucket, the mean (drawn as the line) and the min and max (drawn as a shaded
  band around it), so a dense, oscillating timeline reads as a line with its range, not as a solid block of
  zig-zags; every spike and dip still bounds the band.
* :func:`bucket_mean` averages each column per bucket; means of parts still add up to the mean of the
  whole, so stacked areas (page pool) stay consistent.
* :func:`bin_sums` adds counts per fixed time window (map / unmap operations).

Nothing here drops rare events: callers plot stalls from the full table (see :mod:`analysis.figures`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

MAX_POINTS = 5000  # points per downsampled series
BAND_BUCKETS = 1000  # buckets of a line-with-band timeline (about one per pixel of a 1,400 px wide page)


def _bucket_ids(x: np.ndarray, num_buckets: int) -> np.ndarray:
    """Equal-width bucket index (0 .. num_buckets-1) of each ``x`` (sorted or not)."""
    lo, hi = float(x.min()), float(x.max())
    if hi <= lo:
        return np.zeros(len(x), dtype=np.int64)
    ids = ((x - lo) / (hi - lo) * num_buckets).astype(np.int64)
    return np.minimum(ids, num_buckets - 1)


def min_max(x: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Downsample a series to at most ``max_points`` points, keeping each time bucket's min and max.

    Args:
        x: sample positions (e.g. time, s), any order; shape ``(n,)``.
        y: values, shape ``(n,)``; NaNs are dropped.
        max_points: upper bound on the points returned (two per bucket).

    Returns:
        ``(x, y)`` sorted by ``x``; the input unchanged (but sorted) when it has ``<= max_points`` points.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = ~np.isnan(y)
    x, y = x[keep], y[keep]
    if len(x) <= max_points:
        order = np.argsort(x, kind="stable")
        return x[order], y[order]
    ids = _bucket_ids(x, max(max_points // 2, 1))
    order = np.lexsort((y, ids))                 # by bucket, then by value
    sorted_ids = ids[order]
    first = np.r_[True, sorted_ids[1:] != sorted_ids[:-1]]
    last = np.r_[sorted_ids[1:] != sorted_ids[:-1], True]
    chosen = np.unique(order[first | last])      # indices of each bucket's min and max
    chosen = chosen[np.argsort(x[chosen], kind="stable")]
    return x[chosen], y[chosen]


@dataclass(frozen=True)
class Band:
    """A timeline as a line (``mean`` per bucket) with its range (``lo`` .. ``hi``), at positions ``x`` (each
    bucket's mean position); ``downsampled`` is False when every point was kept (then lo = mean = hi)."""

    x: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    downsampled: bool
    bucket: np.ndarray | None = None   # bucket index of each point (downsampled only)

    def segments(self) -> list[slice]:
        """Runs of adjacent non-empty buckets (a band is not drawn across an empty bucket: an idle gap)."""
        if not self.downsampled or len(self.x) == 0:
            return [slice(0, len(self.x))]
        cuts = np.flatnonzero(np.diff(self.bucket) > 1) + 1
        edges = [0, *cuts.tolist(), len(self.x)]
        return [slice(a, b) for a, b in zip(edges[:-1], edges[1:])]


def min_max_band(x: np.ndarray, y: np.ndarray, buckets: int = BAND_BUCKETS) -> Band:
    """Per equal-width bucket of ``x``: the mean, minimum and maximum of ``y`` (NaNs dropped, empty buckets
    left out); series of at most ``buckets`` points come back whole, sorted by ``x``.

    The band's extremes are the series' extremes: ``hi.max() == nanmax(y)`` and ``lo.min() == nanmin(y)``.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = ~np.isnan(y)
    x, y = x[keep], y[keep]
    if len(x) <= buckets:
        order = np.argsort(x, kind="stable")
        return Band(x[order], y[order], y[order], y[order], False)
    ids = _bucket_ids(x, buckets)
    stats = pd.DataFrame({"id": ids, "x": x, "y": y}).groupby("id", sort=True).agg(
        x=("x", "mean"), mean=("y", "mean"), lo=("y", "min"), hi=("y", "max"))
    return Band(stats["x"].to_numpy(), stats["mean"].to_numpy(), stats["lo"].to_numpy(), stats["hi"].to_numpy(), True,
                stats.index.to_numpy())


def bucket_mean(frame: pd.DataFrame, x: str, columns: list[str], max_points: int = MAX_POINTS) -> pd.DataFrame:
    """Mean of ``columns`` per equal-width bucket of ``x`` (at most ``max_points`` buckets).

    Args:
        frame: the table (e.g. iterations with a ``time_s`` column).
        x: name of the position column; the result's ``x`` is each bucket's mean position.
        columns: the columns to average.
        max_points: number of buckets; tables no longer than this come back unchanged.

    Returns:
        A DataFrame with ``x`` and ``columns``, sorted by ``x``, empty buckets left out.
    """
    if len(frame) <= max_points:
        return frame[[x, *columns]].sort_values(x, kind="stable").reset_index(drop=True)
    ids = _bucket_ids(frame[x].to_numpy(dtype=float), max_points)
    return frame[[x, *columns]].groupby(ids, sort=True).mean().reset_index(drop=True)


def bin_sums(x: np.ndarray, columns: dict[str, np.ndarray], window: float, start: float = 0.0) -> pd.DataFrame:
    """Sum each column over fixed windows of ``x``: ``[start, start + window)``, ...

    Args:
        x: positions (e.g. time, s), shape ``(n,)``.
        columns: name -> values, each shape ``(n,)``.
        window: window width, in the unit of ``x``; > 0.
        start: left edge of the first window.

    Returns:
        A DataFrame with ``x`` (each window's centre) and one summed column per name, one row per window
        from the first to the last non-empty one (empty windows in between give 0).
    """
    if window <= 0:
        raise ValueError(f"window must be > 0, got {window}")
    x = np.asarray(x, dtype=float)
    if len(x) == 0:
        return pd.DataFrame({"x": np.array([], dtype=float), **{k: np.array([]) for k in columns}})
    ids = np.floor((x - start) / window).astype(np.int64)
    lo = int(ids.min())
    count = int(ids.max()) - lo + 1
    sums = {name: np.bincount(ids - lo, weights=np.asarray(v, dtype=float), minlength=count)
            for name, v in columns.items()}
    centres = start + (np.arange(count) + lo + 0.5) * window
    return pd.DataFrame({"x": centres, **sums})


def nice_window(span: float, max_bins: int = 200) -> float:
    """The smallest 1-2-5 x 10^k width that cuts ``span`` into at most ``max_bins`` windows (> 0)."""
    if not span > 0:
        return 1.0
    raw = span / max_bins
    base = 10.0 ** np.floor(np.log10(raw))
    for step in (1.0, 2.0, 5.0, 10.0):
        if step * base >= raw:
            return float(step * base)
    return float(10.0 * base)  # pragma: no cover - the loop always returns


def cdf_points(values: np.ndarray, max_points: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF of ``values`` (NaN and inf dropped), at most ``max_points`` points.

    Returns:
        ``(x, p)``: sorted values and their cumulative share in (0, 1]; evenly spaced in rank when
        downsampled, always including the smallest and largest value.
    """
    v = np.asarray(values, dtype=float)
    v = np.sort(v[np.isfinite(v)])
    if len(v) == 0:
        return v, v
    p = np.arange(1, len(v) + 1) / len(v)
    if len(v) > max_points:
        keep = np.unique(np.linspace(0, len(v) - 1, max_points).round().astype(np.int64))
        v, p = v[keep], p[keep]
    return v, p
