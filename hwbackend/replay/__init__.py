"""Hardware replay: the simulator's serving loop run in real time on the GPU.

    model  a random-weight decoder (:class:`DecoderModel`) over the VMM-backed K/V; batch inputs
    loop   the serving loop (:class:`ReplayLoop`): the simulator's scheduler, policy and bookkeeping
    kv     opening the VMM-backed KV cache for a run configuration
    cli    ``python -m hwbackend.replay.cli``: replay a trace, write a run directory
"""
