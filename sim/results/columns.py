"""Exact statistics of float64 columns too large to hold twice (issue 18): order statistics across sorted
arrays, numpy's linear-interpolated percentile and numpy's pairwise sum reproduced bit for bit, and Parquet
columns read row group by row group. Used by the bounded replica merge (:mod:`sim.cluster.replica_merge`) and by a
streamed run's summary (:func:`analysis.results.build_result`).

Tables without pandas (issue 32): :class:`ColumnTable` (numpy columns), their Arrow arrays
(:func:`arrow_array`, :func:`arrow_strings`) and their Parquet file (:func:`write_parquet`)."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

_SIGN = 1 << 63
_PAIRWISE_LEAF = 1 << 16


class ColumnTable:
    """A table as numpy columns, without pandas (issue 32): ``kvsim simulate``'s canonical trace
    (:data:`traces.canonical.TraceColumns`, which the engine takes as it takes the DataFrame) and a fresh run's
    request table (:meth:`sim.core.engine.SimOutput.request_table`).

    The part of a DataFrame's surface that these paths use: ``len``, ``columns`` (names, in order),
    ``name in table``, ``table[name]`` (the numpy array, not a copy: do not write to it), ``attrs`` (a dict,
    ``attrs["source"]``). Transformations return new tables (:func:`traces.canonical.renumber`,
    :mod:`traces.transforms`).
    """

    __slots__ = ("_columns", "attrs")

    def __init__(self, columns: Mapping[str, np.ndarray], attrs: dict | None = None):
        self._columns = dict(columns)
        self.attrs = dict(attrs or {})

    def __len__(self) -> int:
        return len(next(iter(self._columns.values()))) if self._columns else 0

    @property
    def columns(self) -> list[str]:
        """Column names, in order."""
        return list(self._columns)

    def __contains__(self, name: str) -> bool:
        return name in self._columns

    def __getitem__(self, name: str) -> np.ndarray:
        return self._columns[name]

    def with_columns(self, **columns: np.ndarray) -> ColumnTable:
        """A new table with these columns replaced or added (the others shared), ``attrs`` copied."""
        return ColumnTable({**self._columns, **columns}, self.attrs)

    def take(self, rows) -> ColumnTable:
        """A new table of ``rows`` (a slice or an index array) of every column, ``attrs`` copied."""
        return ColumnTable({name: values[rows] for name, values in self._columns.items()}, self.attrs)

    def to_frame(self) -> pd.DataFrame:
        """The DataFrame of these columns, ``attrs`` copied (string columns: pandas' own inference)."""
        import pandas as pd

        frame = pd.DataFrame(self._columns, copy=False)
        frame.attrs = dict(self.attrs)
        return frame


# ---- Arrow arrays of numpy columns ----------------------------------------------------------------------

def arrow_array(values: np.ndarray):
    """``pyarrow.array(values)`` of a 1-D numpy column, the same array (zero-copy, no nulls: a NaN stays a
    value), built from its buffer where it is int64 or float64: ``pyarrow.array`` asks pandas whether a
    numpy array is a categorical, which imports pandas (0.3 s) the first time (issue 32: ``kvsim simulate``
    streams its records without pandas). Other dtypes go through ``pyarrow.array``."""
    import pyarrow as pa

    arrow_type = {"i8": pa.int64(), "f8": pa.float64()}.get(values.dtype.str[1:]) if values.ndim == 1 else None
    if arrow_type is None or not values.dtype.isnative:
        return pa.array(values)
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)], null_count=0)


def arrow_strings(values) -> object:
    """``pyarrow.array(values, type=pyarrow.large_string())`` of Python strings (no None), from its buffers (no
    pandas: see :func:`arrow_array`). ``large_string`` is what pandas 3's ``str`` columns are written as."""
    import pyarrow as pa

    encoded = [value.encode("utf-8") for value in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    return pa.Array.from_buffers(pa.large_string(), len(encoded),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))], null_count=0)


