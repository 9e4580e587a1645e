"""Per-iteration records kept in columnar chunks (and optionally streamed to Parquet) as a run goes.

The serving loop adds one tuple per stepped iteration (:data:`sim.results.records.ITERATION_COLUMNS` order), written
into typed buffers at once (:class:`StepBuffer`), and one *block* per fast-forwarded decode run, appended to flat
columnar buffers (:class:`RunBuffer`, expanded by :func:`expand_blocks`). Every ``chunk_iterations`` iterations the
buffer becomes one columnar chunk: numpy columns in iteration order (~180 B per iteration instead of ~770 B as
Python tuples), kept in memory, or, with ``path``, written as Arrow arrays into one row group of a Parquet
file, so that memory stays flat however long the trace (no pandas in the loop: a DataFrame is built only when
the whole table is asked for). Chunks are cut between iterations, so sorting each chunk by iteration number
gives the same table as sorting the whole run. A streamed run also keeps what its summary needs
(:meth:`IterationRecorder.summary_figures`, :meth:`IterationRecorder.column`), so that the summary is not read
back from the file.
"""
from __future__ import annotations

from array import array
from operator import itemgetter
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

from sim.results.records import ITERATION_COLUMNS, ITERATION_UNIQUE_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_CHUNK_ITERATIONS = 1 << 16   # ~50 MB of buffered tuples at most; row groups of ~11 MB

RUN_ZERO_COLUMNS = ("sync_stall_us", "sync_map_page_groups", "bg_map_page_groups", "unmap_page_groups",
                    "prefill_tokens", "preemptions", "swap_us", "clear_copy_us")
"""The iteration columns that are zero at every step of a fast-forwarded decode run (:func:`expand_blocks`)."""

RUN_CONSTANTS = ("batch_size", "num_running", "num_waiting", "mapped_page_groups", "free_page_groups",
                 "deferred_page_groups")
"""The iteration columns that stay constant over a fast-forwarded decode run, in a run's ``constants`` order."""

KEPT_COLUMNS = ("duration_us", "sync_stall_us")
"""Float columns a streamed recorder keeps whole in memory (the summary's percentiles and means: 16 B per
iteration, what reading them back would hold)."""

SUMMED_COLUMNS = ("block_table_us", "clear_copy_us")
"""Float columns whose totals the summary takes (numpy's pairwise sum, NaN as 0 as pandas sums): a streamed
recorder keeps a chunk of them only where it is not all zeros."""


FLOAT_COLUMNS = tuple(name for name in ITERATION_COLUMNS if name.endswith("_us"))
"""The float64 iteration columns (times, us); the others are int64."""
INT_COLUMNS = tuple(name for name in ITERATION_COLUMNS if not name.endswith("_us"))
_FLOAT_FIELDS = itemgetter(*(ITERATION_COLUMNS.index(name) for name in FLOAT_COLUMNS))
_INT_FIELDS = itemgetter(*(ITERATION_COLUMNS.index(name) for name in INT_COLUMNS))


class StepBuffer:
    """Stepped iterations in two flat typed buffers (no tuple kept per iteration): each record's
    :data:`INT_COLUMNS` values appended to ``ints`` (``array('q')``) and its :data:`FLOAT_COLUMNS` values to
    ``floats`` (``array('d')``) when it is added, while they are still in the cache. (Keeping the tuples and
    converting them per chunk cost ~10 ms a chunk on the conversation trace: 22 reads of scattered Python
    objects per row.)"""

    def __init__(self):
        self.ints, self.floats = array("q"), array("d")

    def __len__(self) -> int:
        return len(self.ints) // len(INT_COLUMNS)

    def add(self, record: tuple) -> None:
        """One record in :data:`ITERATION_COLUMNS` order.

        Raises:
            TypeError: a value of an int64 column that is not an integer (``array('q')`` refuses it).
        """
        self.ints.extend(_INT_FIELDS(record))
        self.floats.extend(_FLOAT_FIELDS(record))

    def columns(self) -> dict[str, np.ndarray]:
        """Each column's values in the order added (strided views of the buffers: copy them before adding more)."""
        rows = len(self)
        ints = np.frombuffer(self.ints, dtype=np.int64).reshape(rows, len(INT_COLUMNS))
        floats = np.frombuffer(self.floats, dtype=float).reshape(rows, len(FLOAT_COLUMNS))
        return {**{name: ints[:, k] for k, name in enumerate(INT_COLUMNS)},
                **{name: floats[:, k] for k, name in enumerate(FLOAT_COLUMNS)}}


