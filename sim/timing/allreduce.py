"""NCCL's cost model of one all-reduce inside a server (the tensor-parallel term ``comm_us`` of
:class:`sim.timing.compute.RooflineComputeModel`; re-exported by :mod:`sim.timing.compute`)."""
from __future__ import annotations

import numpy as np

from sim.units import US_PER_S


NCCL_BASE_LATENCY_US = {("tree", "ll"): 4.4, ("tree", "simple"): 0.0, ("ring", "ll"): 3.6, ("ring", "simple"): 8.4}
"""NCCL's fixed latency per collective by algorithm and protocol, us (``baseLat``, NVIDIA/nccl
``src/graph/tuning.cc``, commit 01afd20a; LL128 is left out: NCCL enables it by default on Volta and Ampere with
NVLink only, and its figures lie between LL's and Simple's)."""

NCCL_HOP_LATENCY_US = {
    True: {("tree", "ll"): 0.52, ("tree", "simple"): 28.0, ("ring", "ll"): 0.47, ("ring", "simple"): 3.4},
    False: {("tree", "ll"): 1.0, ("tree", "simple"): 28.0, ("ring", "ll"): 1.0, ("ring", "simple"): 5.7},
}
"""NCCL's latency per step inside one server, us, over NVLink (``True``) or PCIe (``False``) (``hwLat``, same
file)."""


def nccl_allreduce_us(nbytes, ranks: int, link_bytes_per_s: float, nvlink: bool):
    """Time (us) of one all-reduce of ``nbytes`` bytes (a number or an array) over ``ranks`` GPUs of one server,
    as NCCL's own cost model predicts it and picks the algorithm and protocol (``ncclTopoTuneModel`` and
    ``ncclTopoGetAlgoTime``, NVIDIA/nccl ``src/graph/tuning.cc``): the least over ring and tree, LL and Simple, of
    ``latency + nbytes / algorithm_bandwidth`` with

        ring latency = baseLat + 2 (n - 1) hwLat,   ring bandwidth = busBw n / (2 (n - 1))   (LL: busBw / 4)
        tree latency = baseLat + 2 (n - 1) hwLat,   tree bandwidth = min(0.9 busBw, 110 GB/s) / 2  (LL: / 3.8)

    ``busBw`` is the link's bus bandwidth per direction (``link_bytes_per_s``): nccl-tests' definition,
    ``busbw = algbw * 2 (n - 1) / n`` for all-reduce (nccl-tests ``doc/PERFORMANCE.md``), so large messages take
    ``2 (n - 1) / n * nbytes / busBw`` plus the ring's latency, and small ones NCCL's LL latency, 3.6 + 0.94 (n - 1)
    us on NVLink. Not modelled: the tree's size correction factors, LL128, NVLS (NVSwitch multicast), and vLLM's
    custom all-reduce kernel that replaces NCCL below 8 MiB on fully NVLink-connected GPUs.

    Raises:
        ValueError: ``ranks < 2`` or a link bandwidth that is not > 0.
    """
    if ranks < 2 or not link_bytes_per_s > 0:
        raise ValueError(f"an all-reduce needs ranks >= 2 and a link bandwidth > 0, got {ranks}, {link_bytes_per_s}")
    bus_bytes_per_us = link_bytes_per_s / US_PER_S
    tree_bytes_per_us = min(0.9 * bus_bytes_per_us, 110e9 / US_PER_S) * 0.5
    algorithm_bytes_per_us = {("ring", "simple"): bus_bytes_per_us * ranks / (2 * (ranks - 1)),
                              ("ring", "ll"): bus_bytes_per_us / 4 * ranks / (2 * (ranks - 1)),
                              ("tree", "simple"): tree_bytes_per_us, ("tree", "ll"): tree_bytes_per_us / 3.8}
    hops = NCCL_HOP_LATENCY_US[bool(nvlink)]
    best = None
    for key, rate in algorithm_bytes_per_us.items():
        time_us = NCCL_BASE_LATENCY_US[key] + 2 * (ranks - 1) * hops[key] + np.asarray(nbytes, dtype=float) / rate
        best = time_us if best is None else np.minimum(best, time_us)
    return float(best) if np.ndim(best) == 0 else best

