"""What a run produces: its records and its summary.

Public API:

* :mod:`sim.results.records` (``REQUEST_COLUMNS``, ``ITERATION_COLUMNS``, ``REJECT_REASONS``, the TBT statistics
  ``tbt_stats_us``);
* :class:`sim.results.recorder.IterationRecorder` (iteration records in columnar chunks, or streamed to Parquet);
* :mod:`sim.results.columns` (exact statistics of long Parquet columns in bounded memory);
* :mod:`sim.results.summary`: :class:`RunResult`, :func:`summarize`, :func:`build_result`,
  :func:`iteration_counts`, :func:`ttft_growth` (re-exported by :mod:`analysis.results`, which adds the run
  directories on disk).

Imports ``sim.units`` only.
"""
