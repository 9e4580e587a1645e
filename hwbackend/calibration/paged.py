"""Paged baseline on hardware: the same attention with K/V in a block pool read through a block table,
timed against the contiguous (vAttention) layout, to measure the paged attention cost factor.

Layouts, per layer (``H'`` KV heads of dimension ``D``)::

    contiguous  [n * L, H', D]            sequence b's tokens at rows b*L .. b*L+len_b-1 (zero-copy varlen)
    paged       [num_blocks * bs, H', D]  token i of b at row block_table[b][i // bs] * bs + i % bs,
                                          blocks drawn in a random order from the pool (vLLM-style, bs=16)

Variants timed (CUDA events, attention only, averaged over ``layers`` distinct layers and ``repeats``):

* ``contiguous``: FlashAttention-2 varlen over the slot rows (what the replay runs).
* ``paged_gather``: gather each sequence's rows through the block table (``index_select`` of K and V),
  then the same kernel: the "gather + SDPA" baseline.
* ``paged_kernel``: FlashAttention-2's own block-table path (``block_table=``; blocks of 256 tokens, the
  smallest it accepts), where this torch build supports it; the error is recorded where it does not.

``factor`` (profile ``paged_attention.factor``) is the median over the grid of ``paged_gather / contiguous``.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from hwbackend.replay.model import BatchInputs, SeqWork, attend
from sim.setup.catalog import ModelSpec

DEFAULT_GRID = [[(1, c)] * b for b in (8, 32, 128) for c in (512, 2048, 4096)] + [[(2048, 2048)], [(1, 1024)] * 32 + [(1024, 0)]]
"""Sequences ``(new tokens, cached tokens)`` of each grid point: decode batches and two prefill shapes."""


def _time_ms(fn: Any, repeats: int) -> float:
    import torch

    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def _block_rows(lengths: np.ndarray, block_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
    """Random block tables for sequences of ``lengths`` tokens: ``(rows [sum len], table [n, max_blocks], pool)``."""
    blocks = -(-lengths // block_size)
    pool = int(blocks.sum())
    order = rng.permutation(pool)
    table = np.zeros((len(lengths), int(blocks.max())), dtype=np.int64)
    rows, used = [], 0
    for b, (length, count) in enumerate(zip(lengths, blocks)):
        table[b, :count] = order[used:used + count]
        used += count
        pos = np.arange(length)
        rows.append(table[b, pos // block_size] * block_size + pos % block_size)
    return np.concatenate(rows), table, pool


def measure_point(shape: ModelSpec, seqs: list[tuple[int, int]], device: Any, layers: int = 4,
                  repeats: int = 20, block_size: int = 16) -> dict:
    """Attention time per layer (ms) of one grid point in the three variants (see module docstring)."""
    import torch

    rng, dtype = np.random.default_rng(0), torch.bfloat16
    lengths = np.array([t + c for t, c in seqs])
    slot_tokens = int(lengths.max())
    work = [SeqWork(b, c, t, True) for b, (t, c) in enumerate(seqs)]
    inputs = BatchInputs(work, slot_tokens, device)
    heads, dim = shape.num_kv_heads, shape.head_dim
    q = torch.randn(inputs.num_tokens, shape.num_q_heads, dim, device=device, dtype=dtype)
    flat = [torch.randn(len(seqs) * slot_tokens, heads, dim, device=device, dtype=dtype) for _ in range(2 * layers)]
    rows, _, pool = _block_rows(lengths, block_size, rng)
    rows_t = torch.from_numpy(rows).to(device)
    cu_k = torch.from_numpy(np.concatenate(([0], np.cumsum(lengths)))).to(device=device, dtype=torch.int32)
    paged = [torch.randn(pool * block_size, heads, dim, device=device, dtype=dtype) for _ in range(2 * layers)]
    scale = 1.0 / math.sqrt(dim)

    def contiguous() -> None:
        for i in range(layers):
            attend("varlen", q, flat[2 * i], flat[2 * i + 1], inputs)

    def gathered() -> None:
        for i in range(layers):
            k, v = paged[2 * i].index_select(0, rows_t), paged[2 * i + 1].index_select(0, rows_t)
            torch.ops.aten._flash_attention_forward(q, k, v, inputs.cu_seq_q, cu_k, inputs.max_q, inputs.max_k,
                                                    0.0, True, False, scale=scale)

    out = {"seqs": len(seqs), "new_tokens": int(inputs.num_tokens), "kv_tokens": int(lengths.sum()),
           "contiguous_ms": _time_ms(contiguous, repeats) / layers, "paged_gather_ms": _time_ms(gathered, repeats) / layers}
    out.update(_paged_kernel(shape, lengths, inputs, q, layers, repeats, device))
    return out


def _paged_kernel(shape: ModelSpec, lengths: np.ndarray, inputs: BatchInputs, q: Any, layers: int,
                  repeats: int, device: Any) -> dict:
    """FlashAttention's in-kernel block table (256-token blocks), or the error this torch build gives."""
    import torch

    block = 256
    _, table, pool = _block_rows(lengths, block, np.random.default_rng(1))
    try:
        table_t = torch.from_numpy(table).to(device=device, dtype=torch.int32)
        caches = [torch.randn(pool, block, shape.num_kv_heads, shape.head_dim, device=device, dtype=torch.bfloat16)
                  for _ in range(2 * layers)]
        cu_k = torch.from_numpy(np.concatenate(([0], np.cumsum(lengths)))).to(device=device, dtype=torch.int32)

        def kernel() -> None:
            for i in range(layers):
                torch.ops.aten._flash_attention_forward(
                    q, caches[2 * i], caches[2 * i + 1], inputs.cu_seq_q, cu_k, inputs.max_q, inputs.max_k, 0.0,
                    True, False, scale=1.0 / math.sqrt(shape.head_dim), seqused_k=inputs.seqused_k, block_table=table_t)

        return {"paged_kernel_ms": _time_ms(kernel, repeats) / layers}
    except Exception as exc:  # an unsupported argument in this torch build: recorded, not fatal
        return {"paged_kernel_error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}


def measure_paged(shape: ModelSpec, device: Any, grid: list | None = None) -> dict:
    """The profile's ``paged_attention`` section: per-point times and ratios, and the median ``factor``."""
    points = [measure_point(shape, seqs, device) for seqs in (grid or DEFAULT_GRID)]
    gather = [p["paged_gather_ms"] / p["contiguous_ms"] for p in points]
    kernel = [p["paged_kernel_ms"] / p["contiguous_ms"] for p in points if "paged_kernel_ms" in p]
    section = {"factor": round(float(np.median(gather)), 4), "factor_method": "median of paged_gather / contiguous",
               "block_size_tokens": 16, "gather_factor_range": [round(min(gather), 4), round(max(gather), 4)]}
    if kernel:
        section["kernel_factor"] = round(float(np.median(kernel)), 4)
        section["kernel_block_size_tokens"] = 256
    section["grid"] = [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in p.items()} for p in points]
    return section
