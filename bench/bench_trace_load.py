"""Benchmark: load a large Azure-2024-style CSV; report wall time and peak memory.

Issue 6 asks that the 27-million-row Azure 2024 conversation trace load in about 2 GB.
This generates an N-row file with the 2024 schema (``TIMESTAMP`` with 7 fractional
digits and ``+00:00``, ``ContextTokens``, ``GeneratedTokens``; Poisson arrivals at
~45 req/s, lengths from :func:`traces.synthetic_default`'s distribution), then loads it
with :func:`traces.load_trace` in a fresh subprocess and reports the loader's wall time
and the subprocess's peak resident memory (``ru_maxrss``).

Usage::

    python bench/bench_trace_load.py --rows 10000000 --dir /tmp/kvsim-bench

The generated file is kept in ``--dir`` (not in the repository) and reused.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
CHUNK_ROWS = 1_000_000
RATE_PER_S = 45.0  # ~ 27.3 M requests / 7 days


def generate(path: Path, rows: int, seed: int = 0) -> None:
    """Writes an Azure-2024-style CSV with ``rows`` requests, in 1 M-row chunks."""
    sys.path.insert(0, str(REPO))
    from traces.generators import (AZURE_CONV_2023_OUTPUT, AZURE_CONV_2023_PROMPT,
                                   spliced_lengths)

    rng = np.random.default_rng(seed)
    start = np.datetime64("2024-05-12T00:00:00", "ns")
    t_ns = 0
    with open(path, "w") as fh:
        fh.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for done in range(0, rows, CHUNK_ROWS):
            n = min(CHUNK_ROWS, rows - done)
            gaps_ns = (rng.exponential(1e9 / RATE_PER_S, n)).astype(np.int64) // 100 * 100
            stamps = start + np.cumsum(gaps_ns) + t_ns
            t_ns += int(gaps_ns.sum())
            text = np.datetime_as_string(stamps, unit="ns")
            text = pd.Series(text).str.slice(0, 27).str.replace("T", " ") + "+00:00"
            chunk = pd.DataFrame({
                "TIMESTAMP": text,
                "ContextTokens": spliced_lengths(n, AZURE_CONV_2023_PROMPT, rng),
                "GeneratedTokens": spliced_lengths(n, AZURE_CONV_2023_OUTPUT, rng)})
            chunk.to_csv(fh, header=False, index=False)


_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {repo!r})
from traces import load_trace
start = time.perf_counter()
df = load_trace({path!r})
elapsed_s = time.perf_counter() - start
peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"rows": len(df), "load_s": elapsed_s, "peak_rss_mib": peak_mib,
                  "table_mib": df.memory_usage(deep=True).sum() / 2**20,
                  "span_s": float(df.arrival_s.iloc[-1])}}))
"""


def measure(path: Path) -> dict:
    """Loads ``path`` in a fresh interpreter; returns rows, load_s, peak_rss_mib."""
    code = _CHILD.format(repo=str(REPO), path=str(path))
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/kvsim-bench"))
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / f"azure2024_style_{args.rows}.csv"
    if not path.exists():
        start = time.perf_counter()
        generate(path, args.rows)
        print(f"generated {path} ({path.stat().st_size / 2**20:.0f} MiB) in "
              f"{time.perf_counter() - start:.1f} s")
    result = measure(path)
    result["file_mib"] = path.stat().st_size / 2**20
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
