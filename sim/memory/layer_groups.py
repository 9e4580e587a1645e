"""Layer groups of a hybrid model: per-group KV shapes and sizes, and the pool's accounting unit per policy.

A *group* is the set of layers that share one attention kind (vLLM's ``KVCacheSpec`` types,
vllm/v1/kv_cache_interface.py: ``FullAttentionSpec``, ``SlidingWindowSpec``, ``ChunkedLocalAttentionSpec``,
``MambaSpec``)::

    kind      holds per request at T tokens                      drops (vLLM get_num_skipped_tokens at C computed)
    full      T tokens                                           nothing
    sliding   the last W tokens                                  the first max(0, C - W + 1) tokens
    chunked   the tokens of the current chunk of size W          the first floor(C / W) * W tokens
    linear    a constant state (Mamba / linear attention)        -

Every attention group of one model has the same per-layer KV shape (``ModelSpec`` has one head layout), so
the same tokens per page; only the layer counts differ. The pool's accounting unit (docs/hybrid.md):

* ``vattention``: one **layer page** = the K page and the V page of one layer (``2 G`` bytes; MLA: ``G``). A page
  group of group g (one page in each of its ``2 N_g`` sub-tensors) costs ``N_g`` units; Mamba / linear state is
  one fixed allocation per slot made at start-up (``B x state bytes`` off the budget).
* ``paged``: one vLLM **block** of the common page size ``group_size x block_size x kv_bytes_per_token_per_layer``,
  where ``group_size`` is the fewest layers of any kind (the most when that is within 1.25x of the fewest) and
  each kind's layers form ``ceil(N_g / group_size)`` KV-cache groups (the last one padded), each taking one
  block per block of tokens (vllm/v1/core/kv_cache_utils.py ``_get_kv_cache_groups_uniform_page_size``);
  Mamba groups take one block per request, the attention block size raised to a multiple of 16 tokens whose
  page holds the Mamba state and the state padded to it
  (vllm/model_executor/models/config.py ``HybridAttentionMambaModelConfig.verify_and_update_config``).
"""
from __future__ import annotations

from dataclasses import dataclass

KINDS = ("full", "sliding", "chunked", "linear")


