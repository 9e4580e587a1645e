"""CUDA virtual memory: the driver and what executes policy plans on it.

    driver       checked, timed wrapper over ``cuda.bindings.driver`` VMM calls (:class:`CudaVmmDriver`)
    emulated     the same interface with strict semantics and no GPU (:class:`EmulatedVmmDriver`)
    transaction  undo logs for multi-step driver sequences
    kvcache      2N' reserved K/V tensors, a physical handle pool, page groups mapped per slot (:class:`KVCache`)
    tensors      torch tensors ``[B, L_max, H', D]`` over the reserved virtual memory (DLPack)
    executor     applies :class:`sim.memory.VAttentionPolicy` plans; background mapper thread (:class:`Executor`)
    tp, tp_worker  one policy over several workers' executors, two-phase steps with rollback
"""
