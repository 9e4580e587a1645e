"""Hardware backend: the simulator's vAttention policy executed on real CUDA VMM calls.

Sub-packages (each ``__init__`` lists its modules):
    vmm          the VMM driver (real and emulated), transactions, KV tensors, plan executors, TP workers
    replay       the serving loop on the GPU with a real decoder forward pass, and its command line
    calibration  VMM and compute calibration into profiles; validation of the simulator against hardware runs
    beyond       cross-layer layout, batched set-access, zero-on-reuse and prefix sharing on the hardware
    cli          ``kvsim calibrate`` and ``kvsim validate``

Nothing here imports torch or cuda-python at module import time, so the package imports on CPU-only CI.
"""
