"""The timing models: how long the modelled work takes (microseconds).

Public API:

* :class:`sim.timing.compute.RooflineComputeModel` (an iteration's compute time; ``BatchShape``, the profile's
  compute fields ``check_compute_field``), :func:`sim.timing.model_for.compute_model_for` (the model of a configuration; pipeline parallelism:
  :mod:`sim.timing.pipeline`);
  its parts, all re-exported by :mod:`sim.timing.compute`: :mod:`sim.timing.compute_fields` (the fields' names,
  ranges and checks), :mod:`sim.timing.attention_blocks` (the block form of attention time, FlashAttention-2's
  thread blocks and key splits: ``BlockAttentionForm``), :mod:`sim.timing.decode_run_times` (runs of decode iterations:
  ``DecodeRunForms``), :mod:`sim.timing.allreduce` (NCCL's all-reduce cost, ``nccl_allreduce_us``);
* :class:`sim.timing.latency.VmmLatencyModel` (cuMemMap / cuMemSetAccess / unmap draws; ``read_profile``,
  ``check_profile``, ``ProfileError``), drawn through :class:`sim.timing.draws.BufferedDraws` (the generator's
  draws taken in blocks, the same values);
* :class:`sim.timing.kvlink.KvLink` (KV transfers between instances; ``LINKS``, ``streamed_finish_us``).

Imports ``sim.setup`` and ``sim.units`` only.
"""
