"""Results of simulator runs as pandas tables: summaries, run directories, comparisons, reports."""
from analysis.results import RunResult, build_result, load_run, summarize, write_run
from analysis.compare import compare  # binds analysis.compare to the function (the module stays importable)
from analysis.report import write_report

__all__ = ["RunResult", "build_result", "compare", "load_run", "summarize", "write_report", "write_run"]
