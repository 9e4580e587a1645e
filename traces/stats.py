"""Summary statistics of a canonical trace (``kvsim traces stats``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

QUANTILES = (50, 90, 99)


def ideal_prefix_hit(hash_ids: pd.Series) -> dict:
    """Ideal (infinite-cache) prefix-hit counts for Mooncake-style block ids.

    For each request in arrival order, its hit blocks are the leading blocks whose ids
    were already seen in any earlier request (counting stops at the first unseen id);
    then all of its ids count as seen. Definition from ``../shared/traces/README.md``.

    Args:
        hash_ids: One list of prefix-block ids per request, in arrival order.

    Returns:
        ``hit_blocks``, ``total_blocks``, ``unique_blocks`` and ``hit_ratio``
        (hit / total, 0.0 for no blocks).
    """
    seen: set = set()
    hit = total = 0
    for ids in hash_ids:
        ids = list(ids) if ids is not None else []
        lead = 0
        while lead < len(ids) and ids[lead] in seen:
            lead += 1
        hit += lead
        total += len(ids)
        seen.update(ids)
    return {"hit_blocks": hit, "total_blocks": total, "unique_blocks": len(seen),
            "hit_ratio": hit / total if total else 0.0}


def trace_stats(df: pd.DataFrame, arrivals: bool = True) -> dict:
    """Rows, span, rate, burstiness and length percentiles of a canonical trace.

    Percentiles are linear-interpolated (numpy default), as in the shared README.

    Args:
        df: Canonical table.
        arrivals: False for a length-only trace whose ``arrival_s`` are not the file's
            (e.g. placeholders): span, rate and burstiness are left out.

    Returns:
        Dict with ``rows``, ``span_s``, ``mean_rate_per_s`` (rows / span, as the shared traces README quotes it;
        :func:`analysis.planning.capacity.base_rate_per_s` is (rows - 1) / span, one over the mean gap),
        ``iat_cv`` (std / mean of inter-arrival times, population std) (these three only
        with ``arrivals``), ``prompt_{p50,p90,p99,mean,max}``, ``output_{...}`` and, when
        the table has ``hash_ids``, ``prefix_hit_ratio``, ``prefix_hit_blocks``,
        ``prefix_total_blocks``, ``prefix_unique_blocks``.
    """
    out = {"rows": int(len(df))}
    if arrivals:
        arrival_s = df["arrival_s"].to_numpy(dtype=np.float64)
        span_s = float(arrival_s[-1] - arrival_s[0]) if len(df) else 0.0
        iat_s = np.diff(arrival_s)
        out.update({"span_s": span_s,
                    "mean_rate_per_s": len(df) / span_s if span_s > 0 else float("nan"),
                    "iat_cv": float(iat_s.std() / iat_s.mean())
                    if len(iat_s) and iat_s.mean() > 0 else float("nan")})
    for name in ("prompt", "output"):
        out.update(_length_stats(name, df[f"{name}_tokens"].to_numpy()))
    if "hash_ids" in df.columns:
        hits = ideal_prefix_hit(df["hash_ids"])
        out["prefix_hit_ratio"] = hits["hit_ratio"]
        out.update({f"prefix_{k}": v for k, v in hits.items() if k != "hit_ratio"})
    return out


def _length_stats(name: str, values: np.ndarray) -> dict:
    if len(values) == 0:
        return {f"{name}_{k}": float("nan") for k in ("p50", "p90", "p99", "mean", "max")}
    pct = np.percentile(values, QUANTILES)
    out = {f"{name}_p{q}": float(v) for q, v in zip(QUANTILES, pct)}
    out[f"{name}_mean"] = float(values.mean())
    out[f"{name}_max"] = int(values.max())
    return out


def format_stats(stats: dict) -> str:
    """Renders :func:`trace_stats` output as an aligned two-column text table."""
    width = max(len(k) for k in stats)
    lines = []
    for key, value in stats.items():
        lines.append(f"{key:<{width}}  {_fmt(key, value)}")
    return "\n".join(lines)


UNDEFINED_STATS = {"mean_rate_per_s": "undefined (every request arrives at the same instant: span 0 s)",
                   "iat_cv": "undefined (no gap between arrivals)"}
"""How :func:`format_stats` prints a figure that has no value (NaN in :func:`trace_stats`)."""


def _fmt(key: str, value) -> str:
    if isinstance(value, float) and value != value and key in UNDEFINED_STATS:
        return UNDEFINED_STATS[key]
    if key == "prefix_hit_ratio":
        return f"{100 * value:.1f} %"
    if isinstance(value, float) and value == value and value != int(value):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.4g}"
    return f"{value:,.0f}" if isinstance(value, float) and value == value else f"{value:,}"