def write_parquet(table: ColumnTable, path: str | Path) -> None:
    """Write ``table`` (int64 and float64 columns, and object columns of Python strings) to Parquet as
    ``table.to_frame().to_parquet(path, index=False)`` writes it: the same Arrow schema and values, snappy
    compression and pyarrow's defaults, but without pandas' schema metadata (``pandas.read_parquet`` reads
    back the same DataFrame: ``tests/test_results_light.py``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrays = [arrow_strings(table[name]) if table[name].dtype == object else arrow_array(table[name])
              for name in table.columns]
    pq.write_table(pa.Table.from_arrays(arrays, names=table.columns), path, compression="snappy")


# ---- exact order statistics across sorted arrays -------------------------------------------------------

def _key(value: float) -> int:
    """The float's position in the order of float64 values, as an integer (monotone; -0.0 just below 0.0)."""
    bits = int(np.array([value], dtype=np.float64).view(np.int64)[0])
    return bits if bits >= 0 else -(bits & (_SIGN - 1)) - 1


def _value(key: int) -> float:
    """Inverse of :func:`_key`."""
    bits = key if key >= 0 else (-key - 1) | _SIGN
    return float(np.array([bits], dtype=np.uint64).view(np.float64)[0])


def kth_smallest(arrays: list, k: int, cumulative: list | None = None) -> float:
    """The k-th smallest value (1-based) of the union of sorted float arrays, exactly.

    Args:
        arrays: ascending float64 arrays without NaN (memory-mapped ones are read only where searched); empty
            ones allowed.
        k: 1 <= k <= the total count.
        cumulative: for weighted values, per array the cumulative weights (``cumulative[i][j]`` = weight of
            ``arrays[i][:j + 1]``); the k-th smallest is then the smallest value whose cumulative weight over the
            union reaches k (nearest rank).

    Raises:
        ValueError: k out of range, or a NaN among the values.
    """
    pairs = [(a, None if cumulative is None else c) for a, c in zip(arrays, cumulative or [None] * len(arrays))
             if len(a)]
    total = sum(len(a) if c is None else int(c[-1]) for a, c in pairs)
    if not 1 <= k <= total:
        raise ValueError(f"k={k} outside 1..{total}")
    if any(np.isnan(a[-1]) for a, _ in pairs):
        raise ValueError("NaN among the values")

    def at_most(value: float) -> int:
        count = 0
        for a, c in pairs:
            index = int(np.searchsorted(a, value, side="right"))
            count += index if c is None else (int(c[index - 1]) if index else 0)
        return count

    low = min(_key(float(a[0])) for a, _ in pairs)
    high = max(_key(float(a[-1])) for a, _ in pairs)
    while low < high:               # smallest key whose value has at least k values at most it
        middle = (low + high) // 2
        if at_most(_value(middle)) >= k:
            high = middle
        else:
            low = middle + 1
    found = _value(low)
    for a, _ in pairs:              # the value as stored (0.0 and -0.0 compare equal)
        index = int(np.searchsorted(a, found, side="left"))
        if index < len(a) and a[index] == found:
            return float(a[index])
    return found


def linear_percentile(count: int, q: float, kth) -> float:
    """``np.percentile(values, q)`` (linear interpolation) of ``count`` values, bit for bit, from
    ``kth(i)``, the i-th smallest value (0-based): numpy's virtual index ``(count - 1) * q / 100``, its two
    neighbours and its interpolation (``numpy.lib._function_base_impl._lerp``)."""
    quantile = np.true_divide(q, 100)
    virtual = (count - 1) * quantile
    previous = np.floor(virtual)
    if virtual >= count - 1:        # numpy takes the last value for both neighbours
        low = high = count - 1
        previous = np.float64(-1.0)
    else:
        low = int(previous)
        high = low + 1
    gamma = float(virtual - previous)
    a = np.float64(kth(low))
    b = a if high == low else np.float64(kth(high))
    diff = b - a
    result = a + diff * gamma
    if gamma >= 0.5:
        result = b - diff * (1 - gamma)
    return float(result)


# ---- numpy's pairwise summation over a concatenation ---------------------------------------------------