@dataclass(frozen=True)
class LayerGroup:
    """One kind of layer of a model, on one tensor-parallel worker.

    Attributes:
        kind: one of :data:`KINDS`.
        num_layers: layers of this kind.
        window_tokens: W, the sliding window or the attention chunk (0 for full and linear layers).
        kv_bytes_per_token_per_layer: K and V bytes one token adds to one layer (0 for linear layers).
        state_bytes_per_request_per_layer: the constant state of one request in one linear layer (0 otherwise).
    """

    kind: str
    num_layers: int
    window_tokens: int = 0
    kv_bytes_per_token_per_layer: int = 0
    state_bytes_per_request_per_layer: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.num_layers < 1:
            raise ValueError(f"invalid layer group {self}")
        if (self.kind in ("sliding", "chunked")) != (self.window_tokens > 0):
            raise ValueError(f"{self.kind} layers need window_tokens > 0 exactly when windowed, got {self}")

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one held token takes in all layers of the group."""
        return self.num_layers * self.kv_bytes_per_token_per_layer

    @property
    def state_bytes_per_request(self) -> int:
        """Constant state bytes of one request in all layers of the group."""
        return self.num_layers * self.state_bytes_per_request_per_layer

    @property
    def grows(self) -> bool:
        """Whether the group's memory grows with tokens (attention) rather than being one state per request."""
        return self.kind != "linear"

    def held_tokens(self, tokens: int) -> int:
        """Tokens whose KV a request of ``tokens`` tokens must keep for its next token (the decode rule)."""
        if self.kind == "full":
            return tokens
        if self.kind == "sliding":
            return min(tokens, self.window_tokens)
        if self.kind == "chunked":
            return (tokens - 1) % self.window_tokens + 1 if tokens else 0
        return 0

    def skipped_tokens(self, computed_tokens: int) -> int:
        """Leading tokens no later query reads once ``computed_tokens`` are computed (vLLM v1
        ``SlidingWindowManager`` / ``ChunkedLocalAttentionManager.get_num_skipped_tokens``,
        vllm/v1/core/single_type_kv_cache_manager.py)."""
        if self.kind == "sliding":
            return max(0, computed_tokens - self.window_tokens + 1)
        if self.kind == "chunked":
            return computed_tokens // self.window_tokens * self.window_tokens
        return 0

    def max_pages_held(self, tokens: int, tokens_per_page: int) -> int:
        """Pages (of ``tokens_per_page`` tokens) a decoding request of ``tokens`` tokens holds at most: full
        ``ceil(T / p)``; sliding ``min(ceil(T / p), ceil(W / p) + 1)`` (the window straddles one page boundary
        more than it spans); chunked ``min(ceil(T / p), ceil(W / p))`` when ``p`` divides ``W``, else one more;
        linear 0."""
        pages = -(-tokens // tokens_per_page)
        if self.kind == "sliding":
            return min(pages, -(-self.window_tokens // tokens_per_page) + 1)
        if self.kind == "chunked":
            extra = 0 if self.window_tokens % tokens_per_page == 0 else 1
            return min(pages, -(-self.window_tokens // tokens_per_page) + extra)
        return pages if self.kind == "full" else 0


def layer_groups(spec, tp: int = 1) -> tuple[LayerGroup, ...]:
    """The layer groups of a :class:`sim.setup.specs.ModelSpec` on one of ``tp`` workers, in :data:`KINDS` order, without
    empty groups. Sliding and chunked layers keep their windows; linear layers' state is divided by ``tp`` (heads
    and channels are sharded).

    Raises:
        CatalogError: when the kinds add up to more layers than the model has (through ``spec.check_tp`` as well).
    """
    from sim.setup.specs import CatalogError     # sim.setup.specs is below sim.memory; imported here to keep this module light
    per_layer = spec.kv_bytes_per_token_per_layer(tp)
    sliding = spec.sliding_window_layers if spec.sliding_window_tokens else 0
    chunked = spec.chunked_attention_layers if spec.chunked_attention_tokens else 0
    full = spec.num_layers - sliding - chunked - spec.linear_layers
    if full < 0:
        raise CatalogError(f"{spec.name}: {sliding} sliding + {chunked} chunked + {spec.linear_layers} linear layers "
                           f"exceed its {spec.num_layers} layers")
    groups = [LayerGroup("full", full, 0, per_layer) if full else None,
              LayerGroup("sliding", sliding, spec.sliding_window_tokens, per_layer) if sliding else None,
              LayerGroup("chunked", chunked, spec.chunked_attention_tokens, per_layer) if chunked else None,
              LayerGroup("linear", spec.linear_layers, 0, 0, spec.linear_state_bytes_per_layer // tp)
              if spec.linear_layers else None]
    return tuple(g for g in groups if g is not None)


def is_hybrid(groups: tuple[LayerGroup, ...]) -> bool:
    """Whether the groups differ from one full-attention group (the case every policy handled before)."""
    return not (len(groups) == 1 and groups[0].kind == "full")


def kv_bytes_for_tokens(groups: tuple[LayerGroup, ...], tokens: int) -> int:
    """Bytes one request of ``tokens`` tokens needs at least: each group's held tokens x its bytes per token,
    plus the linear groups' state."""
    return sum(g.held_tokens(tokens) * g.kv_bytes_per_token + g.state_bytes_per_request for g in groups)


def group_figures(groups: tuple[LayerGroup, ...]) -> list[dict]:
    """Per-group sizes for ``config.json`` / ``summary.json`` (per worker)."""
    return [{"kind": g.kind, "layers": g.num_layers, "window_tokens": g.window_tokens,
             "kv_bytes_per_token_per_worker": g.kv_bytes_per_token,
             "state_bytes_per_request_per_worker": g.state_bytes_per_request} for g in groups]


def paged_group_size(groups: tuple[LayerGroup, ...]) -> int:
    """vLLM's layers per KV-cache group: the fewest layers of any kind, or the most when the most are below
    1.25x the fewest (fewer padding layers) (kv_cache_utils.py ``_get_kv_cache_groups_uniform_page_size``)."""
    counts = [g.num_layers for g in groups]
    fewest, most = min(counts), max(counts)
    return most if most < fewest * 1.25 else fewest


def paged_kv_groups(group: LayerGroup, group_size: int) -> int:
    """vLLM KV-cache groups (one block table each) the layers of ``group`` form: ``ceil(N_g / group_size)``."""
    return -(-group.num_layers // group_size)


def paged_block_tokens(groups: tuple[LayerGroup, ...], block_size_tokens: int, group_size: int) -> int:
    """The attention block size vLLM uses for a model with Mamba layers: the configured one, raised to the least
    multiple of 16 tokens whose page (``group_size`` layers) holds one Mamba group's state
    (``HybridAttentionMambaModelConfig.verify_and_update_config``); the configured one otherwise."""
    linear = [g for g in groups if g.kind == "linear"]
    attention = [g for g in groups if g.grows]
    if not linear or not attention:
        return block_size_tokens
    state_page_bytes = group_size * linear[0].state_bytes_per_request_per_layer
    per_token_page_bytes = group_size * attention[0].kv_bytes_per_token_per_layer
    needed = -(-state_page_bytes // per_token_page_bytes)
    return max(block_size_tokens, -(-needed // 16) * 16)
