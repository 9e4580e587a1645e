"""Per-layer and per-worker host overheads of one iteration (issue 31 item 3; terms of
:class:`sim.timing.compute.RooflineComputeModel`, all 0 by default so that every default run is unchanged).

Two forms, each with its source (docs/models.md, "Per-layer and per-worker overheads"):

* **Eager launch floor per layer** (``launch_us_per_layer``): an iteration that is not CUDA-graphed (every
  iteration without ``decode_graphs``, and the mixed prefill+decode ones with it) cannot end before the host has
  launched its kernels, ``layers x kernels per layer x launch latency``; host launches overlap the GPU's work, so
  the term is a floor, ``iteration = max(launch_floor_us, launch_us_per_layer x layers, roofline + overhead)``,
  not an addition. Each tensor-parallel worker is its own process launching its own kernels at the same time
  (vLLM's multiprocess executor), so the floor does not grow with ``tp``; with ``pp`` stages a stage launches its
  own layers once per micro-batch, so the round's floor is ``micro-batches x max stage layers x
  launch_us_per_layer``. The only sourced figure is this repository's H200 eager harness
  (:data:`H200_EAGER_LAUNCH_US_PER_LAYER`), not an engine's model code: it is documented, not a default.
* **Host cost per tensor-parallel collective** (``allreduce_launch_us``, ``allreduce_skew_us``): Vidur charges
  every all-reduce (two per layer) ``nccl_cpu_launch_overhead_ms + nccl_cpu_skew_overhead_per_device_ms x
  tp^1.25`` on top of its profiled all-reduce time (microsoft/vidur ``vidur/execution_time_predictor/
  sklearn_execution_time_predictor.py`` ``_get_tensor_parallel_communication_time``, defaults 0.02 ms and 0 ms in
  ``vidur/config/config.py``, commit 7d475133): :func:`collective_host_us`, added ``2 x layers`` times per
  iteration at ``tp > 1`` (:meth:`RooflineComputeModel._comm_us`).

Not available: Vidur's measured CPU overheads (``data/profiling/cpu_overhead/<device>/<model>/cpu_overheads.csv``,
the default path of ``cpu_overhead_input_file``) are not published in the public repository (its ``data/`` tree
holds compute and network profiles only; ``skip_cpu_overhead_modeling`` defaults to True), so no per-batch-size
fit of schedule / sampler / prepare-inputs times exists to import.
"""
from __future__ import annotations

from functools import cached_property

import numpy as np


H200_EAGER_LAUNCH_US_PER_KERNEL = 20.7
"""Host launch time per kernel of this repository's eager-PyTorch harness on the H200, us: 9,323.7 us of
launch per decode-only Llama-3-8B forward (median over 565 iterations, batch 14-18,
``docs/validation/hw-sync-x1.5/phases_summary.json`` ``median_decode_only_us.launch_us``) over ~450 kernels
(docs/validation/README.md, "Host-bound floor")."""

H200_EAGER_LAUNCH_US_PER_LAYER = 9323.7 / 32
"""The same launch time per layer of Llama-3-8B (32 layers): 291.4 us; ~14 kernels per layer x
:data:`H200_EAGER_LAUNCH_US_PER_KERNEL`. A value for ``launch_us_per_layer`` that reproduces that harness, not
vLLM's or SGLang's (other kernel counts per layer, fused kernels)."""

VIDUR_NCCL_CPU_LAUNCH_US = 0.02 * 1000
"""Vidur's host launch cost per tensor-parallel all-reduce, us (``nccl_cpu_launch_overhead_ms = 0.02``,
microsoft/vidur ``vidur/config/config.py``); a value for ``allreduce_launch_us``."""

VIDUR_SKEW_EXPONENT = 1.25
"""Vidur's growth of the per-device skew cost with the tensor-parallel degree, ``tp ** 1.25``
(``_get_tensor_parallel_communication_time``)."""


def collective_host_us(launch_us: float, skew_us: float, tp: int) -> float:
    """Host cost (us) of one tensor-parallel all-reduce beyond its transfer: ``launch_us + skew_us x tp^1.25``
    (Vidur's form, module docstring); 0 at ``tp == 1`` (no collective)."""
    if tp <= 1:
        return 0.0
    return launch_us + skew_us * tp ** VIDUR_SKEW_EXPONENT


class EagerLaunchFloor:
    """Mixin of :class:`sim.timing.compute.RooflineComputeModel`: the host-bound floor of an eager iteration,
    ``max(launch_floor_us, launch_us_per_layer x layers)`` (us; module docstring). Needs the fields
    ``launch_floor_us``, ``launch_us_per_layer`` and ``model``."""

    @cached_property
    def _eager_floor_us(self) -> float:
        """The floor (us) of one eager iteration over the model's ``num_layers`` (the whole model: a pipeline's
        rounds use :meth:`_round_floor_us`); ``launch_floor_us`` itself when ``launch_us_per_layer`` is 0."""
        if not self.launch_us_per_layer:
            return self.launch_floor_us
        return max(self.launch_floor_us, self.launch_us_per_layer * self.model.num_layers)

    def _round_floor_us(self, micro_batches, stage_layers: int):
        """The floor (us) of pipeline rounds of ``micro_batches`` (a number or an array): each stage launches its
        ``stage_layers`` layers once per micro-batch; ``launch_floor_us`` when ``launch_us_per_layer`` is 0."""
        if not self.launch_us_per_layer:
            return self.launch_floor_us
        return np.maximum(self.launch_floor_us, np.asarray(micro_batches, dtype=float) * stage_layers
                          * self.launch_us_per_layer)
