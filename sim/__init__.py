"""kvsim simulator core: a SimPy model of LLM serving with page-level KV-cache memory management.

Time unit: every simulated time inside ``sim`` is in **microseconds** (float), see :mod:`sim.units`.
"""
__version__ = "0.1.0"
