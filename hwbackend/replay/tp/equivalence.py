"""TP=``tp`` against TP=1 on the same weights: the logits of a few iterations computed by every rank of a
sharded decoder (one process per rank, ``torch.distributed``) and by the one-GPU decoder.

Inputs are the same for both: a K/V cache pre-filled with seeded random values (so that attention scores
differ across positions; the decoder's input embeddings are all of token 0), of which each rank holds its
heads, and iterations that write new K/V and read it back (prefill chunks, then decodes). Used by
``tests/test_tp_replay.py`` (CPU, gloo) and ``tests/test_tp_replay_gpu.py`` (two GPUs, NCCL, bf16).
"""
from __future__ import annotations

import multiprocessing
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from hwbackend.replay.model import SeqWork

SLOT_TOKENS = 64
NUM_SLOTS = 4
BATCHES = ([SeqWork(0, 10, 7, True), SeqWork(1, 0, 12, True)],
           [SeqWork(0, 17, 1, True), SeqWork(1, 12, 5, True), SeqWork(2, 30, 3, True)],
           [SeqWork(0, 18, 1, True), SeqWork(1, 17, 1, True), SeqWork(2, 33, 1, True), SeqWork(3, 0, 1, True)])
"""Iterations of the check: chunks after random prior context (slots 0, 2), a prefill from 0 (slot 1), decodes."""


def _cache(shape: Any, device: Any, dtype: Any, seed: int, heads: slice) -> tuple[list, list]:
    """Per layer K and V ``[NUM_SLOTS * SLOT_TOKENS, heads, D]``: the whole model's seeded random cache, cut to
    ``heads``."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    k, v = [], []
    for _ in range(shape.num_layers):
        for out in (k, v):
            full = torch.randn(NUM_SLOTS * SLOT_TOKENS, shape.num_kv_heads, shape.head_dim, generator=gen)
            out.append(full[:, heads].contiguous().to(device=device, dtype=dtype))
    return k, v


def logits_of(model: Any, full_shape: Any, kv_heads: slice, seed: int = 7) -> list[np.ndarray]:
    """``model``'s logits (fp32 numpy ``[S, vocab]``) for :data:`BATCHES` over the random cache's ``kv_heads``."""
    from hwbackend.replay.model import BatchInputs

    k, v = _cache(full_shape, model.device, model.dtype, seed, kv_heads)
    out = []
    for work in BATCHES:
        logits = model.eager_forward(BatchInputs(work, SLOT_TOKENS, model.device), k, v, return_logits=True)
        out.append(logits.float().cpu().numpy())
    return out


def _rank(spec: Any, rank: int, queue: Any = None) -> list[np.ndarray]:
    from hwbackend.replay.tp.session import set_no_multicast
    from hwbackend.replay.tp.shard import ModelRunner

    set_no_multicast()
    try:
        runner = ModelRunner(spec, rank)
        try:
            per_rank = spec.shape.num_kv_heads // spec.tp
            logits = logits_of(runner.model, spec.shape, slice(rank * per_rank, (rank + 1) * per_rank))
        finally:
            runner.close()
    except BaseException as exc:  # reported to the parent, which names the rank
        if queue is not None:
            queue.put((rank, None, f"{type(exc).__name__}: {exc}"))
        raise
    if queue is not None:
        queue.put((rank, logits, None))
    return logits


def sharded_logits(full_shape: Any, tp: int, devices: tuple[str, ...], backend: str, seed: int = 0,
                   timeout_s: float = 120.0) -> list[list[np.ndarray]]:
    """Every rank's logits for :data:`BATCHES`: rank 0 in this process (it joins, then leaves, the default
    process group), ranks 1..tp-1 in spawned processes. Raises RuntimeError naming a rank that failed."""
    from hwbackend.replay.tp.session import PeerSpec
    from hwbackend.vmm.kvcache import KVCacheLayout

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    folder = Path(tempfile.mkdtemp(prefix="kvsim-tp-check-"))
    layout = KVCacheLayout(num_sub_tensors=2 * full_shape.num_layers, num_slots=1, max_pages_per_slot=1,
                           page_size_bytes=2 << 20)  # unused: no cache is opened here
    spec = PeerSpec(tp=tp, devices=devices, layout=layout, pool_page_groups=1, runner="model", dist_backend=backend,
                    init_method=f"file://{folder / 'store'}", shape=full_shape, seed=seed, timeout_s=timeout_s)
    processes = [ctx.Process(target=_rank, args=(spec, rank, queue), daemon=True) for rank in range(1, tp)]
    try:
        for process in processes:
            process.start()
        results = {0: _rank(spec, 0)}
        for _ in processes:
            rank, logits, error = queue.get(timeout=timeout_s)
            if error is not None:
                raise RuntimeError(f"rank {rank}: {error}")
            results[rank] = logits
        return [results[r] for r in range(tp)]
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.terminate()
        shutil.rmtree(folder, ignore_errors=True)


def reference_logits(full_shape: Any, device: str, seed: int = 0) -> list[np.ndarray]:
    """The one-GPU decoder's logits (:class:`hwbackend.replay.model.DecoderModel`, all heads)."""
    from hwbackend.replay.model import DecoderModel

    model = DecoderModel(full_shape, device=device, seed=seed, attention="reference")
    return logits_of(model, full_shape, slice(None))


def small_shape(shape: Any, **sizes: int) -> Any:
    """``shape`` with some sizes replaced (tests: fewer layers)."""
    return replace(shape, **sizes)
