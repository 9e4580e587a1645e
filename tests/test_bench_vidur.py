"""``bench/bench_vidur.py``'s stand-in attention table (Vidur's ``attention.csv`` format), without Vidur, network
or timing."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_vidur import (ATTENTION_HEADER, attention_grid, stand_in_attention_rows,  # noqa: E402
                               write_stand_in_attention)

PUBLISHED_HEADER = (
    "time_stats.attn_input_reshape.min,time_stats.attn_input_reshape.max,time_stats.attn_input_reshape.mean,"
    "time_stats.attn_input_reshape.median,time_stats.attn_input_reshape.std,time_stats.attn_decode.min,"
    "time_stats.attn_decode.max,time_stats.attn_decode.mean,time_stats.attn_decode.median,time_stats.attn_decode.std,"
    "time_stats.attn_output_reshape.min,time_stats.attn_output_reshape.max,time_stats.attn_output_reshape.mean,"
    "time_stats.attn_output_reshape.median,time_stats.attn_output_reshape.std,time_stats.attn_prefill.min,"
    "time_stats.attn_prefill.max,time_stats.attn_prefill.mean,time_stats.attn_prefill.median,"
    "time_stats.attn_prefill.std,n_embd,n_q_head,n_kv_head,block_size,num_tensor_parallel_workers,max_model_len,"
    "batch_size,prefill_chunk_size,kv_cache_size,is_prefill,attention_backend")
"""The header of Vidur's published ``a100/meta-llama/Llama-2-7b-hf/attention.csv``."""


def test_header_is_vidurs():
    assert ",".join(ATTENTION_HEADER) == PUBLISHED_HEADER


def test_grid_holds_decodes_and_prefills_within_the_model_length():
    grid = attention_grid()
    decodes = [(b, kv) for b, c, kv in grid if c == 0]
    prefills = [(c, kv) for b, c, kv in grid if c > 0]
    assert {b for b, _ in decodes} == set(range(1, 129))
    assert min(kv for _, kv in decodes) == 32 and max(kv for _, kv in decodes) == 4032
    assert all(b == 1 for b, c, kv in grid if c > 0)
    assert all(c + kv <= 4096 for c, kv in prefills) and (4096, 0) in prefills and (64, 0) in prefills


def test_rows_tp1_non_negative_and_decode_increasing_in_batch(tmp_path):
    rows = stand_in_attention_rows(tensor_parallel=(1,))
    column = {name: i for i, name in enumerate(ATTENTION_HEADER)}
    assert all(len(row) == len(ATTENTION_HEADER) for row in rows)
    decode_by_kv: dict[int, dict[int, float]] = {}   # Vidur's grid lists 1,024 cached tokens twice
    for row in rows:
        is_prefill = row[column["is_prefill"]] == "True"
        timed = "time_stats.attn_prefill.median" if is_prefill else "time_stats.attn_decode.median"
        other = "time_stats.attn_decode.median" if is_prefill else "time_stats.attn_prefill.median"
        assert float(row[column[timed]]) > 0 and row[column[other]] == ""
        assert row[column["block_size"]] == "16" and row[column["num_tensor_parallel_workers"]] == "1"
        assert (row[column["prefill_chunk_size"]] != "0") == is_prefill
        if not is_prefill:
            decode_by_kv.setdefault(int(row[column["kv_cache_size"]]), {})[int(row[column["batch_size"]])] = float(
                row[column[timed]])
    assert len(decode_by_kv) == 79
    for points in decode_by_kv.values():
        times = [points[b] for b in sorted(points)]
        assert all(a < b for a, b in zip(times, times[1:]))
    # the file round-trips through a CSV reader with the same header
    path = tmp_path / "attention.csv"
    written = write_stand_in_attention(path, tensor_parallel=(1,))
    with open(path, newline="") as f:
        reader = csv.reader(f)
        assert tuple(next(reader)) == ATTENTION_HEADER
        assert sum(1 for _ in reader) == written == len(rows)
