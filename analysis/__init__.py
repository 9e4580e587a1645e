"""Results of simulator runs as pandas tables: summaries, run directories, comparisons, reports."""
from analysis.results import RunResult, build_result, load_run, summarize, write_run

__all__ = ["RunResult", "build_result", "load_run", "summarize", "write_run"]
