"""kvsim simulator core: a SimPy model of LLM serving with page-level KV-cache memory management.

Time unit: every simulated time inside ``sim`` is in **microseconds** (float), see :mod:`sim.units`.

The hot modules may run compiled (:mod:`sim.compiled`): its guard is installed here, before any of them is
imported, so that a module edited since it was compiled runs from its source.
"""
from sim.compiled import install_guard as _install_guard

__version__ = "0.1.0"

_install_guard()
