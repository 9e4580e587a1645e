"""The front end's option layer: command-line flags and policy specs -> the configuration types of ``sim``.

Public API:

* :func:`sim.frontend.options.add_config_args` / :func:`sim.frontend.options.config_from_args` (the flags every
  simulating command shares -> :class:`sim.setup.config.SimConfig`);
* :mod:`sim.frontend.policy_spec` (``NAME:key=value`` specs: ``parse_policy``, ``POLICY_KEYS``,
  ``policy_config_error``, which names a spec's key instead of the field);
* :mod:`sim.frontend.disagg_options` (``--pd``, ``--kv-link``, per-role flags -> a
  :class:`sim.cluster.disagg.DisaggConfig`);
* :mod:`sim.frontend.argtypes` (argparse types: ``int_at_least``, ``positive_float``, ``size_arg``);
* :mod:`sim.frontend.flags` (``flag_message``: an error of the core, which names fields, as one naming the
  command line's flags; ``parser_flags``, ``FIELD_DESTS``).

Used by ``cli``, ``traces``, ``analysis`` and ``hwbackend``; no other package of ``sim`` imports it.
"""