RUN_FIELDS = ("first", "length", *RUN_CONSTANTS, "used", "waste", "waste_step", "period", "crossings")
"""The integers :class:`RunBuffer` keeps per run, in this order (one interleaved row of its ``ints`` buffer)."""


class RunBuffer:
    """Fast-forwarded decode runs in flat columns (``array`` buffers, no per-run objects).

    Per run, one row of :data:`RUN_FIELDS` in ``ints`` (appended in one call): the ``first`` iteration, its
    ``length`` k, the constants (:data:`RUN_CONSTANTS`), and what the used page groups and tail waste of its
    steps follow from (expanded by :func:`expand_blocks`): ``used`` and ``waste`` bytes in its first step,
    ``waste_step`` (bytes less each step), ``period`` (tokens per page) and the number of its page
    ``crossings``, entries of ``(residue, requests)`` in ``crossing_residues`` / ``crossing_requests``
    (``requests`` more used page groups at every step ``j >= 1`` with ``j % period == residue``); its
    ``block_table_us``. Per step: ``starts_us`` (k + 1 per run: each step's start, then the run's end) and
    ``compute_us``."""

    def __init__(self):
        self.ints, self.block_table_us = array("q"), array("d")
        self.starts_us, self.compute_us = array("d"), array("d")
        self.crossing_residues, self.crossing_requests = array("q"), array("q")

    def __len__(self) -> int:
        return len(self.block_table_us)

    def add(self, first_iteration: int, starts_us, compute_us, constants: tuple, block_table_us: float,
            pages: tuple) -> None:
        """One run of ``k = len(compute_us)`` steps: ``starts_us`` k + 1 floats (us), ``compute_us`` k floats (us)
        (lists or numpy arrays); ``constants``: :data:`RUN_CONSTANTS` (6 ints); ``pages``: ``(used, waste,
        waste_step, period, crossings)`` with ``crossings`` a dict residue -> requests (class docstring)."""
        used, waste, waste_step, period, crossings = pages
        self.ints.extend((first_iteration, len(compute_us), *constants, used, waste, waste_step, period,
                          len(crossings)))
        self.block_table_us.append(block_table_us)
        self.crossing_residues.extend(crossings.keys())
        self.crossing_requests.extend(crossings.values())
        extend_array(self.starts_us, starts_us)
        extend_array(self.compute_us, compute_us)

    def fields(self) -> dict[str, np.ndarray]:
        """:data:`RUN_FIELDS` -> one int64 array per field (a value per run, contiguous copies)."""
        rows = np.frombuffer(self.ints, dtype=np.int64).reshape(-1, len(RUN_FIELDS))
        return {name: np.ascontiguousarray(rows[:, k]) for k, name in enumerate(RUN_FIELDS)}


def extend_array(buffer: array, values) -> None:
    """Append ``values`` (a list, or a numpy array copied as its bytes; any other iterable item by item) to an
    ``array`` buffer. A list goes through ``array.fromlist`` (sized once: half the time of ``extend``)."""
    if isinstance(values, list):
        buffer.fromlist(values)
    elif isinstance(values, np.ndarray):
        buffer.frombytes(values.astype(DTYPES[buffer.typecode], copy=False).tobytes())
    else:
        buffer.extend(values)


DTYPES = {"d": np.float64, "q": np.int64}
"""numpy dtype of each ``array`` type code used by the buffers."""


