"""Results of simulator runs as pandas tables: summaries, run directories, comparisons, reports."""
from analysis.results import RunResult, build_result, load_run, summarize, write_run
from analysis.compare import compare  # binds analysis.compare to the function (the module stays importable)


def __getattr__(name):
    # the report (plotly) is imported lazily, so that analysis.results works where plotly is absent
    if name == "write_report":
        from analysis.report import write_report
        return write_report
    raise AttributeError(name)

__all__ = ["RunResult", "build_result", "compare", "load_run", "summarize", "write_report", "write_run"]
