"""Deterministic stand-ins for the latency and compute models, and tiny traces, for hand-checked tests."""
from __future__ import annotations

import numpy as np
import pandas as pd

from sim.timing.latency import VMM_CALLS, CallDistribution, VmmLatencyModel


def constant_vmm(map_us: float = 10.0, set_access_us: float = 40.0, unmap_us: float = 30.0,
                 create_us: float = 20.0, release_us: float = 25.0) -> VmmLatencyModel:
    """Every call takes exactly the given time (us), at every page size (sub-2 MiB pages included: not the
    modified driver's costs, :attr:`sim.timing.latency.VmmLatencyModel.modified_driver_below_2mib`)."""
    values = dict(zip(VMM_CALLS, (create_us, map_us, set_access_us, unmap_us, release_us)))
    table = {call: {2 * 1024 * 1024: CallDistribution(samples_us=np.array([us]))} for call, us in values.items()}
    return VmmLatencyModel(table=table, source="test constants", modified_driver_below_2mib=False)


class ConstantCompute:
    """Every iteration computes for exactly ``iteration_us``."""

    def __init__(self, iteration_us: float = 1000.0):
        self.constant_us = iteration_us

    def iteration_us(self, batch) -> float:
        return self.constant_us if batch.new_tokens else 0.0

    def decode_run_us(self, batch_size, kv_read_tokens, attention_pairs, steps, max_context_tokens=0) -> np.ndarray:
        return np.full(steps, self.constant_us)


def trace(rows: list[tuple[float, int, int]], source: str = "test") -> pd.DataFrame:
    """Canonical table from ``(arrival_s, prompt_tokens, output_tokens)`` rows."""
    frame = pd.DataFrame(rows, columns=["arrival_s", "prompt_tokens", "output_tokens"])
    frame.insert(0, "request_id", np.arange(len(rows), dtype=np.int64))
    frame.attrs["source"] = source
    return frame