class IterationRecorder:
    """Buffers iteration records and turns them into columnar chunks.

    A streamed run's row groups are written by one writer thread while the simulation goes on (pyarrow encodes
    and compresses without holding the GIL: on the 2-core machines ~0.13 s of the conversation trace's run that the
    serving loop no longer waits for, ``docs/scale.md`` Round 9), one chunk in flight at a time, in order, so the
    file is the one a sequential writer makes; :meth:`close` waits for it and raises what writing raised.

    Args:
        path: a Parquet file to stream row groups into (created on the first chunk; replaced if it exists);
            ``None``: keep the chunks in memory.
        chunk_iterations: iterations per chunk (row group).
    """

    def __init__(self, path: str | Path | None = None, chunk_iterations: int = DEFAULT_CHUNK_ITERATIONS):
        self.path = Path(path) if path is not None else None
        self.chunk_iterations = chunk_iterations
        self.singles = StepBuffer()
        self.blocks = RunBuffer()
        self.buffered = 0
        self.chunks: list[dict[str, np.ndarray]] = []      # in memory: one {column: array} per chunk
        self.rows = 0
        self.blocks_recorded = 0
        self._writer = None
        self._closed = False
        # a streamed run's summary parts (class docstring of the module)
        self._thread = None           # the writer thread of a streamed run (a one-worker ThreadPoolExecutor)
        self._writing = None          # the chunk it is writing (a Future)
        self._kept: dict[str, list[np.ndarray]] = {name: [] for name in KEPT_COLUMNS}
        self._summed: dict[str, list] = {name: [] for name in SUMMED_COLUMNS}    # arrays, or lengths of zeros
        self._counts = _empty_counts()

    def add(self, record: tuple) -> None:
        """One stepped iteration (a tuple in :data:`ITERATION_COLUMNS` order)."""
        self.singles.add(record)
        self.buffered += 1
        if self.buffered >= self.chunk_iterations:
            self.flush()

    def add_run(self, first_iteration: int, starts_us, compute_us, constants: tuple, block_table_us: float,
                pages: tuple) -> None:
        """One fast-forwarded decode run of ``k = len(compute_us)`` iterations from ``first_iteration``:
        ``starts_us`` k + 1 floats (us; the last one the run's end), ``compute_us`` k floats (us), ``constants``
        as :data:`RUN_CONSTANTS`, ``block_table_us`` each iteration's block-table time (us), ``pages`` what the
        used page groups and tail waste of its steps follow from (:meth:`RunBuffer.add`)."""
        self.blocks.add(first_iteration, starts_us, compute_us, constants, block_table_us, pages)
        self.blocks_recorded += 1
        self.buffered += len(compute_us)
        if self.buffered >= self.chunk_iterations:
            self.flush()

    def flush(self) -> None:
        """Turn the buffer into one chunk (written as one row group when streaming).

        Raises:
            RuntimeError: records added after the streamed file was closed.
        """
        if not self.buffered:
            return
        if self._closed:
            raise RuntimeError(f"{self.path}: iteration records added after the file was closed")
        columns = records_columns(self.singles, self.blocks)
        self.singles, self.blocks, self.buffered = StepBuffer(), RunBuffer(), 0
        rows = len(columns["iteration"])
        self.rows += rows
        if self.path is None:
            self.chunks.append(columns)
            return
        self._keep_for_summary(columns, rows)
        import pyarrow as pa
        import pyarrow.parquet as pq

        from sim.results.columns import arrow_array

        table = pa.Table.from_arrays([arrow_array(columns[name]) for name in ITERATION_COLUMNS],
                                     names=list(ITERATION_COLUMNS))
        if self._writer is None:
            from concurrent.futures import ThreadPoolExecutor

            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self.path, table.schema, use_dictionary=[
                name for name in ITERATION_COLUMNS if name not in ITERATION_UNIQUE_COLUMNS])
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvsim-records")
        self._wait_written()               # one chunk in flight at most: memory stays one chunk's
        self._writing = self._thread.submit(self._writer.write_table, table)

    def _wait_written(self) -> None:
        """Wait for the chunk in flight (raising what writing it raised, e.g. a full disk's OSError)."""
        if self._writing is not None:
            writing, self._writing = self._writing, None
            writing.result()

    def _keep_for_summary(self, columns: dict[str, np.ndarray], rows: int) -> None:
        """A streamed chunk's part of the summary: its kept columns, its summed columns (where not all zeros)
        and its integer figures (:func:`chunk_counts`, added exactly)."""
        for name in KEPT_COLUMNS:
            self._kept[name].append(columns[name])
        for name in SUMMED_COLUMNS:
            values = columns[name]
            self._summed[name].append(values if values.any() or np.isnan(values).any() else rows)
        self._counts = add_counts(self._counts, chunk_counts(columns["batch_size"], columns["mapped_page_groups"],
                                                             columns["tail_waste_bytes"]))

    def close(self) -> None:
        """Flush what is buffered and close the Parquet file (an empty run writes an empty table); once."""
        self.flush()
        if self.path is None or self._closed:
            return
        self._closed = True
        if self._writer is None:
            empty = records_frame(StepBuffer(), RunBuffer())
            empty.to_parquet(self.path, index=False)
        else:
            try:
                self._wait_written()
            finally:
                self._thread.shutdown()
                self._thread = None
                self._writer.close()
                self._writer = None

    def summary_figures(self) -> dict:
        """A streamed run's integer figures and float totals, as
        :func:`sim.results.summary.iteration_counts_of_file` reads them from its file (the same values: integer
        sums and maxima, and numpy's pairwise sums of :data:`SUMMED_COLUMNS` with NaN as 0), from memory."""
        from sim.results.columns import Concatenation, pairwise_sum

        self.close()
        figures = dict(self._counts)
        for name, parts in self._summed.items():
            lengths = [len(part) if isinstance(part, np.ndarray) else part for part in parts]
            loaders = [(lambda part=part: np.where(np.isnan(part), 0.0, part)) if isinstance(part, np.ndarray)
                       else (lambda n=part: np.zeros(n)) for part in parts]
            column = Concatenation(loaders, lengths)
            figures[name.replace("_us", "_sum_us")] = pairwise_sum(column.length, column.take)
        return figures

    def column(self, name: str) -> np.ndarray:
        """One of :data:`KEPT_COLUMNS` of a streamed run, whole (one array, which replaces the kept chunks)."""
        self.close()
        parts = self._kept[name]
        if len(parts) != 1:
            self._kept[name] = parts = [np.concatenate(parts) if parts else np.zeros(0)]
        return parts[0]

    def frame(self, columns: list[str] | None = None) -> pd.DataFrame:
        """The whole table (or some ``columns``) in iteration order; reads the file back when streaming."""
        import pandas as pd

        self.flush()
        if self.path is not None:
            self.close()
            return pd.read_parquet(self.path, columns=columns)
        names = list(ITERATION_COLUMNS) if columns is None else list(columns)
        if not self.chunks:
            return records_frame(StepBuffer(), RunBuffer())[names]
        if len(self.chunks) == 1:
            data = {name: self.chunks[0][name] for name in names}
        else:
            data = {name: np.concatenate([chunk[name] for chunk in self.chunks]) for name in names}
        return pd.DataFrame(data, copy=False)


