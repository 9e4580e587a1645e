"""Per-iteration records kept in columnar chunks (and optionally streamed to Parquet) as a run goes.

The serving loop appends one tuple per stepped iteration (:data:`sim.records.ITERATION_COLUMNS` order) and one
*block* per fast-forwarded decode run (see :func:`expand_blocks`). Every ``chunk_iterations`` iterations the
buffer becomes one columnar chunk: a pandas DataFrame in iteration order (numpy columns, ~180 B per iteration
instead of ~770 B as Python tuples), or, with ``path``, one row group appended to a Parquet file, so that
memory stays flat however long the trace. Chunks are cut between iterations, so sorting each chunk by
iteration number gives the same table as sorting the whole run.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.records import ITERATION_COLUMNS

DEFAULT_CHUNK_ITERATIONS = 1 << 16   # ~50 MB of buffered tuples at most; row groups of ~11 MB


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
        self.blocks: list[tuple] = []
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

    def add_block(self, block: tuple) -> None:
        """One fast-forwarded decode run (layout in :func:`expand_blocks`)."""
        self.blocks.append(block)
        self.blocks_recorded += 1
        self.buffered += len(block[2])
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
        self.singles, self.blocks, self.buffered = [], [], 0
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
            empty = records_frame([], [])
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
            frame = records_frame([], [])
        else:
            frame = self.chunks[0] if len(self.chunks) == 1 else pd.concat(self.chunks, ignore_index=True)
        return frame[columns] if columns is not None else frame


def records_frame(singles: list[tuple], blocks: list[tuple]) -> pd.DataFrame:
    """Stepped iterations and decode-run blocks as one DataFrame (columns :data:`ITERATION_COLUMNS`, ``*_us``
    as float, the rest int64), sorted by iteration; built column by column with numpy."""
    columns_of_singles = list(zip(*singles)) if singles else [()] * len(ITERATION_COLUMNS)
    expanded = expand_blocks(blocks) if blocks else {}
    columns = {}
    for index, name in enumerate(ITERATION_COLUMNS):
        single = np.asarray(columns_of_singles[index], dtype=float if name.endswith("_us") else np.int64)
        columns[name] = np.concatenate([single, expanded[name]]) if expanded else single
    order = np.argsort(columns["iteration"], kind="stable")
    return pd.DataFrame({name: values[order] for name, values in columns.items()})


def expand_blocks(blocks: list[tuple]) -> dict[str, np.ndarray]:
    """Iteration records of coalesced decode runs. A block is ``(first_iteration, starts_us[k+1],
    compute_us[k], used_page_groups[k], tail_waste_bytes[k], (batch, running, waiting, mapped, free,
    deferred), block_table_us)``; everything not listed is zero for a pure-decode run without mapping."""
    lengths = np.array([len(b[2]) for b in blocks])
    total = int(lengths.sum())
    consts = np.repeat(np.array([b[5] for b in blocks], dtype=np.int64), lengths, axis=0)
    offsets = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    zeros = np.zeros(total, dtype=np.int64)
    compute_us = np.concatenate([b[2] for b in blocks])
    # each block's starts hold k + 1 entries (the last is the end of its run): one diff over all of them, then
    # drop the differences that straddle two blocks
    all_starts = np.concatenate([b[1] for b in blocks])
    within = np.ones(len(all_starts) - 1, dtype=bool)
    within[np.cumsum(lengths + 1)[:-1] - 1] = False
    return {
        "iteration": np.repeat([b[0] for b in blocks], lengths) + offsets,
        "start_at_us": np.delete(all_starts, np.cumsum(lengths + 1) - 1),
        "duration_us": np.diff(all_starts)[within], "compute_us": compute_us,
        "sync_stall_us": np.zeros(total), "sync_map_page_groups": zeros, "bg_map_page_groups": zeros,
        "unmap_page_groups": zeros, "prefill_tokens": zeros, "decode_tokens": consts[:, 0],
        "batch_size": consts[:, 0], "num_running": consts[:, 1], "num_waiting": consts[:, 2],
        "mapped_page_groups": consts[:, 3], "used_page_groups": np.concatenate([b[3] for b in blocks]),
        "free_page_groups": consts[:, 4], "deferred_page_groups": consts[:, 5],
        "tail_waste_bytes": np.concatenate([b[4] for b in blocks]), "preemptions": zeros,
        "block_table_us": np.repeat([b[6] for b in blocks], lengths).astype(float), "swap_us": np.zeros(total),
        "clear_copy_us": np.zeros(total)}
