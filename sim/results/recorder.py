"""Per-iteration records kept in columnar chunks (and optionally streamed to Parquet) as a run goes.

The serving loop appends one tuple per stepped iteration (:data:`sim.results.records.ITERATION_COLUMNS` order) and one
*block* per fast-forwarded decode run, appended to flat columnar buffers (:class:`RunBuffer`, expanded by
:func:`expand_blocks`). Every ``chunk_iterations`` iterations the
buffer becomes one columnar chunk: a pandas DataFrame in iteration order (numpy columns, ~180 B per iteration
instead of ~770 B as Python tuples), or, with ``path``, one row group appended to a Parquet file, so that
memory stays flat however long the trace. Chunks are cut between iterations, so sorting each chunk by
iteration number gives the same table as sorting the whole run.
"""
from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np
import pandas as pd

from sim.results.records import ITERATION_COLUMNS

DEFAULT_CHUNK_ITERATIONS = 1 << 16   # ~50 MB of buffered tuples at most; row groups of ~11 MB

RUN_CONSTANTS = ("batch_size", "num_running", "num_waiting", "mapped_page_groups", "free_page_groups",
                 "deferred_page_groups")
"""The iteration columns that stay constant over a fast-forwarded decode run, in a run's ``constants`` order."""


class RunBuffer:
    """Fast-forwarded decode runs in flat columns (``array`` buffers, no per-run objects).

    Per run: ``first`` iteration, ``lengths`` k, ``constants`` (:data:`RUN_CONSTANTS`, 6 ints per run),
    ``block_table_us``, and what the used page groups and tail waste of its steps follow from (expanded by
    :func:`expand_blocks`): ``used`` and ``waste`` bytes in its first step, ``waste_step`` (bytes less each
    step), ``period`` (tokens per page) and its page crossings, ``crossings`` entries of ``(residue, requests)``
    in ``crossing_residues`` / ``crossing_requests`` (``requests`` more used page groups at every step ``j >= 1``
    with ``j % period == residue``). Per step: ``starts_us`` (k + 1 per run: each step's start, then the run's
    end) and ``compute_us``."""

    def __init__(self):
        self.first, self.lengths, self.constants = array("q"), array("q"), array("q")
        self.block_table_us, self.starts_us, self.compute_us = array("d"), array("d"), array("d")
        self.used, self.waste, self.waste_step, self.period = array("q"), array("q"), array("q"), array("q")
        self.crossings, self.crossing_residues, self.crossing_requests = array("q"), array("q"), array("q")

    def __len__(self) -> int:
        return len(self.first)

    def add(self, first_iteration: int, starts_us, compute_us, constants: tuple, block_table_us: float,
            pages: tuple) -> None:
        """One run of ``k = len(compute_us)`` steps: ``starts_us`` k + 1 floats (us), ``compute_us`` k floats (us)
        (lists or numpy arrays); ``pages``: ``(used, waste, waste_step, period, crossings)`` with
        ``crossings`` a dict residue -> requests (class docstring)."""
        used, waste, waste_step, period, crossings = pages
        self.first.append(first_iteration)
        self.lengths.append(len(compute_us))
        self.constants.extend(constants)
        self.block_table_us.append(block_table_us)
        self.used.append(used)
        self.waste.append(waste)
        self.waste_step.append(waste_step)
        self.period.append(period)
        self.crossings.append(len(crossings))
        self.crossing_residues.extend(crossings.keys())
        self.crossing_requests.extend(crossings.values())
        extend_array(self.starts_us, starts_us)
        extend_array(self.compute_us, compute_us)


def extend_array(buffer: array, values) -> None:
    """Append ``values`` (a list, or a numpy array copied as its bytes) to an ``array`` buffer."""
    if isinstance(values, np.ndarray):
        buffer.frombytes(values.astype(DTYPES[buffer.typecode], copy=False).tobytes())
    else:
        buffer.extend(values)


DTYPES = {"d": np.float64, "q": np.int64}
"""numpy dtype of each ``array`` type code used by the buffers."""


class IterationRecorder:
    """Buffers iteration records and turns them into columnar chunks.

    Args:
        path: a Parquet file to stream row groups into (created on the first chunk; replaced if it exists);
            ``None``: keep the chunks in memory.
        chunk_iterations: iterations per chunk (row group).
    """

    def __init__(self, path: str | Path | None = None, chunk_iterations: int = DEFAULT_CHUNK_ITERATIONS):
        self.path = Path(path) if path is not None else None
        self.chunk_iterations = chunk_iterations
        self.singles: list[tuple] = []
        self.blocks = RunBuffer()
        self.buffered = 0
        self.chunks: list[pd.DataFrame] = []
        self.rows = 0
        self.blocks_recorded = 0
        self._writer = None
        self._closed = False

    def add(self, record: tuple) -> None:
        """One stepped iteration (a tuple in :data:`ITERATION_COLUMNS` order)."""
        self.singles.append(record)
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
        """Turn the buffer into one chunk (appended to the Parquet file when streaming).

        Raises:
            RuntimeError: records added after the streamed file was closed.
        """
        if not self.buffered:
            return
        if self._closed:
            raise RuntimeError(f"{self.path}: iteration records added after the file was closed")
        chunk = records_frame(self.singles, self.blocks)
        self.singles, self.blocks, self.buffered = [], RunBuffer(), 0
        self.rows += len(chunk)
        if self.path is None:
            self.chunks.append(chunk)
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(chunk, preserve_index=False)
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self.path, table.schema)
        self._writer.write_table(table)

    def close(self) -> None:
        """Flush what is buffered and close the Parquet file (an empty run writes an empty table); once."""
        self.flush()
        if self.path is None or self._closed:
            return
        self._closed = True
        if self._writer is None:
            empty = records_frame([], RunBuffer())
            empty.to_parquet(self.path, index=False)
        else:
            self._writer.close()
            self._writer = None

    def frame(self, columns: list[str] | None = None) -> pd.DataFrame:
        """The whole table (or some ``columns``) in iteration order; reads the file back when streaming."""
        self.flush()
        if self.path is not None:
            self.close()
            return pd.read_parquet(self.path, columns=columns)
        if not self.chunks:
            frame = records_frame([], RunBuffer())
        else:
            frame = self.chunks[0] if len(self.chunks) == 1 else pd.concat(self.chunks, ignore_index=True)
        return frame[columns] if columns is not None else frame


