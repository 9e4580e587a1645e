"""Options the vAttention design leaves open, on the hardware: cross-layer layout, batched set-access,
zero-on-reuse, prefix sharing.

    ops     the operations (copy, memset, shared handles) and their checks
    layout  per-layer vs cross-layer attention speed (``python -m hwbackend.beyond.layout``)
    replay  the replay with these options (``python -m hwbackend.beyond.replay``)
    gpu     every part on the GPU in subprocesses (``python -m hwbackend.beyond.gpu``)
"""
