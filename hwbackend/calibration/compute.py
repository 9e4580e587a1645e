"""Compute calibration: time real iterations over a grid of batch shapes and fit the simulator's
:class:`sim.timing.compute.RooflineComputeModel` to them (``kvsim calibrate --compute``).

Each grid point is one iteration shape: ``decodes`` sequences of one token at a given context, plus
prefill chunks of ``tokens`` new tokens after ``context`` cached ones. It is run through the replay's own
code path (:class:`hwbackend.replay.model.BatchInputs` + :meth:`DecoderModel.forward` over the VMM-backed cache,
pages mapped by the vAttention executor, tokens copied back), ``warmup`` times and then ``repeats``
times; the median wall time (microseconds) is the measurement.

The timed region also holds the executor's step over already-mapped pages, the iteration event and the
completion poll (:func:`_time_iteration_us`), i.e. a replay iteration minus scheduling and mapping.

The fit (least squares on relative error, ``scipy.optimize.least_squares`` from several starts) adjusts
``flops_efficiency``, ``bw_efficiency``, ``attention_flops_efficiency`` and ``overhead_us``; the profile
gets ``compute.roofline`` and ``compute.fit_error`` (median, p90, max of ``|model / measured - 1|`` over the
grid), plus ``compute.tiled_roofline`` (the roofline with a launch floor and a mixed-batch term,
:mod:`hwbackend.calibration.compute_tiled`), which ``sim.core.runner.load_models`` prefers when present.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from hwbackend.calibration.compute_tiled import fit_tiled
from hwbackend.calibration.fitting import best_fit, fit_error
from hwbackend.replay.model import BatchInputs, SeqWork
from sim.timing.compute import BatchShape, RooflineComputeModel, attention_block_terms

FIT_FIELDS = ("flops_efficiency", "bw_efficiency", "attention_flops_efficiency", "overhead_us")
FIT_BOUNDS = ((0.05, 0.05, 0.01, 0.0), (1.0, 1.0, 1.0, 50_000.0))


@dataclass(frozen=True)
class GridPoint:
    """One iteration shape: ``decodes`` x (1 token after ``decode_context`` cached) plus prefill chunks
    ``(tokens, context)``."""

    decodes: int = 0
    decode_context: int = 0
    chunks: tuple[tuple[int, int], ...] = ()

    def work(self, first_slot: int = 0) -> list[SeqWork]:
        """The sequences of this point on consecutive slots from ``first_slot``."""
        seqs = [SeqWork(first_slot + i, self.decode_context, 1, True) for i in range(self.decodes)]
        return seqs + [SeqWork(first_slot + self.decodes + j, c, t, True) for j, (t, c) in enumerate(self.chunks)]

    def shape(self) -> BatchShape:
        """The simulator's view of this iteration (as ``sim.core.engine._shape``)."""
        return batch_shape(self.work())


def batch_shape(work: list[SeqWork]) -> BatchShape:
    """BatchShape of a list of sequences (pairs: ``t * (context + (t + 1) / 2)``, as ``sim.core.engine._shape``),
    with FlashAttention-2's thread blocks and the keys they read (:func:`sim.timing.compute.attention_block_terms`)."""
    blocks = [attention_block_terms(w.tokens, w.computed) for w in work]
    return BatchShape(new_tokens=sum(w.tokens for w in work),
                      attention_pairs=sum(w.tokens * (w.computed + (w.tokens + 1) / 2) for w in work),
                      kv_read_tokens=sum(w.computed for w in work), logit_sequences=sum(w.emits for w in work),
                      max_context_tokens=max((w.computed + w.tokens for w in work), default=0),
                      attention_blocks=sum(n for n, _ in blocks), block_keys=float(sum(k for _, k in blocks)))


def default_grid() -> list[GridPoint]:
    """Decode batches 1..128 at contexts 256..3072; prefill chunks 32..2048 tokens alone and after 2048
    cached; decode batches of 8, 24 and 48 with chunks of 64..2048 - batch tokens (Sarathi's mixed batches)."""
    grid = [GridPoint(b, c) for b in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128) for c in (256, 1024, 3072)]
    grid += [GridPoint(chunks=((t, c),)) for t in (32, 128, 512, 1024, 2048) for c in (0, 2048)]
    grid += [GridPoint(b, 1024, ((t, 0),)) for b in (8, 24, 48) for t in (64, 256, 512, 1024, 2048 - b)]
    return grid


def measure_grid(model: Any, kv: Any, grid: list[GridPoint], warmup: int = 3, repeats: int = 11) -> list[float]:
    """Median wall time (us) of one iteration per grid point, pages mapped by ``kv.executor``."""
    import gc

    times_us = []
    gc.collect()
    gc.disable()  # as in the replay
    try:
        return _measure(model, kv, grid, warmup, repeats, times_us)
    finally:
        gc.enable()


def _measure(model: Any, kv: Any, grid: list[GridPoint], warmup: int, repeats: int, times_us: list) -> list[float]:
    for index, point in enumerate(grid):
        work = point.work()
        slots = [kv.executor.alloc_slot(w.computed + w.tokens) for w in work]
        if None in slots or not kv.executor.step({s: w.computed + w.tokens for s, w in zip(slots, work)}):
            raise RuntimeError(f"grid point {point} does not fit the KV pool")
        work = [SeqWork(s, w.computed, w.tokens, w.emits) for s, w in zip(slots, work)]
        targets = {w.slot: w.computed + w.tokens for w in work}
        samples = [_time_iteration_us(model, kv, work, targets, index) for _ in range(warmup + repeats)]
        times_us.append(float(np.median(samples[warmup:])))
        for slot in slots:
            kv.executor.free_slot(slot, index)
    return times_us


