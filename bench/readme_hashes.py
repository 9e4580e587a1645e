"""Hashes of the request and iteration tables of the README's runs, to prove a refactor changed nothing.

    python bench/readme_hashes.py > before.txt   (then, after the change)   python bench/readme_hashes.py | diff before.txt -

Each line: ``run-label policy requests-hash iterations-hash`` (pandas.util.hash_pandas_object summed over rows, with
the column names; identical tables give identical hashes). Runs: the README's main replay (conversation
trace), its what-if comparison (arXiv lengths, Poisson 16/s, 4,000 requests), the Beyond-vAttention policies
on the conversation trace with the H200 profile, and prefix sharing on the first 3,000 Mooncake requests
(a slice, to keep this under two minutes). Needs ../shared/traces.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRACES = ROOT.parent / "shared" / "traces"
CONV = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
ARXIV = TRACES / "vidur_processed_traces" / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
MOONCAKE = TRACES / "mooncake_fast25" / "conversation_trace.jsonl"

RUNS = [
    ("main", ["--trace", str(CONV)], ["vattention"]),
    ("whatif", ["--trace", str(ARXIV), "--arrival", "poisson:16", "--num-requests", "4000"],
     ["vattention:page=2MiB", "vattention:page=256KiB", "paged:block=16", "static"]),
    ("beyond", ["--trace", str(CONV), "--profile", str(ROOT / "profiles" / "h200.json")],
     ["vattention:layout=cross-layer", "vattention:batched=on", "vattention:zero=on-reuse", "vattention:zero=on-free",
      "vattention:sync,zero=on-reuse"]),
    ("prefix", ["--trace", str(MOONCAKE), "--model", "llama-3.1-8b", "--rate-scale", "0.2", "--num-requests", "3000"],
     ["vattention:prefix=on", "paged", "paged:prefix=on"]),
]


def table_hash(frame: pd.DataFrame) -> str:
    """Order-sensitive hash of a table's values and column names."""
    values = int(pd.util.hash_pandas_object(frame, index=False).sum()) & (2**64 - 1)
    return f"{values:016x}-{hashlib.sha256(','.join(frame.columns).encode()).hexdigest()[:8]}"


def main() -> int:
    import tempfile

    from cli import main as kvsim

    for label, args, policies in RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            command = ["compare", *args, "--out", tmp, "--force", "--save-runs", "--workers", "1"]
            for policy in policies:
                command += ["--policy", policy]
            with contextlib.redirect_stdout(io.StringIO()):
                status = kvsim(command)
            if status != 0:
                print(f"{label}: kvsim compare failed", file=sys.stderr)
                return 1
            for index, policy in enumerate(policies):
                run = Path(tmp) / f"run{index}"
                print(f"{label} {policy} {table_hash(pd.read_parquet(run / 'requests.parquet'))} "
                      f"{table_hash(pd.read_parquet(run / 'iterations.parquet'))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
