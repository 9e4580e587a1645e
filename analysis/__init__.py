"""Results of simulator runs as pandas tables: run directories, summaries, comparisons, figures, reports.

Public API (imported on first use, so that ``import analysis`` costs nothing until a name is needed)::

    load_run(DIR) -> RunResult        write_run(result, DIR)        build_result(SimOutput, config)
    summarize(requests, iterations, counters, config) -> dict      RunResult (requests, iterations, summary, config)
    compare([RunResult, ...]) -> DataFrame (one row per run)       write_report([RunResult, ...], PATH)

Modules: ``results`` (tables, summary, run directories), ``comparison`` (what-if tables, running several
policies), ``figures`` / ``downsample`` / ``report`` (plotly HTML), ``summary`` (printed tables), ``output``
(output directories and files written as a whole); ``planning`` (capacity search, SLOs, sweeps, their
executors and command lines).
"""
from sim.lazy import lazy_exports

_EXPORTS = {"RunResult": "analysis.results", "build_result": "analysis.results", "load_run": "analysis.results",
            "summarize": "analysis.results", "write_run": "analysis.results", "compare": "analysis.comparison",
            "write_report": "analysis.report"}


__getattr__ = lazy_exports(globals(), _EXPORTS)


__all__ = sorted(_EXPORTS)
