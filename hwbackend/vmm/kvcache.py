"""The KV cache over reserved virtual memory: 2N' reservations, a pool of physical handles, page groups
mapped and unmapped per slot as transactions (domain.md "Mechanism"; ``sim/memory/plan.py`` for the layout).

Virtual layout (one reservation per sub-tensor ``t``; K of layers 0..N'-1, then V of layers 0..N'-1)::

    base_t + slot * slot_stride_bytes + page * page_size_bytes
    |<- slot 0: page 0 | page 1 | ... | page P-1 ->|<- slot 1 ... ->| ... |<- slot B-1 ->|
    reservation size = B * slot_stride_bytes,  slot_stride_bytes = P * G

A page group is page ``p`` of slot ``s`` in all 2N' reservations, so mapping one takes 2N' handles of
``G`` bytes from the pool. :meth:`KVCache.apply` performs a whole :class:`sim.memory.plan.Plan` as one
transaction: if any call fails (say the 40th ``cuMemMap``), every map done so far is unmapped, every
unmap redone, every handle returned, and the error re-raised: pool and mappings are as before.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hwbackend.vmm.driver import VmmDriver
from hwbackend.vmm.transaction import Transaction
from sim.memory.plan import MapOp, Plan, UnmapOp

KV_LAYOUTS = ("per-layer", "cross-layer")


@dataclass(frozen=True)
class KVCacheLayout:
    """Sizes of one worker's vAttention cache.

    Attributes:
        num_sub_tensors: 2N', per-layer K and V tensors.
        num_slots: B, batch rows of every tensor.
        max_pages_per_slot: P, pages covering one slot's ``L_max`` tokens in one sub-tensor.
        page_size_bytes: G, one page of one sub-tensor (a multiple of the driver granularity).
        num_kv_heads: H', KV heads per worker (tensor shape only).
        head_dim: D, elements per head (tensor shape only).
        dtype_bytes: bytes per element (2 for bf16).
        layers_per_sub_tensor: 1 for the per-layer layout (vAttention: 2N' tensors ``[B, L_max, H', D]``);
            N' for the cross-layer layout (one K and one V tensor ``[B, L_max, N', H', D]``,
            ``num_sub_tensors`` = 2): a page then holds every layer of a token range (issue 10).
    """

    num_sub_tensors: int
    num_slots: int
    max_pages_per_slot: int
    page_size_bytes: int
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype_bytes: int = 2
    layers_per_sub_tensor: int = 1

    def __post_init__(self) -> None:
        for name in ("num_sub_tensors", "num_slots", "max_pages_per_slot", "page_size_bytes",
                     "num_kv_heads", "head_dim", "dtype_bytes", "layers_per_sub_tensor"):
            if getattr(self, name) < 1:
                raise ValueError(f"KVCacheLayout.{name} must be >= 1, got {getattr(self, name)}")
        if self.page_size_bytes % self.bytes_per_token:
            raise ValueError(f"page_size_bytes={self.page_size_bytes} is not a multiple of the "
                             f"{self.bytes_per_token} bytes one token takes in a sub-tensor")

    @classmethod
    def for_model(cls, model: Any, num_slots: int, max_context_tokens: int, page_size_bytes: int,
                  tp: int = 1, kv_layout: str = "per-layer") -> "KVCacheLayout":
        """Layout for a :class:`sim.setup.catalog.ModelSpec` on one of ``tp`` workers.

        ``kv_layout``: ``per-layer`` (2N' sub-tensors) or ``cross-layer`` (2 sub-tensors holding all N'
        layers; ``sim.setup.config.SimConfig.kv_layout``).
        """
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout {kv_layout!r}: choose one of {', '.join(KV_LAYOUTS)}")
        layers = model.num_layers if kv_layout == "cross-layer" else 1
        per_token = model.sub_tensor_bytes_per_token(tp) * layers
        tokens_per_page = page_size_bytes // per_token
        if tokens_per_page < 1:
            raise ValueError(f"page_size_bytes={page_size_bytes} holds no token of {model.name} ({per_token} B)")
        return cls(num_sub_tensors=2 if kv_layout == "cross-layer" else model.num_sub_tensors(), num_slots=num_slots,
                   max_pages_per_slot=-(-max_context_tokens // tokens_per_page), page_size_bytes=page_size_bytes,
                   num_kv_heads=model.kv_heads_per_worker(tp), head_dim=model.head_dim,
                   dtype_bytes=model.dtype_bytes, layers_per_sub_tensor=layers)

    @property
    def kv_layout(self) -> str:
        """``per-layer`` or ``cross-layer`` (``layers_per_sub_tensor > 1``)."""
        return "cross-layer" if self.layers_per_sub_tensor > 1 else "per-layer"

    @property
    def num_layers(self) -> int:
        """N', layers held by this worker's cache (``num_sub_tensors / 2`` per-layer)."""
        return self.layers_per_sub_tensor if self.layers_per_sub_tensor > 1 else self.num_sub_tensors // 2

    @property
    def layer_bytes_per_token(self) -> int:
        """Bytes one token of one layer takes in K (or V): ``H' * D * P``."""
        return self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token takes in one sub-tensor: ``H' * D * P`` (times N' in the cross-layer layout)."""
        return self.layers_per_sub_tensor * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def tokens_per_page(self) -> int:
        """Tokens one page of one sub-tensor holds."""
        return self.page_size_bytes // self.bytes_per_token

    @property
    def max_tokens_per_slot(self) -> int:
        """L_max, tokens one slot can hold."""
        return self.max_pages_per_slot * self.tokens_per_page

    @property
    def slot_stride_bytes(self) -> int:
        """Distance between two slots in one reservation: ``P * G``."""
        return self.max_pages_per_slot * self.page_size_bytes

    @property
    def reservation_bytes(self) -> int:
        """Virtual size of one sub-tensor: ``B * P * G``."""
        return self.num_slots * self.slot_stride_bytes


class KVCache:
    """2N' virtual tensors backed page group by page group from a pool of physical handles.

    Args:
        driver: a :class:`~hwbackend.vmm.driver.VmmDriver` (real or emulated).
        layout: sizes.
        pool_page_groups: physical page groups of the budget; ``pool_page_groups * 2N'`` handles.
        create_on_demand: create handles when first needed instead of at :meth:`open` (roughly doubles
            growth latency, domain.md); they are still kept in the pool until :meth:`close`.

    Use as a context manager (``with KVCache(...) as cache``) so that :meth:`close` always runs.
    """

    def __init__(self, driver: VmmDriver, layout: KVCacheLayout, pool_page_groups: int,
                 create_on_demand: bool = False):
        if layout.page_size_bytes % driver.granularity_bytes:
            raise ValueError(f"page_size_bytes={layout.page_size_bytes} is not a multiple of the driver "
                             f"granularity {driver.granularity_bytes}")
        if pool_page_groups < 1:
            raise ValueError(f"pool_page_groups must be >= 1, got {pool_page_groups}")
        self.driver, self.layout = driver, layout
        self.pool_page_groups, self.create_on_demand = pool_page_groups, create_on_demand
        self.bases: list[int] = []
        self._free_handles: list[Any] = []
        self._num_handles = 0
        self._page_handles: dict[tuple[int, int], list[Any]] = {}  # (slot, page) -> one handle per sub-tensor
        self._lock = threading.RLock()

    # ---- lifetime ------------------------------------------------------------------------------------
    def open(self) -> "KVCache":
        """Reserve the 2N' ranges and (unless on demand) create the whole pool; all or nothing."""
        with self._lock, Transaction() as tx:
            for _ in range(self.layout.num_sub_tensors):
                base = self.driver.reserve(self.layout.reservation_bytes, self.layout.page_size_bytes)
                tx.on_rollback(self.driver.free_address, base, self.layout.reservation_bytes)
                self.bases.append(base)
                tx.on_rollback(self.bases.pop)
            if not self.create_on_demand:
                for _ in range(self.pool_page_groups * self.layout.num_sub_tensors):
                    self._free_handles.append(self._create_handle(tx))
                    tx.on_rollback(self._free_handles.pop)
        return self

    def _create_handle(self, tx: Transaction) -> Any:
        handle = self.driver.create(self.layout.page_size_bytes)
        tx.on_rollback(self.driver.release, handle)
        self._num_handles += 1
        tx.on_rollback(self._forget_handle)
        return handle

    def _forget_handle(self) -> None:
        self._num_handles -= 1

    def close(self) -> None:
        """Unmap every page, release every handle, free every reservation (best effort, idempotent).

        Raises:
            VmmError: the first failure, after every other step was still attempted.
        """
        errors: list[Exception] = []
        with self._lock:
            for (slot, page), handles in list(self._page_handles.items()):
                for t, handle in enumerate(handles):
                    if _attempt(errors, self.driver.unmap, self.page_va(t, slot, page), self.layout.page_size_bytes):
                        self._free_handles.append(handle)
                del self._page_handles[(slot, page)]
            while self._free_handles:
                if _attempt(errors, self.driver.release, self._free_handles.pop()):
                    self._num_handles -= 1
            while self.bases:
                _attempt(errors, self.driver.free_address, self.bases.pop(), self.layout.reservation_bytes)
        if errors:
            for other in errors[1:]:
                errors[0].add_note(f"teardown also failed: {other!r}")
            raise errors[0]

    def __enter__(self) -> "KVCache":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- queries -------------------------------------------------------------------------------------
    def page_va(self, sub_tensor: int, slot: int, page: int) -> int:
        """Virtual address of page ``page`` of ``slot`` in sub-tensor ``sub_tensor``."""
        return self.bases[sub_tensor] + slot * self.layout.slot_stride_bytes + page * self.layout.page_size_bytes

    def mapped_pages(self, slot: int) -> list[int]:
        """Pages of ``slot`` mapped now, ascending."""
        with self._lock:
            return sorted(p for s, p in self._page_handles if s == slot)

    @property
    def num_mapped_page_groups(self) -> int:
        """Page groups mapped on any slot."""
        return len(self._page_handles)

    @property
    def num_free_page_groups(self) -> int:
        """Page groups the pool can still back (handles free now, plus those creatable on demand)."""
        per_group = self.layout.num_sub_tensors
        creatable = self.pool_page_groups * per_group - self._num_handles if self.create_on_demand else 0
        return (len(self._free_handles) + creatable) // per_group

    @property
    def num_handles(self) -> int:
        """Physical handles alive (pooled or mapped)."""
        return self._num_handles

    # ---- applying plans ------------------------------------------------------------------------------
    def apply(self, plan: Plan) -> None:
        """Perform ``plan`` (unmaps first, then maps) as one transaction.

        Raises:
            VmmError: a driver call failed; everything this call did was undone first.
            RuntimeError: the plan contradicts the mapped state (double map, unmap of an unmapped page,
                pool exhausted): the policy and this cache disagree.
            ValueError: a slot or page outside the layout.
        """
        with self._lock, Transaction() as tx:
            for unmap_op in plan.unmaps:
                self._unmap_pages(tx, unmap_op)
            for map_op in plan.maps:
                self._map_pages(tx, map_op)

    def _pages(self, op: MapOp | UnmapOp) -> range:
        if op.slot >= self.layout.num_slots or op.first_page + op.num_pages > self.layout.max_pages_per_slot:
            raise ValueError(f"{op} lies outside the layout ({self.layout.num_slots} slots, "
                             f"{self.layout.max_pages_per_slot} pages per slot)")
        return range(op.first_page, op.first_page + op.num_pages)

    def _map_pages(self, tx: Transaction, op: MapOp) -> None:
        pages = self._pages(op)
        for page in pages:
            if (op.slot, page) in self._page_handles:
                raise RuntimeError(f"{op}: page {page} of slot {op.slot} is already mapped")
            self._page_handles[(op.slot, page)] = []
            tx.on_rollback(self._page_handles.pop, (op.slot, page))
        size_bytes = self.layout.page_size_bytes
        for t in range(self.layout.num_sub_tensors):
            for page in pages:
                handle = self._take_handle(tx)
                self.driver.map(self.page_va(t, op.slot, page), size_bytes, handle)
                tx.on_rollback(self.driver.unmap, self.page_va(t, op.slot, page), size_bytes)
                self._page_handles[(op.slot, page)].append(handle)
            # one set-access over the op's adjacent pages in this reservation (domain.md: batching pays there)
            self.driver.set_access(self.page_va(t, op.slot, op.first_page), size_bytes * op.num_pages)

    def _take_handle(self, tx: Transaction) -> Any:
        if self._free_handles:
            handle = self._free_handles.pop()
            tx.on_rollback(self._free_handles.append, handle)
            return handle
        if self.create_on_demand and self._num_handles < self.pool_page_groups * self.layout.num_sub_tensors:
            return self._create_handle(tx)  # a rollback releases it
        raise RuntimeError(f"page pool exhausted ({self.pool_page_groups} page groups)")

    def _unmap_pages(self, tx: Transaction, op: UnmapOp) -> None:
        size_bytes = self.layout.page_size_bytes
        for page in self._pages(op):
            handles = self._page_handles.get((op.slot, page))
            if handles is None:
                raise RuntimeError(f"{op}: page {page} of slot {op.slot} is not mapped")
            for t, handle in enumerate(handles):
                va = self.page_va(t, op.slot, page)
                self.driver.unmap(va, size_bytes)
                tx.on_rollback(self._remap, va, handle)
            del self._page_handles[(op.slot, page)]
            tx.on_rollback(self._page_handles.__setitem__, (op.slot, page), handles)
            self._return_handles(tx, handles)

    def _return_handles(self, tx: Transaction, handles: list) -> None:
        """Handles a page group no longer maps go back to the pool (overridden where handles are shared)."""
        self._free_handles.extend(handles)
        tx.on_rollback(_drop_last, self._free_handles, len(handles))

    def _remap(self, va: int, handle: Any) -> None:
        self.driver.map(va, self.layout.page_size_bytes, handle)
        self.driver.set_access(va, self.layout.page_size_bytes)

    def iter_mapped(self) -> Iterator[tuple[int, int]]:
        """(slot, page) pairs mapped now."""
        with self._lock:
            return iter(sorted(self._page_handles))


def _drop_last(items: list, count: int) -> None:
    del items[len(items) - count:]


def _attempt(errors: list[Exception], fn: Any, *args: Any) -> bool:
    """Call ``fn(*args)``; on failure remember the error and return False (teardown keeps going)."""
    try:
        fn(*args)
    except Exception as exc:
        errors.append(exc)
        return False
    return True
