"""Tensor-parallel hardware replay (issue 20): one process per rank, the decoder sharded Megatron-style with
two all-reduces per layer, one scheduler and one vAttention policy driving every rank's VMM executor through
the two-phase tensor-parallel executor.

Modules::

    rpc      request/reply over a pipe (errors cross it)                               no torch
    remote   RemoteTPExecutor: TPExecutor with workers in other processes              no torch
    peers    the compute commands, TPModel (what the loop sees), RecordingRunner       no torch
    session  PeerSpec, spawning the ranks, each rank's main, the cache of every rank   no torch
    replay   replay_tp: start-up, warm-up, graphs, ReplayLoop, teardown                no torch at import
    shard    ShardedDecoderModel, TPDecodeGraphs, ModelRunner                          torch
    cli      python -m hwbackend.replay.tp.cli (the one-GPU replay's options + --devices, --dist-backend)
    allreduce  python -m hwbackend.replay.tp.allreduce: all-reduce time per layer (eager and graphed)

Docs: ``docs/tensor-parallel.md``; the two-GPU plan and device script: ``docs/tp2/PLAN.md``, ``docs/tp2/device-replay.sh``.
"""
