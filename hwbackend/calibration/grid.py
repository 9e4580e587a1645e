"""The compute-calibration grid that spans what a serving loop meets (issue 19): ``kvsim calibrate --grid``.

The first grid (:func:`hwbackend.calibration.compute.default_grid`) held decode batches up to 128 sequences of
one context each, up to 3,072 tokens, run eagerly. A model fitted there, or on conversation replays, missed
long-context traffic by ~30% (``docs/validation/README.md``). This grid measures every iteration the way the
replay runs it (:class:`hwbackend.replay.model.DecodeGraphs` for decode-only batches, eager for batches with a
prefill chunk) over the VMM-backed cache (:func:`hwbackend.replay.kv.open_kv`), in five families:

* ``decode``: ``b`` decodes at one context ``c``, ``b`` in 1..256 and ``c`` in 128..``max_context``;
* ``decode-skew``: one decode at a long context ``c_max`` and ``b - 1`` at 512 tokens (the longest sequence
  alone sets the attention kernel's last wave);
* ``decode-spread``: ``b`` decodes with contexts evenly spread over ``256 .. c_max``;
* ``prefill``: one chunk of ``t`` tokens after ``c`` cached ones;
* ``mixed``: a chunk plus ``d`` decodes (Sarathi-Serve's batches), eager.

Points whose K/V do not fit ``pool_tokens`` (tokens rounded up to whole page groups) are left out. Each point
is timed as :func:`hwbackend.calibration.compute._time_iteration_us` times a replay iteration (executor step
over mapped pages, host inputs, forward, token copy), ``warmup`` times then ``repeats`` times; the rows keep
the median and the 10th / 90th percentiles (microseconds) with the point's :class:`sim.timing.compute.BatchShape`
fields, so that :mod:`hwbackend.calibration.inloop` fits on grid rows and replay rows alike.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np


GRID_COLUMNS = ("family", "point", "decodes", "chunk_tokens", "chunk_context", "new_tokens", "attention_pairs",
                "kv_read_tokens", "logit_sequences", "max_context_tokens", "attention_blocks", "block_keys",
                "graphed", "measured_us", "p10_us", "p90_us")
"""Columns of ``grid.parquet``: the point (family, index, decodes, chunk tokens / context; -1 without a chunk),
its batch shape (:class:`sim.timing.compute.BatchShape` fields), whether it ran as a CUDA graph, and its times (us)."""

DECODE_BATCHES = (1, 2, 4, 8, 16, 24, 32, 40, 48, 64, 96, 128, 160, 192, 256)
DECODE_CONTEXTS = (128, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
LONG_BATCHES = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64)
LONG_CONTEXTS = (16384, 24576, 32768, 49152, 65536, 98304, 131072)
POINT_SETS = ("base", "long")
"""``base``: the first grid of issue 19 (contexts to 64K, batches beyond 8 only to 16K). ``long``: the second
round (docs/validation/cross-workload/PLAN.md, round 2): batches of 1-64 decodes at 16K-128K contexts, spread and
skewed long batches, prefill chunks after 64K-127K cached tokens, and chunks beside long decodes, which the
Mooncake held-out replay met (batches of 17-64 with a longest context of 32K+) and the base grid left out."""


def grid_points(max_context: int, pool_tokens: int, tokens_per_group: int, max_batch: int = 256,
                point_set: str = "base") -> list[dict]:
    """The grid: a list of ``{"family", "seqs": [(tokens, context), ...]}``, decodes first then chunks.

    Args:
        max_context: longest context measured (the slot length, L_max). pool_tokens: K/V tokens the pool holds.
        tokens_per_group: tokens per page group (a sequence occupies ``ceil((context + tokens) / it)`` groups).
        max_batch: most sequences in one point (the decode graphs' largest batch).
        point_set: one of :data:`POINT_SETS`.

    Raises:
        ValueError: an unknown ``point_set``.
    """
    if point_set not in POINT_SETS:
        raise ValueError(f"point set {point_set!r}: choose one of {', '.join(POINT_SETS)}")
    def fits(seqs: list[tuple[int, int]]) -> bool:
        groups = sum(-(-(c + t) // tokens_per_group) for t, c in seqs)
        return (groups * tokens_per_group <= pool_tokens and len(seqs) <= max_batch
                and all(c + t <= max_context for t, c in seqs))

    points: list[dict] = []

    def add(family: str, seqs: list[tuple[int, int]]) -> None:
        if seqs and fits(seqs):
            points.append({"family": family, "seqs": seqs})

    if point_set == "long":
        _long_points(add, max_context)
        return points
    for b in DECODE_BATCHES:
        for c in DECODE_CONTEXTS:
            add("decode", [(1, c)] * b)
    for b in (8, 32, 64, 128):
        for c_max in (4096, 8192, 16384, 32768, 65536):
            add("decode-skew", [(1, c_max)] + [(1, 512)] * (b - 1))
    for b in (16, 48, 96, 160):
        for c_max in (2048, 4096, 8192, 16384):
            add("decode-spread", [(1, int(c)) for c in np.linspace(256, c_max, b).round()])
    for t in (64, 256, 512, 1024, 2048):
        for c in (0, 2048, 8192, 16384, 30720, 63488):
            add("prefill", [(t, c)])
    for d, dc in ((8, 1024), (32, 1024), (64, 2048), (128, 512), (32, 8192)):
        for t, c in ((64, 0), (512, 0), (2048 - d, 0), (512, 4096), (1024, 16384)):
            add("mixed", [(1, dc)] * d + [(t, c)])
    return points


def _long_points(add: Any, max_context: int) -> None:
    """The ``long`` point set (see :data:`POINT_SETS`), passed to ``add(family, seqs)``; a decode's context is
    kept one token under the slot length (its new token must fit)."""
    def ctx(c: int) -> int:
        return min(c, max_context - 1)

    for b in LONG_BATCHES:
        for c in LONG_CONTEXTS:
            add("decode", [(1, ctx(c))] * b)
    for b in (8, 16, 24, 32, 48, 64):
        for c_max in (32768, 65536, 98304, 131072):
            add("decode-spread", [(1, int(c)) for c in np.linspace(1024, ctx(c_max), b).round()])
    for b in (16, 32, 64):
        for c_max in (65536, 131072):
            add("decode-skew", [(1, ctx(c_max))] + [(1, 4096)] * (b - 1))
    for t in (512, 1024, 2048):
        for c in (65536, 98304, 126976):
            add("prefill", [(t, min(c, max_context - t))])
    for d, dc in ((8, 32768), (16, 32768), (32, 16384), (16, 65536)):
        for c in (0, 32768, 98304):
            t = 2048 - d
            add("mixed", [(1, dc)] * d + [(t, min(c, max_context - t))])


def shape_row(seqs: list[tuple[int, int]]) -> dict:
    """:class:`sim.timing.compute.BatchShape` fields of a point (``seqs``: ``(new tokens, cached)`` per sequence; each
    sequence's chunk emits a token, as a decode or a prompt's last chunk does)."""
    from hwbackend.calibration.compute import batch_shape
    from hwbackend.replay.model import SeqWork

    row = asdict(batch_shape([SeqWork(-1, c, t, True) for t, c in seqs]))
    del row["group_reads"]          # a hybrid model's reads per layer group: not a grid column
    return row


def measure_points(model: Any, kv: Any, points: list[dict], warmup: int = 2, repeats: int = 7,
                   progress: Any = None) -> list[dict]:
    """Time every point (see the module docstring); returns one row per point (:data:`GRID_COLUMNS`).

    Raises:
        RuntimeError: if a point's pages cannot be mapped (the pool is smaller than :func:`grid_points` assumed).
    """
    from hwbackend.calibration.compute import _time_iteration_us
    from hwbackend.replay.model import SeqWork

    rows, iteration = [], 0
    for index, point in enumerate(points):
        seqs = point["seqs"]
        slots = _map_point(kv.executor, seqs, iteration)
        if slots is None:   # idle slots keep deferred pages the point needs (a slot keeps what it maps)
            kv.executor.reclaim_idle()
            slots = _map_point(kv.executor, seqs, iteration)
        if slots is None:
            raise RuntimeError(f"grid point {index} ({point['family']}, {len(seqs)} sequences) does not fit the "
                               f"pool ({kv.executor.policy.free_page_groups} page groups free)")
        work = [SeqWork(s, c, t, True) for s, (t, c) in zip(slots, seqs)]
        targets = {w.slot: w.computed + w.tokens for w in work}
        samples = []
        for _ in range(warmup + repeats):   # iterations numbered as a replay numbers them: each one once
            samples.append(_time_iteration_us(model, kv, work, targets, iteration))
            iteration += 1
        samples = np.array(samples)
        timed = samples[warmup:]
        chunks = [(t, c) for t, c in seqs if t > 1]
        graphed = bool(model.graphs is not None and not chunks and len(seqs) in model.graphs.sizes)
        rows.append({"family": point["family"], "point": index, "decodes": len(seqs) - len(chunks),
                     "chunk_tokens": chunks[0][0] if chunks else -1, "chunk_context": chunks[0][1] if chunks else -1,
                     **shape_row(seqs), "graphed": graphed, "measured_us": float(np.median(timed)),
                     "p10_us": float(np.percentile(timed, 10)), "p90_us": float(np.percentile(timed, 90))})
        for slot in slots:
            kv.executor.free_slot(slot, iteration - 1)
        # freed slots become reusable (and their deferred pages reclaimable) once an iteration after their last
        # read completes: an empty iteration marks that point (every timed one already copied its tokens back)
        kv.executor.iteration_launched(iteration)
        iteration += 1
        _wait_completed(kv.executor, iteration - 1)
        if progress is not None:
            progress(index, len(points), rows[-1])
    return rows


def _map_point(executor: Any, seqs: list[tuple[int, int]], iteration: int) -> list[int] | None:
    """Slots for a point's sequences with their pages mapped, or None (nothing left allocated)."""
    slots = []
    for t, c in seqs:
        slot = executor.alloc_slot(c + t)
        if slot is None:
            break
        slots.append(slot)
    if len(slots) == len(seqs) and executor.step({s: c + t for s, (t, c) in zip(slots, seqs)}):
        return slots
    for slot in slots:
        executor.free_slot(slot, iteration - 1)
    return None


def _wait_completed(executor: Any, iteration: int, timeout_s: float = 10.0) -> None:
    """Poll ``executor`` until the policy has seen ``iteration`` complete (its event follows kernels that are
    already done, so this takes microseconds)."""
    deadline = time.perf_counter() + timeout_s
    while executor.policy.completed_iteration < iteration:
        executor.poll_completed()
        if time.perf_counter() > deadline:
            raise RuntimeError(f"iteration {iteration} did not complete within {timeout_s} s")


def run_grid(model_name: str, out_dir: str | Path, device: str = "cuda:0", max_context: int = 65536,
             warmup_s: float = 10.0, command: str = "", point_set: str = "base", compute: str = "harness",
             piecewise_graphs: bool = False) -> Path:
    """Measure the grid on ``device`` and write ``grid.parquet`` and ``grid.json`` (model, configuration,
    GPU, torch, timings) into ``out_dir`` (created; refused if it already holds a ``grid.parquet``).

    The configuration is the replay's defaults for ``model_name`` with ``max_context`` tokens per slot
    (``allow_long_context``), 256 slots and synchronous mapping; decode graphs are captured for 1..256.
    ``compute``: the replay's decoder (:data:`hwbackend.replay.engine.COMPUTE_MODES`: ``harness`` or ``engine``),
    recorded in ``grid.json`` so that a fit knows which kernels it describes; ``piecewise_graphs`` (engine):
    batches with prefill chunks of up to 512 tokens run as piecewise CUDA graphs
    (:func:`hwbackend.replay.engine.capture_piecewise_graphs`), recorded as ``piecewise_graphs``.

    Raises:
        FileExistsError: ``out_dir`` already holds a grid. RuntimeError: CUDA / VMM errors, a point that does
        not fit.
    """
    import gc

    import pandas as pd
    import torch

    from hwbackend.replay.cli import choose_attention, warm_up
    from hwbackend.replay.kv import open_kv
    from hwbackend.replay.engine import build_model
    from hwbackend.replay.model import capture_decode_graphs
    from sim.setup.config import SimConfig

    out = Path(out_dir)
    if (out / "grid.parquet").exists():
        raise FileExistsError(f"{out} already holds grid.parquet")
    out.mkdir(parents=True, exist_ok=True)
    config = SimConfig(model=model_name, sync_mapping=True, max_context_tokens=max_context, allow_long_context=True)
    shape = config.model_spec.per_worker(config.tp)
    started = time.perf_counter()
    model = build_model(compute, shape, device, config.seed)
    model.attention, check = choose_attention(model, "auto")
    warm_forwards = warm_up(model, warmup_s)
    kv = open_kv(config, shape, device)
    meta: dict = {"model": model_name, "compute": compute, "max_context_tokens": max_context,
                  "attention_backend": model.attention,
                  "warmup_forwards": warm_forwards, "command": command, **check}
    try:
        meta["graph_capture_s"] = round(capture_decode_graphs(model, kv, config.max_batch_slots), 1)
        meta["piecewise_graphs"] = bool(piecewise_graphs and compute == "engine")
        if meta["piecewise_graphs"]:
            from hwbackend.replay.engine import capture_piecewise_graphs
            meta["piecewise_capture_s"] = round(capture_piecewise_graphs(model, kv), 1)
        policy_config = kv.executor.policy.config
        tokens_per_group = policy_config.tokens_per_page
        pool_tokens = int(policy_config.pool_page_groups * tokens_per_group * 0.95)
        points = grid_points(max_context, pool_tokens, tokens_per_group, config.max_batch_slots, point_set)
        meta.update(pool_tokens=pool_tokens, tokens_per_group=tokens_per_group, points=len(points),
                    point_set=point_set)
        gc.collect()
        gc.disable()
        done: list[dict] = []

        def progress(i: int, n: int, r: dict) -> None:
            print(f"grid {i + 1}/{n} {r['family']} decodes {r['decodes']} chunk {r['chunk_tokens']} "
                  f"max ctx {r['max_context_tokens']}: {r['measured_us'] / 1000:.2f} ms", flush=True)
            done.append(r)
            if len(done) % 25 == 0:   # a grid cut short by a time limit keeps what it measured
                pd.DataFrame(done, columns=list(GRID_COLUMNS)).to_parquet(out / "grid.partial.parquet", index=False)

        try:
            rows = measure_points(model, kv, points, progress=progress)
        finally:
            gc.enable()
    finally:
        kv.close()
    meta.update(gpu_name=torch.cuda.get_device_name(model.device), torch_version=torch.__version__,
                wall_s=round(time.perf_counter() - started, 1))
    pd.DataFrame(rows, columns=list(GRID_COLUMNS)).to_parquet(out / "grid.parquet", index=False)
    (out / "grid.json").write_text(json.dumps(meta, indent=1) + "\n")
    (out / "grid.partial.parquet").unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m hwbackend.calibration.grid --out DIR [--model M] [--max-context N] [--device cuda:0]``."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m hwbackend.calibration.grid", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for grid.parquet and grid.json (new)")
    parser.add_argument("--model", default="llama-3.1-8b", help="catalogue model (default: llama-3.1-8b)")
    parser.add_argument("--max-context", type=int, default=65536, help="slot length and longest context measured")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--warmup-s", type=float, default=10.0)
    parser.add_argument("--points", choices=POINT_SETS, default="base",
                        help="point set: base (the first grid) or long (16K-128K contexts, large long batches)")
    parser.add_argument("--compute", choices=("harness", "engine"), default="harness",
                        help="decoder kernels, as python -m hwbackend.replay.cli --compute (default: harness, the "
                             "grids before 2026-12)")
    parser.add_argument("--piecewise-graphs", action="store_true",
                        help="engine: batches with prefill chunks of <= 512 tokens as piecewise CUDA graphs")
    args = parser.parse_args(argv)
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
    except Exception as exc:  # noqa: BLE001 - one line, then exit
        print(f"{parser.prog}: needs an NVIDIA GPU with torch: {exc}", file=sys.stderr)
        return 2
    try:
        out = run_grid(args.model, args.out, args.device, args.max_context, args.warmup_s,
                       command=" ".join(["python -m hwbackend.calibration.grid", *(argv or sys.argv[1:])]),
                       point_set=args.points, compute=args.compute, piecewise_graphs=args.piecewise_graphs)
    except FileExistsError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}/grid.parquet")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
