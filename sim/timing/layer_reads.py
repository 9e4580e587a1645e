"""Attention reads per layer group of a hybrid model (issue 33): what the roofline's attention term reads and
computes when a model's layers are not all full attention.

The kernels read only the keys a query attends to, whatever the allocator keeps mapped: vLLM passes a sliding
layer's window to FlashAttention as ``window_size = (W - 1, 0)`` (``FlashAttentionImpl.__init__``,
vllm/v1/attention/backends/flash_attn.py: a query attends to itself and the ``W - 1`` keys before it), and
FlashAttention skips the key blocks left of every query's window (``n_block_min`` in its mainloop); chunked local
attention (Llama 4) runs each chunk as its own virtual sequence (``make_local_attention_virtual_batches``,
vllm/v1/attention/backends/utils.py), so a query attends to the keys of its own chunk up to itself; a Mamba /
linear-attention layer reads and writes its constant state once per sequence and iteration (the selective-state
update loads the state and stores it back). So for a chunk of ``q`` new tokens after ``c`` cached ones (query
positions ``p = c .. c + q - 1``), per layer::

    kind      cached keys read          (query, key) pairs = P(c + q) - P(c),  P(n) = sum_{p < n} keys(p)
    full      c                         keys(p) = p + 1
    sliding   min(c, W - 1)             keys(p) = min(p + 1, W)
    chunked   c mod W                   keys(p) = p mod W + 1
    linear    0 (state: 2 x state bytes per sequence)       0

The full group's terms are those of :class:`sim.timing.compute.RooflineComputeModel` for every layer (cached keys
``c``, pairs ``q (c + (q + 1) / 2)``), so a model whose layers are all full never goes through this module (its
results stay those of the plain roofline). The linear layers' scan FLOPs are not counted (``O(d_inner d_state)``
per token, small beside the projections the linear term counts).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sim.memory.layer_groups import LayerGroup, is_hybrid, layer_groups


@dataclass(frozen=True)
class GroupReads:
    """What the layers of one group read and compute in one iteration, summed over the batch's sequences.

    Attributes:
        group: the layer group (its layers, per-worker bytes per token and state bytes per request).
        kv_read_tokens: cached keys one layer of the group reads (the table's second column, summed).
        attention_pairs: (query, key) pairs one layer computes (summed).
        sequences: sequences in the iteration (each reads and writes a linear layer's state once).
    """

    group: LayerGroup
    kv_read_tokens: float
    attention_pairs: float
    sequences: int


def read_groups(spec, tp: int = 1) -> tuple[LayerGroup, ...] | None:
    """The layer groups of ``spec`` on one of ``tp`` workers when some are not full attention, else None (the
    plain roofline's case). Raises ``CatalogError`` as :func:`sim.memory.layer_groups.layer_groups`."""
    groups = layer_groups(spec, tp)
    return groups if is_hybrid(groups) else None


def _prefix_pairs(kind: str, window_tokens: int, tokens: int) -> float:
    """``P(n)``: the pairs of queries ``0 .. n - 1`` of one sequence (module table)."""
    if kind == "full" or (kind == "sliding" and tokens <= window_tokens):
        return tokens * (tokens + 1) / 2
    if kind == "sliding":
        return window_tokens * (window_tokens + 1) / 2 + (tokens - window_tokens) * window_tokens
    chunks, rest = divmod(tokens, window_tokens)     # chunked
    return chunks * window_tokens * (window_tokens + 1) / 2 + rest * (rest + 1) / 2


def sequence_reads(group: LayerGroup, context_tokens: int, new_tokens: int) -> tuple[int, float]:
    """``(cached keys read, pairs)`` of one layer of ``group`` for ``new_tokens`` queries after
    ``context_tokens`` cached tokens of one sequence (module table)."""
    kind, window = group.kind, group.window_tokens
    if kind == "linear":
        return 0, 0.0
    if kind == "full":
        return context_tokens, new_tokens * (context_tokens + (new_tokens + 1) / 2)
    cached = min(context_tokens, window - 1) if kind == "sliding" else context_tokens % window
    pairs = _prefix_pairs(kind, window, context_tokens + new_tokens) - _prefix_pairs(kind, window, context_tokens)
    return cached, pairs


def batch_reads(groups: tuple[LayerGroup, ...], chunks: Iterable[tuple[int, int]]) -> tuple[GroupReads, ...]:
    """Per-group reads of one iteration whose sequences run ``chunks``: ``(cached tokens, new tokens)`` each."""
    chunks = list(chunks)
    out = []
    for group in groups:
        cached = pairs = 0.0
        for context, tokens in chunks:
            keys, group_pairs = sequence_reads(group, context, tokens)
            cached += keys
            pairs += group_pairs
        out.append(GroupReads(group, cached, pairs, len(chunks)))
    return tuple(out)


def attention_terms(reads: tuple[GroupReads, ...], new_tokens: float, flops_per_pair_per_layer: float,
                    tile_rows: float = 0.0) -> tuple[float, float]:
    """``(attention FLOPs, KV bytes read and written)`` of one iteration on one worker, summed over groups:
    FLOPs ``flops_per_pair_per_layer x sum_g N_g (pairs_g + tile_rows x keys_g)`` (``tile_rows``: the
    roofline's ``mixed_tile_rows`` padding of a mixed batch, 0 otherwise); bytes ``sum_g (keys_g + T) x
    kv_bytes_per_token_g`` for attention groups (the cached keys read and the ``T`` new tokens' K/V written)
    and ``2 x sequences x state bytes`` for linear groups (read and written)."""
    flops = kv_bytes = 0.0
    for r in reads:
        g = r.group
        if g.grows:
            flops += flops_per_pair_per_layer * g.num_layers * (r.attention_pairs + tile_rows * r.kv_read_tokens)
            kv_bytes += (r.kv_read_tokens + new_tokens) * g.kv_bytes_per_token
        else:
            kv_bytes += 2 * r.sequences * g.state_bytes_per_request
    return flops, kv_bytes