def _time_iteration_us(model: Any, kv: Any, work: list[SeqWork], targets: dict, iteration: int) -> float:
    """Wall time (us) of what a replay iteration does besides scheduling: the executor's step (pages already
    mapped), host inputs, forward, the iteration event, the token copy, the completion poll."""
    start = time.perf_counter_ns()
    kv.executor.step(targets)
    inputs = getattr(model, "batch_inputs", BatchInputs)(work, kv.slot_tokens, model.device)
    tokens = model.forward(inputs, kv.k, kv.v)
    kv.executor.iteration_launched(iteration)
    tokens.cpu()
    kv.executor.poll_completed()
    return (time.perf_counter_ns() - start) * 1e-3


def predict_us(base: RooflineComputeModel, params: np.ndarray, shapes: list[BatchShape]) -> np.ndarray:
    """The roofline's iteration time (us) for each shape with ``params`` in :data:`FIT_FIELDS` order."""
    model = base.with_overrides(dict(zip(FIT_FIELDS, params)))
    return np.array([model.iteration_us(s) for s in shapes])


def fit_roofline(base: RooflineComputeModel, shapes: list[BatchShape], measured_us: list[float]) -> tuple[dict, dict]:
    """Least-squares fit of :data:`FIT_FIELDS` on relative error; returns ``(roofline, fit_error)``."""
    measured = np.asarray(measured_us, dtype=float)

    def residual(params: np.ndarray) -> np.ndarray:
        return predict_us(base, params, shapes) / measured - 1.0

    best = best_fit(residual, ([0.8, 0.9, 0.5, 1000.0], [0.6, 0.7, 0.2, 2000.0], [0.9, 0.6, 0.8, 500.0],
                               [0.5, 0.95, 0.1, 3000.0]), bounds=FIT_BOUNDS, x_scale=[0.1, 0.1, 0.1, 500.0])
    roofline = {name: round(float(v), 6) for name, v in zip(FIT_FIELDS, best.x)}
    return roofline, fit_error(np.abs(residual(best.x)))


def compute_section(base: RooflineComputeModel, grid: list[GridPoint], measured_us: list[float], meta: dict) -> dict:
    """The profile's ``compute`` section: fitted roofline, its error, and the grid with both times."""
    shapes = [p.shape() for p in grid]
    roofline, error = fit_roofline(base, shapes, measured_us)
    default_error = fit_error(np.abs(predict_us(base, np.array([getattr(base, f) for f in FIT_FIELDS]), shapes)
                                     / np.asarray(measured_us) - 1))
    fitted = predict_us(base, np.array([roofline[f] for f in FIT_FIELDS]), shapes)
    rows = [{"decodes": p.decodes, "decode_context": p.decode_context, "chunks": [list(c) for c in p.chunks],
             "measured_us": round(m, 1), "model_us": round(float(f), 1)} for p, m, f in zip(grid, measured_us, fitted)]
    return {"roofline": roofline, "fit_error": error, "default_roofline_error": default_error,
            "method": "median wall time of the replay's forward (host prep + GPU + token copy), least squares "
                      "on relative error", **meta, "tiled_roofline": fit_tiled(base, shapes, measured_us),
            "grid": rows}


def run_compute_calibration(model_name: str, profile_path: str, device: str = "cuda:0", paged: bool = True,
                            created_by: str = "") -> dict:
    """Measure the grid (and the paged baseline), fit, and merge ``compute`` / ``paged_attention`` into the
    profile at ``profile_path`` (other sections untouched; a missing file gets a minimal header).

    Returns:
        The sections written.
    """
    import json
    from pathlib import Path

    import torch

    from hwbackend.replay.model import DecoderModel
    from hwbackend.replay.cli import choose_attention, warm_up
    from hwbackend.replay.kv import open_kv
    from sim.setup.config import SimConfig

    config = SimConfig(model=model_name, sync_mapping=True)
    shape = config.model_spec.per_worker(config.tp)
    model = DecoderModel(shape, device=device, seed=config.seed)
    model.attention, check = choose_attention(model, "auto")
    warm_up(model)
    grid = default_grid()
    kv = open_kv(config, shape, device)
    try:
        measured_us = measure_grid(model, kv, grid)
    finally:
        kv.close()
    base = RooflineComputeModel(config.model_spec, config.gpu_spec, config.tp)
    meta = {"model": model_name, "attention_backend": model.attention, "gpu_name": torch.cuda.get_device_name(),
            "torch_version": torch.__version__, "created_by": created_by, **check}
    sections = {"compute": compute_section(base, grid, measured_us, meta)}
    if paged:
        from hwbackend.calibration.paged import measure_paged

        del model
        torch.cuda.empty_cache()
        sections["paged_attention"] = {"model": model_name, **measure_paged(shape, torch.device(device))}
    path = Path(profile_path)
    profile = json.loads(path.read_text()) if path.exists() else {"format": "kvsim-profile/1"}
    profile.update(sections)
    path.write_text(json.dumps(profile, indent=1) + "\n")
    return sections