def _empty_counts() -> dict:
    return {"iterations": 0, "batch_sum": 0, "batch_max": 0, "mapped_max": 0, "waste_sum": 0, "waste_max": 0}


def chunk_counts(batch_size: np.ndarray, mapped_page_groups: np.ndarray, tail_waste_bytes: np.ndarray) -> dict:
    """Iteration count and the batch / pool / tail-waste figures of one chunk's int64 columns
    (:func:`sim.results.summary.iteration_counts`)."""
    if not len(batch_size):
        return _empty_counts()
    return {"iterations": len(batch_size), "batch_sum": int(batch_size.sum()), "batch_max": int(batch_size.max()),
            "mapped_max": int(mapped_page_groups.max()), "waste_sum": int(tail_waste_bytes.sum()),
            "waste_max": int(tail_waste_bytes.max())}


def add_counts(total: dict, part: dict) -> dict:
    """Two chunks' :func:`chunk_counts` together (sums add, maxima take the larger)."""
    if not part["iterations"]:
        return total
    return {"iterations": total["iterations"] + part["iterations"], "batch_sum": total["batch_sum"] + part["batch_sum"],
            "batch_max": max(total["batch_max"], part["batch_max"]),
            "mapped_max": max(total["mapped_max"], part["mapped_max"]),
            "waste_sum": total["waste_sum"] + part["waste_sum"], "waste_max": max(total["waste_max"], part["waste_max"])}


def records_frame(singles: StepBuffer, blocks: RunBuffer) -> pd.DataFrame:
    """:func:`records_columns` as a DataFrame (its fresh arrays, not copied)."""
    import pandas as pd

    return pd.DataFrame(records_columns(singles, blocks), copy=False)


def records_columns(singles: StepBuffer, blocks: RunBuffer) -> dict[str, np.ndarray]:
    """Stepped iterations and decode-run blocks as columns (:data:`ITERATION_COLUMNS` in order, ``*_us`` as
    float64, the rest int64), sorted by iteration; built column by column with numpy, each value written
    straight to its row (:func:`iteration_rows`); a column that is zero in every run
    (:data:`RUN_ZERO_COLUMNS`) starts as zeros and only the stepped iterations' values are written."""
    stepped = singles.columns()
    expanded = expand_blocks(blocks) if len(blocks) else {}
    parts = [[stepped[name]] for name in ITERATION_COLUMNS]
    if expanded:
        for name, column in zip(ITERATION_COLUMNS, parts):
            column.append(expanded[name])
    rows = iteration_rows(parts[0])
    count = sum(len(places) for places in rows)
    columns = {}
    for name, column in zip(ITERATION_COLUMNS, parts):
        if expanded and name in RUN_ZERO_COLUMNS:     # zeros in every run's rows: only the stepped rows written
            values = np.zeros(count, dtype=column[0].dtype)
            values[rows[0]] = column[0]
        else:
            values = np.empty(count, dtype=column[0].dtype)
            for part, places in zip(column, rows):
                values[places] = part
        columns[name] = values
    return columns


