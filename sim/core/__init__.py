"""The serving loop and its per-request state (one instance, simulated time in microseconds).

Public API:

* :func:`sim.core.runner.run_simulation` (a configuration and a trace -> :class:`sim.results.summary.RunResult`),
  :func:`sim.core.runner.load_models` (profile -> VMM latency and compute models);
* :class:`sim.core.engine.Simulator` (the SimPy executor; :class:`sim.core.engine.SimOutput`, its raw records),
  made of :class:`sim.core.admission.Admission`, :class:`sim.core.step.IterationStep` and
  :class:`sim.core.decode_runs.DecodeRuns`; the memory costs it charges: :mod:`sim.core.costs`;
* :mod:`sim.core.scheduler` (``SCHEDULERS``, ``Batch``), :mod:`sim.core.lifecycle` (``RequestBookkeeping``, the
  clock-free rules both executors share), :class:`sim.core.cohort.DecodeCohort`,
  :class:`sim.core.mapper.AsyncMapper`, :class:`sim.core.request.Request`.

Imports ``sim.memory``, ``sim.timing``, ``sim.setup``, ``sim.results``; never ``sim.cluster`` or ``sim.frontend``.
"""
