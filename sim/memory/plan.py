"""The plan type: the seam between a memory policy and whoever executes it.

A policy (``sim.memory``) decides *which* pages to map or unmap and returns a :class:`Plan`; the simulator
charges modelled latency for it, the hardware backend (``hwbackend``) performs it with real CUDA VMM
calls. Both sides consume the very same objects.

Virtual layout on one worker (vAttention, domain.md "Mechanism")::

    sub-tensor t (t = 0..2N'-1: K of layer 0..N'-1, then V of layer 0..N'-1), shape [B, L_max, H', D]

    base_t ─┬─ slot 0: page 0 | page 1 | ... | page P-1 ─┐  slot_stride_bytes = P * G
            ├─ slot 1: page 0 | page 1 | ...             │
            ...                                          │
            └─ slot B-1                                  ┘

A *page group* is page ``p`` of one slot in all 2N' sub-tensors: ``MapOp(slot, first_page, num_pages)``
therefore means ``num_pages * 2N'`` physical pages of ``G`` bytes mapped at virtual address
``base_t + slot * slot_stride_bytes + page * G`` for every sub-tensor ``t`` and page in
``[first_page, first_page + num_pages)``. Pages of a slot are always mapped as a prefix ``0..k-1``.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MapOp:
    """Map page groups ``[first_page, first_page + num_pages)`` of ``slot`` (in every sub-tensor)."""

    slot: int
    first_page: int
    num_pages: int
    group: int = 0       # layer group (sim.memory.hybrid); 0 = the only group of a non-hybrid model

    def __post_init__(self) -> None:
        if self.slot < 0 or self.first_page < 0 or self.num_pages < 1 or self.group < 0:
            raise ValueError(f"invalid MapOp {self}")


@dataclass(frozen=True, slots=True)
class UnmapOp:
    """Unmap page groups ``[first_page, first_page + num_pages)`` of ``slot``; handles go back to the pool."""

    slot: int
    first_page: int
    num_pages: int
    group: int = 0       # layer group, as for MapOp

    def __post_init__(self) -> None:
        if self.slot < 0 or self.first_page < 0 or self.num_pages < 1 or self.group < 0:
            raise ValueError(f"invalid UnmapOp {self}")


@dataclass(frozen=True, slots=True)
class Plan:
    """What one policy decision asks the executor to do, in order: all ``unmaps`` first, then ``maps``.

    Unmaps come first so that the handles they return can back the maps of the same plan.
    """

    maps: tuple[MapOp, ...] = ()
    unmaps: tuple[UnmapOp, ...] = ()

    @property
    def num_page_groups_mapped(self) -> int:
        """Page groups this plan maps (multiply by 2N' for physical pages)."""
        return sum(op.num_pages for op in self.maps)

    @property
    def num_page_groups_unmapped(self) -> int:
        """Page groups this plan unmaps."""
        return sum(op.num_pages for op in self.unmaps)

    def __bool__(self) -> bool:
        return bool(self.maps or self.unmaps)


EMPTY_PLAN = Plan()
