"""Hardware backend: the simulator's vAttention policy executed on real CUDA VMM calls.

Modules:
    driver      checked, timed wrapper over ``cuda.bindings.driver`` VMM calls (:class:`CudaVmmDriver`)
    emulated    the same interface with strict semantics and no GPU (:class:`EmulatedVmmDriver`)
    transaction undo logs for multi-step driver sequences
    kvcache     2N' reserved K/V tensors, a physical handle pool, page groups mapped per slot
    tensors     torch tensors ``[B, L_max, H', D]`` over the reserved virtual memory (DLPack)
    executor    applies :class:`sim.memory.vattention.VAttentionPolicy` plans, background mapper thread
    calibrate   microbenchmarks writing a ``kvsim-profile/1`` JSON profile (``kvsim calibrate``)

Nothing here imports torch or cuda-python at module import time, so the package imports on CPU-only CI.
"""
