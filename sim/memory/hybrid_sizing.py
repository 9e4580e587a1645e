"""Sizes of window-aware allocation: the pool's unit, each group's units per page group, the per-slot state
reservation and capacity figures (the rules: :mod:`sim.memory.layer_groups`, docs/hybrid.md)."""
from __future__ import annotations

from dataclasses import dataclass

from sim.memory.layer_groups import (LayerGroup, group_figures, paged_block_tokens, paged_group_size,
                                     paged_kv_groups)

WINDOW_ALLOC_MODES = {"vattention": ("off", "unmap", "recycle"), "paged": ("off", "free"), "static": ("off", "reserve")}
"""``window_alloc`` values each policy accepts (``SimConfig.window_alloc``; policy key ``window=``)."""


def window_alloc_error(config) -> str:
    """Why ``config`` (a :class:`sim.setup.config.SimConfig`) cannot use its ``window_alloc``, or ``""``."""
    modes = WINDOW_ALLOC_MODES.get(config.policy, ("off",))
    if config.window_alloc not in modes:
        return f"window={config.window_alloc!r} is not a {config.policy} mode; choose one of {', '.join(modes)}"
    if config.window_alloc == "off":
        return ""
    if config.prefix_caching:
        prefix_error = _prefix_error(config)
        if prefix_error:
            return prefix_error
    for refused, why in ((config.kv_layout != "per-layer", "the cross-layer layout"),
                         (config.pp > 1, "pipeline parallelism"), (config.zero_on_reuse != "off", "zero-on-reuse")):
        if refused:
            return f"window={config.window_alloc}: window-aware allocation does not combine with {why} yet (docs/hybrid.md)"
    return ""


def _prefix_error(config) -> str:
    """Why prefix caching cannot run with ``config``'s window-aware allocation, or ``""``: paged only (vLLM v1's
    hybrid manager, :mod:`sim.memory.hybrid_prefix`), full and sliding groups only, LRU eviction in HBM only."""
    where = f"window={config.window_alloc}: prefix caching with window-aware allocation"
    if config.policy != "paged":
        return f"{where} is modelled for paged (paged:window=free,prefix=on) only, not {config.policy} (docs/hybrid.md)"
    for group in config.layer_groups:
        if group.kind in ("chunked", "linear"):
            manager = "ChunkedLocalAttentionManager" if group.kind == "chunked" else "MambaManager"
            return (f"{where}: {config.model_spec.name} has a {group.kind} group ({group.num_layers} layers), whose "
                    f"prefix-cache rule (vLLM's {manager}) is not modelled; only full and sliding groups are "
                    "(docs/hybrid.md)")
    if config.kv_tiers or config.prefix_evict != "lru":
        return f"{where} keeps vLLM's free queue in HBM: no KV tiers, prefix_evict=lru only (docs/hybrid.md)"
    return ""


