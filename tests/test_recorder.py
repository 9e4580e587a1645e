"""The iteration recorder's columnar pieces: the chunk order and the expansion of decode runs' page columns."""
import numpy as np
import pytest

from sim.results.recorder import RunBuffer, expand_blocks, iteration_rows


@pytest.mark.parametrize("parts", [[[]], [[7]], [[4, 5], [0, 1, 2, 3]], [[3, 1], [2, 2, 5]], [[0, 2, 2], []],
                                   [[9, 8], [8, 7]], [[10, 12], [11, 13, 14]]])
def test_iteration_rows_are_the_stable_sort_positions(parts):
    """Each value's row in the table sorted by iteration, as a stable argsort of the concatenation places it."""
    parts = [np.array(part, dtype=np.int64) for part in parts]
    joined = np.concatenate(parts)
    expected = np.empty(len(joined), dtype=np.intp)
    expected[np.argsort(joined, kind="stable")] = np.arange(len(joined))
    assert np.array_equal(np.concatenate(iteration_rows(parts)), expected)


@pytest.mark.parametrize("tokens_per_page", [1, 3, 16, 1024])
def test_run_pages_expand_to_the_per_step_counts(tokens_per_page):
    """Used page groups and tail waste of every step, from each run's first step and crossings, equal the
    direct count: sum over requests of ceil((computed + 1 + j) / per_page), and mapped minus held tokens."""
    rng = np.random.default_rng(5)
    buffer, expected_used, expected_waste, first = RunBuffer(), [], [], 0
    for _ in range(30):
        computed = rng.integers(1, 5000, rng.integers(1, 9))
        steps, mapped_tokens, bytes_per_token = int(rng.integers(2, 80)), 10**6, 7
        held = computed[:, None] + 1 + np.arange(steps)[None, :]
        expected_used.append((-(-held // tokens_per_page)).sum(axis=0))
        expected_waste.append((mapped_tokens - held.sum(axis=0)) * bytes_per_token)
        crossings = {}
        for c in computed.tolist():
            crossings[-c % tokens_per_page] = crossings.get(-c % tokens_per_page, 0) + 1
        used = int(expected_used[-1][0])
        waste = (mapped_tokens - int(computed.sum()) - len(computed)) * bytes_per_token
        buffer.add(first, [0.0] * (steps + 1), [1.0] * steps, (len(computed), 0, 0, 0, 0, 0), 0.0,
                   (used, waste, len(computed) * bytes_per_token, tokens_per_page, crossings))
        first += steps
    expanded = expand_blocks(buffer)
    assert np.array_equal(expanded["used_page_groups"], np.concatenate(expected_used))
    assert np.array_equal(expanded["tail_waste_bytes"], np.concatenate(expected_waste))


@pytest.mark.parametrize("policy", ["vattention", "paged"])
def test_streamed_summary_figures_equal_the_files(tmp_path, policy):
    """A streamed recorder's in-memory summary parts (issue 32) are what reading its Parquet file back gives:
    the integer figures and the pairwise float totals (paged: non-zero block-table times) of
    ``iteration_counts_of_file``, and the kept columns of ``read_column``, bit for bit; row groups of 7."""
    from sim.core.engine import Simulator
    from sim.results.columns import read_column
    from sim.results.summary import SUMMARY_ITERATION_COLUMNS, iteration_counts_of_file
    from sim.setup.config import SimConfig
    from sim.timing.latency import VmmLatencyModel
    from tests.test_engine import _roofline, trace

    rng = np.random.default_rng(5)
    rows = [(float(t), int(p), int(o)) for t, p, o in zip(np.cumsum(rng.exponential(0.05, 30)),
                                                          rng.integers(1, 3000, 30), rng.integers(1, 200, 30))]
    path = tmp_path / "it.parquet"
    sim = Simulator(SimConfig(policy=policy), trace(rows), vmm=VmmLatencyModel.h200_defaults(), compute=_roofline(),
                    records_path=str(path))
    sim.recorder.chunk_iterations = 7
    recorder = sim.run().recorder
    figures = recorder.summary_figures()
    assert figures["iterations"] > 7 * 5
    assert figures == iteration_counts_of_file(path)
    assert (figures["block_table_sum_us"] > 0) == (policy == "paged")
    for name in SUMMARY_ITERATION_COLUMNS:
        assert recorder.column(name).tobytes() == read_column(path, name).tobytes()


def test_streamed_stepped_records_equal_the_tuples(tmp_path):
    """Stepped records written through the typed buffers (:class:`StepBuffer`) and streamed in row groups of 7
    are the table that converting the tuples column by column gives (int64, ``*_us`` float64), bit for bit; the
    columns of ``ITERATION_UNIQUE_COLUMNS`` are written without a dictionary, the others with one."""
    import pyarrow.parquet as pq

    from sim.results.recorder import IterationRecorder
    from sim.results.records import ITERATION_COLUMNS, ITERATION_UNIQUE_COLUMNS

    rng = np.random.default_rng(7)
    records = []
    for iteration in range(40):
        record = [iteration]
        for name in ITERATION_COLUMNS[1:]:
            record.append(float(rng.normal(0, 1e6)) if name.endswith("_us") else int(rng.integers(0, 1 << 40)))
        records.append(tuple(record))
    path = tmp_path / "it.parquet"
    recorder = IterationRecorder(path, chunk_iterations=7)
    for record in records:
        recorder.add(record)
    recorder.close()
    table = pq.read_table(path)
    for k, name in enumerate(ITERATION_COLUMNS):
        expected = np.asarray([r[k] for r in records], dtype=float if name.endswith("_us") else np.int64)
        got = table[name].to_numpy()
        assert got.dtype == expected.dtype and np.array_equal(got.view(np.int64), expected.view(np.int64)), name
    group = pq.ParquetFile(path).metadata.row_group(0)
    for k, name in enumerate(ITERATION_COLUMNS):
        assert group.column(k).has_dictionary_page == (name not in ITERATION_UNIQUE_COLUMNS), name
    memory = IterationRecorder(chunk_iterations=7)
    for record in records:
        memory.add(record)
    assert memory.frame().equals(table.to_pandas())


def test_step_buffer_refuses_a_fraction_in_an_integer_column():
    from sim.results.recorder import StepBuffer
    from sim.results.records import ITERATION_COLUMNS

    with pytest.raises(TypeError):
        StepBuffer().add(tuple(0.5 for _ in ITERATION_COLUMNS))


def test_a_failed_background_write_is_raised_by_close(tmp_path, monkeypatch):
    """Row groups are written by the recorder's writer thread: a write that fails (a full disk, say) is not lost
    in the thread but raised by :meth:`IterationRecorder.close` (or the next chunk's flush), and the thread and
    the file are closed all the same; the row groups before it are in the file, in order (6 groups of 7)."""
    import pyarrow.parquet as pq

    from sim.results.recorder import IterationRecorder
    from sim.results.records import ITERATION_COLUMNS

    calls = []
    real = pq.ParquetWriter.write_table

    def write_table(self, table, *args, **kwargs):
        calls.append(len(table))
        if len(calls) == 7:
            raise OSError(28, "No space left on device")
        return real(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    path = tmp_path / "it.parquet"
    recorder = IterationRecorder(path, chunk_iterations=7)
    with pytest.raises(OSError, match="No space left on device"):
        for iteration in range(49):
            recorder.add((iteration,) + (0,) * (len(ITERATION_COLUMNS) - 1))
        recorder.close()
    recorder.close()                                       # closed once: nothing more happens
    assert calls == [7] * 7 and recorder._thread is None and recorder._writer is None
    assert pq.read_table(path)["iteration"].to_pylist() == list(range(42))
