"""A candidate compute model for the simulator, fitted on the same calibration grid as the roofline: the
roofline plus the two effects the H200 grid shows it lacks (``profiles/h200.json`` ``compute.grid``).

1. **Query-tile padding in mixed batches.** The replay runs one FlashAttention varlen call per layer over
   the whole batch. When a prefill chunk is present (``max_q > 1``) every decode sequence is processed as
   a full query tile over its whole context, so attention costs ``tile_rows * kv_read_tokens`` extra
   (query, key) pairs (grid: 48 decodes at 1024 tokens plus a 64-token chunk take 18.2 ms against 9.6 ms
   and 7.3 ms for the two parts alone).
2. **Host launch floor.** Eager PyTorch launches ~450 kernels per iteration; below ~50 decodes the
   iteration is host-bound at ~8.5-9 ms whatever the batch: ``iteration = max(launch_floor_us, roofline)``.

Mixed batches are recognised from :class:`sim.timing.compute.BatchShape` alone: a batch holds a chunk exactly when
``new_tokens > logit_sequences`` (a decode adds one token and one logit row). The simulator's
:class:`sim.timing.compute.RooflineComputeModel` implements both terms (``mixed_tile_rows``, ``launch_floor_us``);
this module fits them; ``sim.core.runner`` uses the fit whenever a profile holds it.
"""
from __future__ import annotations


import numpy as np

from hwbackend.calibration.fitting import best_fit, fit_error
from sim.timing.compute import BatchShape, RooflineComputeModel

TILED_FIELDS = ("flops_efficiency", "bw_efficiency", "attention_flops_efficiency", "overhead_us", "tile_rows",
                "launch_floor_us")
TILED_BOUNDS = ((0.05, 0.05, 0.01, 0.0, 0.0, 0.0), (1.0, 1.0, 1.0, 50_000.0, 512.0, 30_000.0))


def build(base: RooflineComputeModel, params: dict) -> RooflineComputeModel:
    """The simulator's compute model for ``params`` (keys :data:`TILED_FIELDS`): the roofline fields plus
    ``mixed_tile_rows`` and ``launch_floor_us`` of :class:`sim.timing.compute.RooflineComputeModel`."""
    fields = {k: float(params[k]) for k in TILED_FIELDS[:4]}
    fields.update(mixed_tile_rows=float(params["tile_rows"]), launch_floor_us=float(params["launch_floor_us"]))
    return base.with_overrides(fields)


def fit_tiled(base: RooflineComputeModel, shapes: list[BatchShape], measured_us: list[float]) -> dict:
    """Fit :data:`TILED_FIELDS` on relative error with a robust loss (soft L1, scale 5%: the grid's first
    points, measured while the GPU clocks were still ramping, are 50% off their neighbours).

    Returns:
        ``{"params": {...}, "fit_error": {...}, "method": ...}``.
    """

    measured = np.asarray(measured_us, dtype=float)

    def residual(x: np.ndarray) -> np.ndarray:
        model = build(base, dict(zip(TILED_FIELDS, x)))
        return np.array([model.iteration_us(s) for s in shapes]) / measured - 1.0

    best = best_fit(residual, ([0.7, 0.8, 0.5, 1000.0, 64.0, 8500.0], [0.6, 0.6, 0.8, 2500.0, 200.0, 9000.0],
                               [0.8, 0.9, 0.3, 500.0, 128.0, 8000.0]), bounds=TILED_BOUNDS, loss="soft_l1",
                    f_scale=0.05, x_scale=[0.1, 0.1, 0.1, 500.0, 50.0, 500.0])
    return {"params": {k: round(float(v), 6) for k, v in zip(TILED_FIELDS, best.x)},
            "fit_error": fit_error(np.abs(residual(best.x))),
            "method": "least squares, soft-L1 loss (scale 0.05) on relative error over compute.grid"}