def records_frame(singles: list[tuple], blocks: RunBuffer) -> pd.DataFrame:
    """Stepped iterations and decode-run blocks as one DataFrame (columns :data:`ITERATION_COLUMNS`, ``*_us``
    as float, the rest int64), sorted by iteration; built column by column with numpy, each value written
    straight to its row (:func:`iteration_rows`)."""
    columns_of_singles = list(zip(*singles)) if singles else [()] * len(ITERATION_COLUMNS)
    expanded = expand_blocks(blocks) if len(blocks) else {}
    parts = [[np.asarray(values, dtype=float if name.endswith("_us") else np.int64)]
             for name, values in zip(ITERATION_COLUMNS, columns_of_singles)]
    if expanded:
        for name, column in zip(ITERATION_COLUMNS, parts):
            column.append(expanded[name])
    rows = iteration_rows(parts[0])
    columns = {}
    for name, column in zip(ITERATION_COLUMNS, parts):
        values = np.empty(sum(len(part) for part in column), dtype=column[0].dtype)
        for part, places in zip(column, rows):
            values[places] = part
        columns[name] = values
    return pd.DataFrame(columns, copy=False)   # fresh arrays: no copy


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
    for a pure-decode run without mapping."""
    lengths = np.frombuffer(blocks.lengths, dtype=np.int64)
    total = int(lengths.sum())
    consts = np.repeat(np.frombuffer(blocks.constants, dtype=np.int64).reshape(-1, len(RUN_CONSTANTS)), lengths,
                       axis=0)
    offsets = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    zeros = np.zeros(total, dtype=np.int64)
    # each run's starts hold k + 1 entries (the last is the end of its run): one diff over all of them, then
    # drop the differences that straddle two runs
    all_starts = np.frombuffer(blocks.starts_us, dtype=float)
    within = np.ones(len(all_starts) - 1, dtype=bool)
    within[np.cumsum(lengths + 1)[:-1] - 1] = False
    return {
        "iteration": np.repeat(np.frombuffer(blocks.first, dtype=np.int64), lengths) + offsets,
        "start_at_us": np.delete(all_starts, np.cumsum(lengths + 1) - 1),
        "duration_us": np.diff(all_starts)[within], "compute_us": np.frombuffer(blocks.compute_us, dtype=float),
        "sync_stall_us": np.zeros(total), "sync_map_page_groups": zeros, "bg_map_page_groups": zeros,
        "unmap_page_groups": zeros, "prefill_tokens": zeros, "decode_tokens": consts[:, 0],
        "batch_size": consts[:, 0], "num_running": consts[:, 1], "num_waiting": consts[:, 2],
        "mapped_page_groups": consts[:, 3], "used_page_groups": _used_page_groups(blocks, lengths, offsets),
        "free_page_groups": consts[:, 4], "deferred_page_groups": consts[:, 5],
        "tail_waste_bytes": (np.repeat(np.frombuffer(blocks.waste, dtype=np.int64), lengths)
                             - offsets * np.repeat(np.frombuffer(blocks.waste_step, dtype=np.int64), lengths)),
        "preemptions": zeros,
        "block_table_us": np.repeat(np.frombuffer(blocks.block_table_us, dtype=float), lengths),
        "swap_us": np.zeros(total), "clear_copy_us": np.zeros(total)}


def _used_page_groups(blocks: RunBuffer, lengths: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Used page groups at every step of the runs: the first step's, plus the requests whose page count grew
    at each later step (a crossing of residue ``r`` hits steps ``j >= 1`` with ``j % period == r``: the first
    at ``r``, or at ``period`` for ``r == 0``, then every ``period`` steps while ``j < k``)."""
    starts = np.cumsum(lengths) - lengths
    per_run = np.frombuffer(blocks.crossings, dtype=np.int64)
    run = np.repeat(np.arange(len(lengths)), per_run)          # the run of each crossing entry
    period = np.frombuffer(blocks.period, dtype=np.int64)[run]
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
    return np.repeat(np.frombuffer(blocks.used, dtype=np.int64) - grown[starts], lengths) + grown
