"""PyTorch tensors over reserved virtual memory, without copying and without asking the driver about the
pointer (an unmapped reservation has no pointer attributes to ask about).

A tensor is built from a DLPack capsule made here with :mod:`ctypes` (DLPack v0.8 ``DLManagedTensor``,
https://dmlc.github.io/dlpack/latest/c_api.html). ``torch.from_dlpack`` takes the device from the capsule,
so no ``cudaPointerGetAttributes`` runs, unlike the ``__cuda_array_interface__`` path, which lets
``at::from_blob`` infer the device from the pointer. The tensor does not own the memory: the KV cache
does; the capsule's deleter is a no-op. Only mapped ranges may be read or written.

Layout of each tensor (``hwbackend.vmm.kvcache``): contiguous ``[B, L_max, H', D]``, so slot ``s`` token ``i``
lives at ``base + s * slot_stride_bytes + i * H' * D * P``. With the cross-layer layout
(``layout.layers_per_sub_tensor = N' > 1``, issue 10) the two tensors are ``[B, L_max, N', H', D]``;
:func:`layer_views` gives the per-layer views of either layout.
"""
from __future__ import annotations

import ctypes
from typing import Any

_DL_CPU, _DL_CUDA = 1, 2
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT = 0, 1, 2, 4


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


@_DELETER
def _no_op_deleter(_managed: Any) -> None:
    """The memory belongs to the KV cache; nothing to free when the tensor dies."""


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)

_KEEP_ALIVE: list[Any] = []  # DLManagedTensor structs stay valid for the process (torch may read them late)


def _dl_dtype(torch: Any, dtype: Any) -> tuple[int, int]:
    table = {torch.bfloat16: (_DL_BFLOAT, 16), torch.float16: (_DL_FLOAT, 16), torch.float32: (_DL_FLOAT, 32),
             torch.int32: (_DL_INT, 32), torch.int16: (_DL_INT, 16), torch.uint8: (_DL_UINT, 8)}
    if dtype not in table:
        raise ValueError(f"unsupported dtype {dtype}; use one of {sorted(str(d) for d in table)}")
    return table[dtype]


def tensor_at(address: int, shape: tuple[int, ...], dtype: Any, device: str = "cuda:0") -> Any:
    """A contiguous torch tensor of ``shape`` over memory at ``address`` (not owned, not copied).

    Args:
        address: first byte (virtual address on the GPU, or a host address for ``device="cpu"``).
        shape: tensor shape in elements, e.g. ``(B, L_max, H, D)``.
        dtype: a torch dtype (bf16, fp16, fp32, int32, int16, uint8).
        device: ``"cuda:N"`` or ``"cpu"``.
    """
    import torch

    code, bits = _dl_dtype(torch, dtype)
    ndim = len(shape)
    strides = [1] * ndim
    for i in range(ndim - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    shape_arr, strides_arr = (ctypes.c_int64 * ndim)(*shape), (ctypes.c_int64 * ndim)(*strides)
    kind, _, index = device.partition(":")
    dl_device = _DLDevice(_DL_CUDA if kind == "cuda" else _DL_CPU, int(index or 0))
    managed = _DLManagedTensor()
    managed.dl_tensor = _DLTensor(ctypes.c_void_p(address), dl_device, ndim, _DLDataType(code, bits, 1),
                                  ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64)),
                                  ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64)), 0)
    managed.deleter = _no_op_deleter
    _KEEP_ALIVE.append((managed, shape_arr, strides_arr))
    capsule = _PyCapsule_New(ctypes.addressof(managed), b"dltensor", None)
    return torch.utils.dlpack.from_dlpack(capsule)


def kv_tensors(cache: Any, dtype: Any = None, device: str | None = None) -> list[Any]:
    """The 2N' tensors ``[B, L_max, H', D]`` of a :class:`hwbackend.vmm.kvcache.KVCache` (K tensors first).

    Args:
        cache: an open KV cache.
        dtype: torch dtype; defaults to bf16 (the element size must equal ``layout.dtype_bytes``).
        device: defaults to ``cuda:<driver.device_ordinal>``.
    """
    import torch

    dtype = torch.bfloat16 if dtype is None else dtype
    layout = cache.layout
    if torch.empty((), dtype=dtype).element_size() != layout.dtype_bytes:
        raise ValueError(f"dtype {dtype} does not have {layout.dtype_bytes} bytes per element")
    device = device or f"cuda:{cache.driver.device_ordinal}"
    shape = (layout.num_slots, layout.max_tokens_per_slot, layout.num_kv_heads, layout.head_dim)
    if getattr(layout, "layers_per_sub_tensor", 1) > 1:  # cross-layer: [B, L_max, N', H', D]
        shape = shape[:2] + (layout.layers_per_sub_tensor,) + shape[2:]
    return [tensor_at(base, shape, dtype, device) for base in cache.bases]


def layer_views(tensors: list[Any], flat: bool = False) -> tuple[list[Any], list[Any]]:
    """Per-layer K and V views of either layout (no copy): ``(k[layer], v[layer])``.

    Per-layer layout: the 2N' tensors themselves (K first). Cross-layer layout (two tensors
    ``[B, L_max, N', H', D]``): ``tensor[:, :, layer]``, a strided ``[B, L_max, H', D]`` view whose token
    stride is ``N' * H' * D`` elements (not contiguous). ``flat=True`` returns ``[B * L_max, H', D]`` views
    (the replay model's rows); merging B and L_max needs no copy in either layout.
    """
    if tensors[0].dim() == 5:
        if len(tensors) != 2:
            raise ValueError(f"a cross-layer cache has one K and one V tensor, got {len(tensors)}")
        k, v = ([t[:, :, layer] for layer in range(t.shape[2])] for t in tensors)
    else:
        n = len(tensors) // 2
        k, v = list(tensors[:n]), list(tensors[n:])
    if flat:
        k, v = ([x.flatten(0, 1) for x in views] for views in (k, v))
    return k, v
