"""Re-run the command of every table the docs print, and print the figures to compare with the docs.

    python bench/rerun_docs.py                 # every table (the prefix-sharing one takes minutes)
    python bench/rerun_docs.py --list          # names, docs and commands only
    python bench/rerun_docs.py --only readme-capacity,capacity-h100 [--skip-slow]

Each table's command runs as ``python cli.py ...`` from the repository root with ``--out`` in a scratch
directory (nothing is written into the repository); its output is printed (for some tables only the lines the
doc shows) with the wall time, so the doc's figures can be updated in one go after a change that alters
simulation outputs (issue 36, item 9). Needs ``../shared/traces``. Wall times depend on the machine's load
(2 cores shared with other jobs): they are printed, not compared.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONV = "../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
ARXIV = "../shared/traces/vidur_processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
MOONCAKE = "../shared/traces/mooncake_fast25/conversation_trace.jsonl"
CAPACITY = ["capacity", "--trace", CONV, "--num-requests", "2000", "--model", "llama-3-8b",
            "--slo", "ttft_p99=2s,tpot_p99=100ms", "--target-rate", "100", "--check-replicas"]
BEYOND_ROWS = ("metric", "TTFT p50", "TTFT p99", "TPOT p99", "peak mapped", "tail waste mean", "page groups",
               "VMM map calls", "sync mapping stall", "clear/copy")
CAPACITY_ROWS = ("capacity per replica", "binding constraint", "replicas for", "check:", "searched in")


@dataclass(frozen=True)
class DocTable:
    """One printed table of the docs: where it is, the command that makes it, which lines to show."""

    name: str
    where: str
    argv: tuple[str, ...]
    rows: tuple[str, ...] = ()        # print only lines starting with these (after stripping); () = all
    summary_keys: tuple[str, ...] = ()  # also print these keys of OUT/summary.json
    slow: bool = False


TABLES = (
    DocTable("readme-simulate", "README.md, 'Replaying a real trace'",
             ("simulate", "--trace", CONV, "--model", "llama-3-8b", "--gpu", "h200")),
    DocTable("readme-whatif", "README.md, 'What-if analysis'",
             ("compare", "--policy", "vattention:page=2MiB", "--policy", "vattention:page=256KiB", "--policy",
              "paged:block=16", "--policy", "static", "--trace", ARXIV, "--arrival", "poisson:16",
              "--num-requests", "4000")),
    DocTable("readme-capacity", "README.md, 'Capacity planning' (steps) and its table, H200 vAttention row",
             (*CAPACITY, "--gpu", "h200")),
    DocTable("capacity-h100", "README.md, 'Capacity planning' table, H100 vAttention row",
             (*CAPACITY, "--gpu", "h100"), CAPACITY_ROWS),
    DocTable("capacity-h100-paged", "README.md, 'Capacity planning' table, H100 paged row",
             (*CAPACITY, "--gpu", "h100", "--policy", "paged:block=16"), CAPACITY_ROWS),
    DocTable("capacity-h200-paged", "README.md, 'Capacity planning' table, H200 paged row",
             (*CAPACITY, "--gpu", "h200", "--policy", "paged:block=16"), CAPACITY_ROWS),
    DocTable("readme-beyond", "README.md, 'Beyond vAttention' (rows selected as printed there)",
             ("compare", "--policy", "vattention", "--policy", "vattention:layout=cross-layer", "--policy",
              "vattention:batched=on", "--policy", "vattention:zero=on-reuse", "--policy", "vattention:zero=on-free",
              "--policy", "vattention:sync,zero=on-reuse", "--trace", CONV, "--profile", "profiles/h200.json"),
             BEYOND_ROWS + ("6 runs",)),
    DocTable("readme-beyond-sync", "README.md, 'Beyond vAttention' text: stalls of vattention:sync, "
             "cross-layer and batched with synchronous mapping",
             ("compare", "--policy", "vattention:sync", "--policy", "vattention:sync,layout=cross-layer",
              "--policy", "vattention:sync,batched=on", "--trace", CONV, "--profile", "profiles/h200.json"),
             ("metric", "sync mapping stall", "3 runs")),
    DocTable("report-stalls", "docs/report.md, 'Size and speed' (the sync run's stalls)",
             ("simulate", "--trace", CONV, "--sync-mapping"), ("simulated in",),
             ("iterations_with_stall", "iterations")),
    DocTable("readme-prefix", "README.md, prefix sharing on the Mooncake trace",
             ("compare", "--policy", "vattention", "--policy", "vattention:prefix=on", "--policy", "paged",
              "--policy", "paged:prefix=on", "--trace", MOONCAKE, "--model", "llama-3.1-8b", "--rate-scale", "0.2"),
             slow=True),
)


def run_table(table: DocTable, scratch: Path) -> int:
    """Run one table's command, print its header, output lines and summary keys; returns its exit status."""
    out = scratch / table.name
    argv = [sys.executable, "cli.py", *table.argv, "--out", str(out)]     # not a terminal: no progress bar
    print(f"== {table.name}: {table.where}\n$ kvsim {' '.join(table.argv)}", flush=True)
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    lines = done.stdout.splitlines()
    if table.rows:
        lines = [line for line in lines if line.strip().startswith(table.rows)]
    print("\n".join(lines))
    if done.returncode not in (0, 1):       # capacity exits 1 when no rate passes: still a figure
        print(done.stderr.strip(), file=sys.stderr)
    summary_path = out / "summary.json"
    if table.summary_keys and summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        print("summary.json: " + ", ".join(f"{k}={summary.get(k)}" for k in table.summary_keys))
    print(f"(exit {done.returncode}, {wall_s:.1f} s wall on this machine)\n", flush=True)
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma-separated table names (default: all)")
    parser.add_argument("--skip-slow", action="store_true", help="leave out the tables marked slow (prefix sharing)")
    parser.add_argument("--list", action="store_true", help="print the tables and their commands, run nothing")
    args = parser.parse_args(argv)
    chosen = list(TABLES)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(names) - {t.name for t in TABLES})
        if unknown:
            parser.error(f"unknown table(s) {', '.join(unknown)}; known: {', '.join(t.name for t in TABLES)}")
        chosen = [t for t in TABLES if t.name in names]
    if args.skip_slow:
        chosen = [t for t in chosen if not t.slow]
    if args.list:
        for table in chosen:
            print(f"{table.name:22} {table.where}{' (slow)' if table.slow else ''}\n{'':22} kvsim {' '.join(table.argv)}")
        return 0
    if not (ROOT / CONV).resolve().is_file():
        print(f"rerun_docs: {CONV} is not present (the public traces: ../shared/traces)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kvsim-rerun-docs-") as scratch:
        failed = [t.name for t in chosen if run_table(t, Path(scratch)) not in (0, 1)]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
