"""Eviction policies of the HBM prefix cache (``prefix_evict=`` policy key).

Each policy picks the next victims among the cache entries that no slot maps
(:attr:`PrefixCachingPolicy._unmapped`, least recently used first: a released slot's entries are appended tail
first, so a chain's last page is the least recently used of its pages). An entry's *parent* is the page before
it in its chain (page ``p - 1`` of the same block prefix); ``_children[key]`` counts cached entries whose
parent is ``key``.

* ``lru`` (default): vLLM v1's block LRU. ``BlockPool.get_new_blocks`` pops the head of the free-block queue,
  and ``SingleTypeKVCacheManager.free`` / ``BlockPool.free_blocks`` append a finished request's blocks in
  reverse order (``vllm/v1/core/single_type_kv_cache_manager.py``, ``vllm/v1/core/block_pool.py``): the
  least recently used entry goes first even when it is an interior page whose descendants stay cached (they
  are then unreachable: lookups stop at the first miss). The queue holds never-cached free blocks too, so a
  map takes the oldest of a free page and an entry (``sim.memory.free_queue.FreeQueue``); the functions here pick
  victims when a step must evict beyond that (idle slots' reclamation, the low watermark).
* ``radix-leaf``: SGLang's RadixCache (``python/sglang/srt/mem_cache/radix_cache.py``: ``evict`` collects the
  leaves with ``lock_ref == 0`` in a heap keyed by ``last_access_time`` and pops the least recently used;
  a parent becomes a candidate once its last child is gone). Only entries with no cached child are evicted,
  least recently used first, so a cached chain never loses an interior page.
* ``page``: page-aware (kvsim's own, for small cache pages carved out of 2 MiB physical pages): the LRU victim
  is evicted with its unmapped ancestors inside the same 2 MiB region of its chain (``pages_per_region``
  consecutive cache pages, stopping at a branch), so a whole physical page is given back rather than
  scattered blocks of several (vAttention, Prabhu et al., ASPLOS'25, maps and frees physical memory in whole
  pages; 2 MiB is the driver's allocation granularity). With 2 MiB cache pages the region is one page and this
  is ``lru``.
"""
from __future__ import annotations

EVICTION_POLICIES = ("lru", "radix-leaf", "page")


def lru_victims(policy) -> list[tuple]:
    """The least recently used unmapped entry (vLLM v1)."""
    key, _ = policy._unmapped.popitem(last=False)
    return [key]


def radix_leaf_victims(policy) -> list[tuple]:
    """The least recently used unmapped entry without cached children (SGLang); the LRU entry if none (cannot
    happen while every slot maps a contiguous chain prefix: the deepest unmapped entry is a leaf)."""
    children = policy._children
    for key in policy._unmapped:
        if not children.get(key):
            del policy._unmapped[key]
            return [key]
    return lru_victims(policy)


def page_victims(policy) -> list[tuple]:
    """The LRU entry and its unmapped ancestors in the same 2 MiB region of its chain, while each ancestor has
    this chain as its only cached child."""
    key, _ = policy._unmapped.popitem(last=False)
    victims = [key]
    region = policy.pages_per_region
    if region <= 1:
        return victims
    first_page = key[0] // region * region
    parent = policy._parent.get(key)
    while (parent is not None and parent[0] >= first_page and parent in policy._unmapped
           and policy._children.get(parent, 0) == 1):
        del policy._unmapped[parent]
        victims.append(parent)
        parent = policy._parent.get(parent)
    return victims


VICTIMS = {"lru": lru_victims, "radix-leaf": radix_leaf_victims, "page": page_victims}
"""Policy name -> function of the prefix policy returning the next victims (already taken off ``_unmapped``)."""

__all__ = ["EVICTION_POLICIES", "VICTIMS", "lru_victims", "page_victims", "radix_leaf_victims"]
