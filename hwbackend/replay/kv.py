"""The replay's KV cache: the vAttention executor plus per-layer K/V views over the cache.

On CUDA the views are torch tensors over the reserved virtual memory (:func:`hwbackend.vmm.tensors.kv_tensors`),
backed page group by page group as the policy maps them. On CPU (tests, development) the emulated driver
does the mapping bookkeeping with the same executor and policy, and the views are ordinary host tensors.

Each view is ``[B * L_max, H', D]`` (flat rows, see :mod:`hwbackend.replay.model`); ``k[i]`` / ``v[i]`` belong to
layer ``i`` (sub-tensors ``i`` and ``N + i`` of the cache).
"""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from hwbackend.vmm.executor import Executor
from hwbackend.vmm.kvcache import KVCache, KVCacheLayout
from sim.setup.catalog import ModelSpec
from sim.memory import build_policy


@dataclass
class ReplayKV:
    """An open cache: ``executor`` (policy, cache, mapper thread), ``k`` / ``v`` flat views per layer."""

    executor: Executor
    k: list[Any]
    v: list[Any]
    slot_tokens: int
    driver: Any
    stack: ExitStack

    def close(self) -> None:
        """Stop the mapper, unmap and release everything (the K/V views too: a closed cache holds no memory)."""
        self.stack.close()
        self.k, self.v = [], []


def layout_for(config: Any, shape: ModelSpec) -> KVCacheLayout:
    """Cache layout for a :class:`sim.setup.config.SimConfig` and the decoder's shape.

    Raises:
        ValueError: if the shape's page holds a different number of tokens than the config's policy expects.
    """
    layout = KVCacheLayout(num_sub_tensors=shape.num_sub_tensors(), num_slots=config.max_batch_slots,
                           max_pages_per_slot=config.max_pages_per_slot, page_size_bytes=config.page_size_bytes,
                           num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim, dtype_bytes=2)
    if layout.tokens_per_page != config.tokens_per_page:
        raise ValueError(f"shape holds {layout.tokens_per_page} tokens per page, the policy expects "
                         f"{config.tokens_per_page}: use {config.model_spec.kv_heads_per_worker(config.tp)} KV heads "
                         f"of dimension {config.model_spec.head_dim}")
    return layout


def open_kv(config: Any, shape: ModelSpec, device: str) -> ReplayKV:
    """Open the policy's executor and K/V views on ``device`` (``cuda:N`` real VMM, ``cpu`` emulated).

    The policy is :func:`sim.memory.build_policy` of ``config`` (the simulator's); the pool holds
    ``config.pool_page_groups`` page groups; the mapper thread runs when ``config.has_async_mapper``.
    """
    import torch

    layout = layout_for(config, shape)
    stack = ExitStack()
    try:
        if device.startswith("cuda"):
            from hwbackend.vmm.driver import CudaVmmDriver
            from hwbackend.vmm.tensors import kv_tensors

            torch.cuda.init()
            driver = stack.enter_context(CudaVmmDriver(torch.device(device).index or 0))
            cache = KVCache(driver, layout, config.pool_page_groups, create_on_demand=config.create_on_demand)
            executor = stack.enter_context(Executor(build_policy(config), cache, background=config.has_async_mapper,
                                                    stream_handle=torch.cuda.current_stream().cuda_stream))
        else:
            from hwbackend.vmm.emulated import EmulatedVmmDriver

            capacity = config.pool_page_groups * layout.num_sub_tensors * layout.page_size_bytes
            driver = EmulatedVmmDriver(layout.page_size_bytes, capacity_bytes=capacity, va_limit_bytes=1 << 50)
            cache = KVCache(driver, layout, config.pool_page_groups, create_on_demand=config.create_on_demand)
            executor = stack.enter_context(Executor(build_policy(config), cache, background=config.has_async_mapper))
        return _replay_kv(executor, shape, device, driver, stack)
    except BaseException:
        stack.close()
        raise


