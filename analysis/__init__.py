"""Results of simulator runs as pandas tables: summaries, run directories, comparisons, reports."""
from analysis.results import RunResult, build_result, load_run, summarize, write_run
from analysis.report import compare, write_report  # noqa: E402  (binds analysis.compare to the function)

__all__ = ["RunResult", "build_result", "compare", "load_run", "summarize", "write_report", "write_run"]
