"""Host tensors over reserved-but-uncommitted memory: the CPU stand-in for GPU-backed KV tensors.

The emulated replay (``--device cpu``) needs K/V tensors of the layout's full virtual size,
``[slots, max_tokens_per_slot, heads, head_dim]`` per sub-tensor, of which a run touches only what its
requests write: on the GPU that is ``cuMemAddressReserve`` plus pages mapped on demand. On the host,
``torch.empty`` of that size is *committed* memory (a 7B shape at 16 slots x 32K tokens is ~34 GB), which
Linux charges to the process: a later ``fork`` of it (a process pool, Ray, ``subprocess``) is refused with
``ENOMEM`` on a machine with less RAM than that, although almost none of it was ever written (CI, 2026-12-02:
VmData 34 GB after one CPU replay on a 24 GiB runner, then every forking test failed).

:func:`reserved_host_tensor` maps the bytes with ``MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE``: pages are
zero until written, committed on first write, and the mapping is not charged to the commit limit under the
default heuristic overcommit (``vm.overcommit_memory`` 0 or 1; Linux ``Documentation/mm/overcommit-accounting``).
The tensor owns the mapping: it is unmapped when the last view of the tensor is gone.
"""
from __future__ import annotations

import math
import mmap
import sys
from typing import Any

#: ``MAP_NORESERVE`` of Linux (``<bits/mman-linux.h>``: 0x4000 on every Linux architecture); Python's mmap
#: module exports it only from 3.13, and other systems have no equivalent (0: an ordinary mapping).
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


def reserved_host_tensor(shape: tuple[int, ...], dtype: Any = None) -> Any:
    """A zero-filled CPU tensor of ``shape`` whose pages are committed only when written.

    Args:
        shape: the tensor's shape (elements), e.g. ``(slots, max_tokens_per_slot, heads, head_dim)``.
        dtype: a torch dtype (default ``torch.float32``).

    Returns:
        A contiguous ``torch.Tensor`` over a private anonymous mapping of ``prod(shape) * element_size``
        bytes; it keeps the mapping alive.

    Raises:
        ValueError: if a dimension is negative.
        OSError: if the address space cannot hold the mapping (``mmap`` fails).
    """
    import torch

    dtype = torch.float32 if dtype is None else dtype
    if any(d < 0 for d in shape):
        raise ValueError(f"reserved_host_tensor: negative dimension in shape {shape}")
    numel = math.prod(shape)
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    size_bytes = numel * torch.empty((), dtype=dtype).element_size()
    buffer = mmap.mmap(-1, size_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
    # frombuffer holds a reference to the mmap object, so the mapping lives as long as the tensor.
    return torch.frombuffer(buffer, dtype=dtype, count=numel).view(shape)
