"""The timing models: how long the modelled work takes (microseconds).

Public API:

* :class:`sim.timing.compute.RooflineComputeModel` (an iteration's compute time; ``BatchShape``, the profile's
  compute fields ``check_compute_field``), :func:`sim.timing.pipeline.compute_model_for` (pipeline parallelism);
* :class:`sim.timing.latency.VmmLatencyModel` (cuMemMap / cuMemSetAccess / unmap draws; ``read_profile``,
  ``check_profile``, ``ProfileError``), drawn through :class:`sim.timing.draws.BufferedDraws` (the generator's
  draws taken in blocks, the same values);
* :class:`sim.timing.kvlink.KvLink` (KV transfers between instances; ``LINKS``, ``streamed_finish_us``).

Imports ``sim.setup`` and ``sim.units`` only.
"""