def static_reserved_tokens(group: LayerGroup, max_len_tokens: int, block_tokens: int) -> int:
    """Tokens static reservation (``static:max_len=N,window=reserve``) sets aside for one request in each layer
    of ``group`` at admission (docs/hybrid.md):

    * full: ``max_len`` (Orca / FasterTransformer's one reservation of the longest request);
    * sliding / chunked: the window (or chunk) W plus one block, in whole blocks of ``block_tokens``:
      ``min(max_len, (ceil(W / b) + 1) b)``. A window of W tokens written into a ring of b-token blocks straddles
      one block boundary more than it spans, the rule of vAttention's window unmap (``ceil(W / p) + 1`` pages,
      :meth:`LayerGroup.max_pages_held`) with vLLM's default block (16 tokens) as the page;
    * linear (Mamba / linear attention): 0 tokens (its fixed state per request is added in bytes).

    Raises:
        ValueError: ``max_len_tokens`` or ``block_tokens`` below 1.
    """
    if max_len_tokens < 1 or block_tokens < 1:
        raise ValueError(f"max_len_tokens={max_len_tokens}, block_tokens={block_tokens}: both must be >= 1")
    if group.kind == "full":
        return max_len_tokens
    if group.kind in ("sliding", "chunked"):
        return min(max_len_tokens, (-(-group.window_tokens // block_tokens) + 1) * block_tokens)
    return 0


@dataclass(frozen=True)
class HybridSizing:
    """Units of one configuration's window-aware pool.

    Attributes:
        groups: the layer groups (per worker).
        unit_bytes: bytes of one pool unit (vAttention: a K and a V page of one layer, ``2 G``, MLA ``G``; paged:
            one vLLM block of the common page size).
        group_units: units one page group of each group costs (vAttention linear groups: 0, their state is
            reserved at start-up).
        group_sub_tensors: VMM pages one page group maps, for each group with units (vAttention; paged: 0).
        state_reserved_bytes: linear state reserved at start-up for every slot (vAttention).
        paged_block_tokens: the paged block size in force (raised for Mamba models), 0 for vAttention.
        paged_group_size: vLLM's layers per KV-cache group, 0 for vAttention.
        static_reserved_tokens: static reservation: the tokens each group reserves per layer and request
            (:func:`static_reserved_tokens`; the unit is one request's reservation over every group, its state
            included); empty for the other policies.
    """

    groups: tuple[LayerGroup, ...]
    unit_bytes: int
    group_units: tuple[int, ...]
    group_sub_tensors: tuple[int, ...]
    state_reserved_bytes: int
    paged_block_tokens: int = 0
    paged_group_size: int = 0
    static_reserved_tokens: tuple[int, ...] = ()

    @classmethod
    def of(cls, config) -> "HybridSizing":
        groups = config.layer_groups
        spec = config.model_spec
        if config.policy == "static":
            reserved = tuple(static_reserved_tokens(g, config.tokens_per_page, config.block_size_tokens) for g in groups)
            unit = sum(t * g.kv_bytes_per_token + g.state_bytes_per_request for g, t in zip(groups, reserved))
            return cls(groups, unit, tuple(1 for _ in groups), tuple(0 for _ in groups), 0,
                       static_reserved_tokens=reserved)
        if config.policy == "paged":
            size = paged_group_size(groups)
            block = paged_block_tokens(groups, config.block_size_tokens, size)
            attention = [g for g in groups if g.grows]
            unit = (size * block * attention[0].kv_bytes_per_token_per_layer if attention
                    else size * groups[0].state_bytes_per_request_per_layer)
            units = tuple(paged_kv_groups(g, size) for g in groups)
            return cls(groups, unit, units, tuple(0 for _ in units), 0, block, size)
        per_layer_pages = 1 if spec.uses_mla else 2
        units = tuple(g.num_layers if g.grows else 0 for g in groups)
        tensors = tuple(per_layer_pages * g.num_layers for g in groups if g.grows)
        state = config.max_batch_slots * sum(g.state_bytes_per_request for g in groups)
        return cls(groups, per_layer_pages * config.page_size_bytes, units, tensors, state)

    def units_per_request(self, tokens: int, tokens_per_page: int) -> int:
        """Units one decoding request of ``tokens`` tokens holds at most (window groups capped at their
        window's pages, linear groups one block each for paged; static: one reservation)."""
        if self.static_reserved_tokens:
            return 1
        total = 0
        for group, units in zip(self.groups, self.group_units):
            pages = group.max_pages_held(tokens, tokens_per_page) if group.grows else 1
            total += units * pages
        return total

    def figures(self) -> dict:
        """Per-group sizes and the unit, for ``config.json``."""
        return {"groups": group_figures(self.groups), "unit_bytes": self.unit_bytes,
                "group_units": list(self.group_units), "state_reserved_bytes": self.state_reserved_bytes,
                "paged_block_tokens": self.paged_block_tokens, "paged_group_size": self.paged_group_size,
                **({"static_reserved_tokens": list(self.static_reserved_tokens),
                    "static_reserved_bytes": [t * g.kv_bytes_per_token + g.state_bytes_per_request
                                              for g, t in zip(self.groups, self.static_reserved_tokens)]}
                   if self.static_reserved_tokens else {})}
