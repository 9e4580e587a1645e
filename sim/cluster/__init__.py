"""Serving with several instances: replicas behind a router, and disaggregated prefill/decode.

Public API:

* :func:`sim.cluster.routing.simulate_replicas` (routers ``ROUTERS``, executors ``EXECUTORS`` in
  :mod:`sim.cluster.routers`, importable without pandas), ``merge_replicas``, ``co_simulate_least_outstanding``;
* :mod:`sim.cluster.replica_merge` (replicas simulated to files, merged in bounded memory);
* :class:`sim.cluster.disagg.DisaggConfig`, :func:`sim.cluster.disagg.run_disagg`,
  :class:`sim.cluster.disagg.DisaggCluster` (instances in :mod:`sim.cluster.disagg_instances`, the summary in
  :mod:`sim.cluster.disagg_summary`).

Imports ``sim.core``, ``sim.timing``, ``sim.setup``, ``sim.results``; never ``sim.frontend``.
"""