def _replay_kv(executor: Executor, shape: ModelSpec, device: str, driver: Any, stack: ExitStack) -> ReplayKV:
    """The :class:`ReplayKV` of an open executor: per-layer flat K/V views over its cache (CUDA: the reserved
    virtual memory, :func:`hwbackend.vmm.tensors.kv_tensors`; CPU: host tensors whose pages are committed on
    write and not charged to the process, :func:`hwbackend.vmm.host.reserved_host_tensor`, so a later fork of
    the test process does not fail)."""
    import torch

    layout = executor.cache.layout
    if device.startswith("cuda"):
        from hwbackend.vmm.tensors import kv_tensors

        tensors = kv_tensors(executor.cache, torch.bfloat16, device)
    else:
        from hwbackend.vmm.host import reserved_host_tensor

        size = (layout.num_slots, layout.max_tokens_per_slot, layout.num_kv_heads, layout.head_dim)
        tensors = [reserved_host_tensor(size) for _ in range(layout.num_sub_tensors)]
    flat = [t.view(-1, layout.num_kv_heads, layout.head_dim) for t in tensors]
    n = shape.num_layers
    return ReplayKV(executor, flat[:n], flat[n:], layout.max_tokens_per_slot, driver, stack)



def open_tenant_kv(config: Any, shape: ModelSpec, device: str, driver: Any, policy: Any,
                   pool: Any = None, tenant: int = 0, condition: Any = None) -> ReplayKV:
    """One co-located tenant's cache on a driver shared with the other tenants (:mod:`hwbackend.replay.colocate`).

    Args:
        config: the tenant's :class:`sim.cluster.colocate.TenantConfig` (its ``pool_page_groups``: its static
            share, or its ceiling under elastic sharing).
        shape: the decoder's shape (its page must hold ``config.tokens_per_page`` tokens).
        device: ``cuda:N`` (real VMM, the driver's GPU) or ``cpu`` (emulated driver, host views).
        driver: the open driver every tenant shares (not closed by :meth:`ReplayKV.close`).
        policy: the tenant's policy (elastic: a :class:`sim.memory.shared_pool.SharedPoolPolicy`).
        pool: elastic sharing: the :class:`hwbackend.vmm.shared_pool.SharedHandlePool` the pages come from;
            None: a pool of the tenant's own (``config.pool_page_groups`` page groups, static sharing).
        tenant: the tenant's index in ``pool``.
        condition: the lock shared by every tenant's executor (:class:`hwbackend.vmm.executor.Executor`).

    Raises:
        ValueError: the shape's page holds another number of tokens than the policy's (:func:`layout_for`).
        VmmError: a reservation or handle the driver refuses.
    """
    import torch

    from hwbackend.vmm.shared_pool import TenantKVCache

    layout = layout_for(config, shape)
    stack = ExitStack()
    try:
        cache = (TenantKVCache(driver, layout, pool, tenant) if pool is not None else
                 KVCache(driver, layout, config.pool_page_groups, create_on_demand=config.create_on_demand))
        stream = torch.cuda.current_stream().cuda_stream if device.startswith("cuda") else 0
        executor = stack.enter_context(Executor(policy, cache, background=config.has_async_mapper,
                                                stream_handle=stream, condition=condition))
        return _replay_kv(executor, shape, device, driver, stack)
    except BaseException:
        stack.close()
        raise


ANCHOR_SLOT = 0
"""The slot :func:`pin_base_pages` keeps for itself (the first one a fresh policy hands out: ties go to the lowest
slot, ``VAttentionPolicy._best_fit``)."""


def pin_base_pages(kv: ReplayKV) -> int:
    """Keep the first page of every K/V tensor mapped for the whole run; returns the slot taken (0).

    Triton's launcher checks every tensor argument with ``cuPointerGetAttribute`` on its ``data_ptr()``
    (``triton/backends/nvidia/driver.py``, ``getPointer``: "Pointer argument (at N) cannot be accessed from Triton
    (cpu tensor?)"), and the base of every K/V tensor over the reservation is slot 0's first page: unmapped as soon
    as the policy reclaims slot 0 while other slots serve (found on the H200, 2026-12-02: the co-located replay's
    engine kernels failed once a 13 GiB pool ran short). The replay with engine kernels therefore takes slot 0 at
    open and maps its first page group for good: one slot and one page group fewer for requests than the
    simulator's configuration (1 of ``max_batch_slots`` slots; 1 of ``pool_page_groups`` groups).

    Raises:
        RuntimeError: the policy handed out another slot first (slots already taken) or cannot map the group.
    """
    slot = kv.executor.alloc_slot(1)
    if slot != ANCHOR_SLOT or not kv.executor.step({slot: 1}):
        if slot is not None:
            kv.executor.free_slot(slot, -1)
        raise RuntimeError(f"cannot keep the K/V tensors' first page mapped: the policy gave slot {slot}, not "
                           f"{ANCHOR_SLOT}, or could not map its first page group")
    return slot
