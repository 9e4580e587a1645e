"""Memory managers: pure policy logic (no SimPy, no I/O) that returns :class:`sim.plan.Plan` objects."""
from sim.memory.vattention import VAttentionConfig, VAttentionPolicy

__all__ = ["VAttentionConfig", "VAttentionPolicy"]