def pairwise_sum(length: int, take, leaf: int = _PAIRWISE_LEAF) -> float:
    """``np.sum`` of a float64 array of ``length`` values, bit for bit, without holding it: ``take(start, stop)``
    returns the contiguous values ``[start, stop)`` (called with increasing ranges). numpy sums a contiguous
    array pairwise (halves rounded down to a multiple of 8, blocks of at most 128 values unrolled by 8), so the
    tree is walked here and every subtree of at most ``leaf`` values (at least 128, numpy's block) is summed by
    ``np.add.reduce``."""
    leaf = max(leaf, 128)

    def subtree(start: int, n: int):
        if n <= leaf:
            return np.add.reduce(take(start, start + n))
        half = n // 2
        half -= half % 8
        return subtree(start, half) + subtree(start + half, n - half)

    return float(subtree(0, length)) if length else 0.0


class Concatenation:
    """Sequential reads of arrays laid end to end, loading one part at a time (``loaders[i]()`` returns part i,
    ``lengths[i]`` long)."""

    def __init__(self, loaders: list, lengths: list[int]):
        self.loaders, self.lengths = loaders, [int(n) for n in lengths]
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths, dtype=np.int64)]).tolist()
        self.length = self.offsets[-1]
        self._part, self._values = -1, None

    def _load(self, part: int) -> np.ndarray:
        if part != self._part:
            self._values = None
            self._values = np.ascontiguousarray(self.loaders[part](), dtype=np.float64)
            if len(self._values) != self.lengths[part]:
                raise ValueError(f"part {part}: {len(self._values)} values, expected {self.lengths[part]}")
            self._part = part
        return self._values

    def take(self, start: int, stop: int) -> np.ndarray:
        pieces = []
        part = int(np.searchsorted(self.offsets, start, side="right")) - 1
        while start < stop:
            while self.offsets[part + 1] <= start:
                part += 1
            end = min(stop, self.offsets[part + 1])
            values = self._load(part)
            pieces.append(values[start - self.offsets[part]:end - self.offsets[part]])
            start = end
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


# ---- Parquet columns ------------------------------------------------------------------------------------

def read_column(path: str | Path, name: str, dtype=np.float64) -> np.ndarray:
    """One column of a Parquet file as a numpy array, filled row group by row group (no second copy of the
    whole column, as reading a table and converting it makes)."""
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    out = np.empty(parquet.metadata.num_rows, dtype=dtype)
    start = 0
    for group in range(parquet.num_row_groups):
        values = parquet.read_row_group(group, columns=[name]).column(0).to_numpy()
        out[start:start + len(values)] = values
        start += len(values)
    return out


def row_groups(path: str | Path, name: str, nan_as_zero: bool = False) -> Concatenation:
    """A column of a Parquet file as a :class:`Concatenation` of its row groups (``nan_as_zero``: NaN read
    as 0, as pandas sums)."""
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)

    def loader(group: int):
        def load():
            values = parquet.read_row_group(group, columns=[name]).column(0).to_numpy().astype(np.float64)
            return np.where(np.isnan(values), 0.0, values) if nan_as_zero else values
        return load

    return Concatenation([loader(g) for g in range(parquet.num_row_groups)],
                         [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)])


def column_sum(path: str | Path, name: str) -> float:
    """``float(pd.read_parquet(path, columns=[name])[name].sum())`` bit for bit, one row group at a time."""
    column = row_groups(path, name, nan_as_zero=True)
    return pairwise_sum(column.length, column.take)


def distinct_counts(values: np.ndarray, counts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values of an ascending array and the cumulative count (or weight) up to each (the layout
    :func:`kth_smallest` takes with ``cumulative``)."""
    if not len(values):
        return values[:0].copy(), np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.concatenate([[True], values[1:] != values[:-1]]))
    if counts is None:
        cumulative = np.append(starts[1:], len(values)).astype(np.int64)
    else:
        cumulative = np.cumsum(np.add.reduceat(counts, starts)).astype(np.int64)
    return values[starts].copy(), cumulative