def iteration_rows(iterations: list[np.ndarray]) -> list[np.ndarray]:
    """Where each value of several arrays of iteration numbers goes in the table sorted by iteration (the rows a
    stable argsort of their concatenation gives): a chunk holds consecutive iterations, each once, so a value's
    row is its iteration minus the first (linear time); anything else (never in a run) falls back to the
    stable argsort."""
    joined = np.concatenate(iterations) if len(iterations) > 1 else iterations[0]
    count = len(joined)
    if count:
        rows = [part - joined.min() for part in iterations]
        if all(len(part) == 0 or part.max() < count for part in rows):
            covered = np.zeros(count, dtype=bool)
            for part in rows:
                covered[part] = True
            if covered.all():        # count values on count rows: each iteration exactly once
                return rows
    order = np.argsort(joined, kind="stable")
    places = np.empty(count, dtype=np.intp)
    places[order] = np.arange(count)
    bounds = np.cumsum([0] + [len(part) for part in iterations])
    return [places[start:stop] for start, stop in zip(bounds[:-1], bounds[1:])]


def expand_blocks(blocks: RunBuffer) -> dict[str, np.ndarray]:
    """Iteration records of coalesced decode runs (:class:`RunBuffer`); everything not in the buffer is zero
    for a pure-decode run without mapping (:data:`RUN_ZERO_COLUMNS`: one shared zeros array per dtype)."""
    runs = blocks.fields()
    lengths = runs["length"]
    total = int(lengths.sum())
    # one contiguous column per constant (a 2-D repeat's column views are strided: slower to copy from)
    consts = {name: np.repeat(runs[name], lengths) for name in RUN_CONSTANTS}
    offsets = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    # each run's starts hold k + 1 entries (the last is the end of its run): one diff over all of them, then
    # drop the differences that straddle two runs
    all_starts = np.frombuffer(blocks.starts_us, dtype=float)
    within = np.ones(len(all_starts) - 1, dtype=bool)
    within[np.cumsum(lengths + 1)[:-1] - 1] = False
    int_zeros, float_zeros = np.zeros(total, dtype=np.int64), np.zeros(total)
    return {
        **{name: float_zeros if name.endswith("_us") else int_zeros for name in RUN_ZERO_COLUMNS},
        "iteration": np.repeat(runs["first"], lengths) + offsets,
        "start_at_us": np.delete(all_starts, np.cumsum(lengths + 1) - 1),
        "duration_us": np.diff(all_starts)[within], "compute_us": np.frombuffer(blocks.compute_us, dtype=float),
        "decode_tokens": consts["batch_size"], **consts,
        "used_page_groups": _used_page_groups(blocks, runs),
        "tail_waste_bytes": (np.repeat(runs["waste"], lengths) - offsets * np.repeat(runs["waste_step"], lengths)),
        "block_table_us": np.repeat(np.frombuffer(blocks.block_table_us, dtype=float), lengths)}


def _used_page_groups(blocks: RunBuffer, runs: dict[str, np.ndarray]) -> np.ndarray:
    """Used page groups at every step of the runs: the first step's, plus the requests whose page count grew
    at each later step (a crossing of residue ``r`` hits steps ``j >= 1`` with ``j % period == r``: the first
    at ``r``, or at ``period`` for ``r == 0``, then every ``period`` steps while ``j < k``)."""
    lengths = runs["length"]
    starts = np.cumsum(lengths) - lengths
    run = np.repeat(np.arange(len(lengths)), runs["crossings"])     # the run of each crossing entry
    period = runs["period"][run]
    residues = np.frombuffer(blocks.crossing_residues, dtype=np.int64)
    first = np.where(residues == 0, period, residues)
    hits = np.maximum(0, -(-(lengths[run] - first) // period))  # steps first, first + period, ... below k
    entry = np.repeat(np.arange(len(run)), hits)
    nth = np.arange(len(entry)) - np.repeat(np.cumsum(hits) - hits, hits)
    grows = np.zeros(int(lengths.sum()), dtype=np.int64)
    # distinct residues of one run never hit the same step, and runs do not overlap: positions are unique
    grows[starts[run[entry]] + first[entry] + nth * period[entry]] = \
        np.frombuffer(blocks.crossing_requests, dtype=np.int64)[entry]
    grown = np.cumsum(grows)
    # grows is 0 at every run's first step, so grown there is what the earlier runs added
    return np.repeat(runs["used"] - grown[starts], lengths) + grown
