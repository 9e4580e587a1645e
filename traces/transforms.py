"""Composable trace transformations; each returns a new canonical table.

None modifies its input. Row order, ``request_id`` and the zero first arrival are
re-established by :func:`traces.canonical.renumber`. :func:`scale_rate`, :func:`first_n`, :func:`skip_n` and
:func:`clip_context` also take a :class:`traces.canonical.TraceColumns` (``kvsim simulate``'s table without
pandas) and return one, with the values the DataFrame form gives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from traces.canonical import TraceColumns, renumber
from traces.errors import TraceError, plain

if TYPE_CHECKING:
    import pandas as pd


def _source(df: pd.DataFrame, what: str) -> str:
    return f"{df.attrs.get('source', 'trace')} | {what}"


def scale_rate(df: pd.DataFrame, factor: float, name: str = "rate scale") -> pd.DataFrame:
    """Multiplies the arrival rate by ``factor`` (divides every arrival time by it).

    Args:
        df: Canonical table.
        factor: Rate multiplier, > 0 (2.0 = twice as many requests per second).
        name: How messages name the factor (a command line passes its flag, ``--rate-scale``).

    Raises:
        TraceError: ``factor`` not finite and > 0, or an arrival moved beyond
            :data:`traces.canonical.MAX_ARRIVAL_S` after the first (a tiny factor stretches the trace).
    """
    if not (factor > 0 and np.isfinite(factor)):
        raise TraceError(f"{name}: must be a finite number > 0 (got {plain(factor)})")
    if isinstance(df, TraceColumns):
        out = df.with_columns(arrival_s=df["arrival_s"] / factor)
    else:
        out = df.assign(arrival_s=df["arrival_s"] / factor)
        out.attrs = dict(df.attrs)
    try:
        return renumber(out, _source(df, f"rate x{factor:g}"))
    except TraceError as exc:
        raise TraceError(f"{name} {factor:g} stretches the arrivals beyond the simulator clock's exact range: "
                         f"{exc}") from None


def time_window(df: pd.DataFrame, start_s: float, end_s: float) -> pd.DataFrame:
    """Keeps requests with ``start_s <= arrival_s < end_s``; the first kept arrives at 0 s.

    Raises:
        TraceError: If ``end_s <= start_s``.
    """
    if not end_s > start_s:
        raise TraceError(f"time_window: end_s must be > start_s (got {start_s}, {end_s})")
    keep = (df["arrival_s"] >= start_s) & (df["arrival_s"] < end_s)
    return renumber(df[keep], _source(df, f"window [{start_s:g}, {end_s:g}) s"))


def first_n(df: pd.DataFrame, n: int) -> pd.DataFrame:
    """Keeps the first ``n`` requests in arrival order (all of them if fewer)."""
    if n < 0:
        raise TraceError(f"first_n: n must be >= 0 (got {n})")
    return renumber(df.take(slice(None, n)) if isinstance(df, TraceColumns) else df.iloc[:n],
                    _source(df, f"first {n}"))


def skip_n(df: pd.DataFrame, n: int) -> pd.DataFrame:
    """Drops the first ``n`` requests in arrival order; the first kept one arrives at 0 s (e.g. a second,
    disjoint slice of a trace to fit a model on, with ``first_n`` after it).

    Raises:
        TraceError: If ``n`` is negative or leaves no request.
    """
    if not 0 <= n < len(df):
        raise TraceError(f"--skip-requests {n}: must be in [0, {len(df) - 1}]: the trace has {len(df):,} requests")
    return renumber(df.take(slice(n, None)) if isinstance(df, TraceColumns) else df.iloc[n:],
                    _source(df, f"after the first {n}"))


def sample_n(df: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    """Keeps ``n`` requests drawn uniformly without replacement, in arrival order.

    Raises:
        TraceError: If ``n`` is negative or larger than the table.
    """
    if not 0 <= n <= len(df):
        raise TraceError(f"--sample {n}: cannot draw {n} requests from a trace of {len(df):,}")
    rows = np.sort(np.random.default_rng(seed).choice(len(df), size=n, replace=False))
    return renumber(df.iloc[rows], _source(df, f"sample {n}, seed {seed}"))


def shuffle_sample(df: pd.DataFrame, n: int, seed: int, arrival=None) -> pd.DataFrame:
    """Keeps ``n`` requests drawn uniformly without replacement, in a seeded random order (length-only files are
    often grouped or sorted by length, so their first ``n`` rows are not a fair sample).

    Args:
        df: Canonical table.
        n: Requests to keep, ``1 <= n <= len(df)``.
        seed: Seed of the draw (the permutation uses ``default_rng([seed, 1])``).
        arrival: An arrival spec (``"poisson:RATE"``, ``"gamma:RATE,CV"``, ``"offline"`` or an
            :class:`traces.generators.ArrivalSpec`): the ``n`` requests get arrival times drawn afresh, in the
            shuffled order, from ``default_rng(seed)`` (the times ``--arrival`` gives any ``n`` requests), so the
            rate is the spec's. ``None``: they keep their own times, in arrival order (a timed trace's sample
            offers ``n / len(df)`` of its rate).

    Raises:
        TraceError: If ``n`` is out of range (naming ``--sample`` and the trace's size).
    """
    if not 1 <= n <= len(df):
        raise TraceError(f"--sample {n}: the trace has {len(df):,} requests; choose 1 to {len(df):,}")
    rows = np.random.default_rng([seed, 1]).permutation(len(df))[:n]
    out = df.iloc[rows].reset_index(drop=True)
    out.attrs = dict(df.attrs)
    what = f"sample {n} shuffled (seed {seed})"
    if arrival is not None:
        from traces.generators import arrival_note, arrivals_from_spec
        out = out.assign(arrival_s=arrivals_from_spec(arrival, n, np.random.default_rng(seed)))
        what += f", fresh {arrival_note(arrival, seed)}"
    return renumber(out, _source(df, what))


def clip_context(df: pd.DataFrame, max_context_tokens: int) -> tuple[pd.DataFrame, int]:
    """Clips requests whose prompt + output exceeds a maximum context length.

    For such rows ``prompt = max(1, max - output)`` and then ``output = max - prompt``,
    so the output is kept whole when possible and prompt + output == max.

    Args:
        df: Canonical table.
        max_context_tokens: Model context length in tokens, >= 2.

    Returns:
        (new table, number of rows clipped).
    """
    if not (isinstance(max_context_tokens, (int, np.integer)) and not isinstance(max_context_tokens, bool)):
        raise TraceError(f"max_context_tokens: expected a whole number of tokens, got {max_context_tokens!r}")
    if max_context_tokens < 2:
        raise TraceError(f"a slot of {max_context_tokens} token(s) holds no request: the context (--max-context, or "
                         "the model's max_context_tokens) must be >= 2 tokens")
    light = isinstance(df, TraceColumns)
    prompt = df["prompt_tokens"] if light else df["prompt_tokens"].to_numpy()
    output = df["output_tokens"] if light else df["output_tokens"].to_numpy()
    over = prompt + output > max_context_tokens
    new_prompt = np.where(over, np.maximum(1, max_context_tokens - output), prompt)
    new_output = np.where(over, max_context_tokens - new_prompt, output)
    if light:
        out = df.with_columns(prompt_tokens=new_prompt.astype(np.int64), output_tokens=new_output.astype(np.int64))
    else:
        out = df.assign(prompt_tokens=new_prompt.astype(np.int64),
                        output_tokens=new_output.astype(np.int64))
        if "hash_ids" in df.columns and over.any():
            out["hash_ids"] = _clip_hash_ids(df["hash_ids"], over, new_prompt)
        out.attrs = dict(df.attrs)
    out.attrs["source"] = _source(df, f"clipped to {max_context_tokens} tokens")
    return out, int(over.sum())


def _clip_hash_ids(hash_ids, over: np.ndarray, prompt_tokens: np.ndarray) -> list:
    """A clipped request's prefix-block ids cut to its new prompt's :func:`traces.canonical.prefix_block_count`
    (the count a canonical trace holds: :func:`traces.canonical.hash_ids_problem`); the simulator reads only the first
    ``prompt // 512`` of them, so its results are those of the uncut ids, and the table can be written and read
    back (``kvsim traces convert --max-context``)."""
    from traces.canonical import prefix_block_count

    out = list(hash_ids)
    for row in np.flatnonzero(over):
        ids = out[row]
        if ids is not None:
            out[row] = ids[:prefix_block_count(prompt_tokens[row])]
    return out


def merge(dfs: list[pd.DataFrame]) -> pd.DataFrame:
    """Overlays traces on one time axis (each starts at 0 s), sorted by arrival.

    A ``trace_index`` column says which input each row came from; columns missing
    from some inputs are filled with NA.

    Raises:
        TraceError: If ``dfs`` is empty.
    """
    import pandas as pd

    if not dfs:
        raise TraceError("merge: no traces given")
    parts = [d.assign(trace_index=i) for i, d in enumerate(dfs)]
    out = pd.concat(parts, ignore_index=True)
    out.attrs = {}
    names = " + ".join(str(d.attrs.get("source", "?")) for d in dfs)
    return renumber(out, f"merge of {names}")
