"""What is simulated: the model, the GPU and the run configuration.

Public API:

* :class:`sim.setup.config.SimConfig` (every knob, checked in ``__post_init__``; ``ConfigError``, ``POLICIES``);
  its parts, re-exported by :mod:`sim.setup.config`: :mod:`sim.setup.config_checks` (``check_config``, the
  name tables and ``ConfigError``) and :mod:`sim.setup.config_sizes` (``PoolSizing``: the model a worker holds,
  the allocation unit and the pool);
* :func:`sim.setup.catalog.get_model` / ``get_gpu`` / ``model_names`` / ``gpu_names`` (the built-in catalogue,
  ``sim/setup/catalog.toml``, or a user's file read by :mod:`sim.setup.model_files`);
* :class:`sim.setup.specs.ModelSpec`, :class:`sim.setup.specs.GPUSpec` (derived sizes; ``CatalogError``,
  ``DTYPE_BYTES``); the spec's KV-cache and parameter sizes are the :class:`sim.setup.model_sizes.ModelSizes` mixin.

Imports ``sim.memory`` (the policy's knob ranges), ``sim.units``, and (one function-local check) the scheduler names of
``sim.core.scheduler``.
"""
