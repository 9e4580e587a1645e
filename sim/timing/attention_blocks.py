"""The block form of attention time (``attention_key_us > 0``): FlashAttention-2's thread blocks and key splits.

The shape terms (:func:`attention_block_terms`), the split heuristics of FlashAttention-2 (:func:`fa2_num_splits`)
and of the engine replay (:func:`engine_decode_splits`), and :class:`BlockAttentionForm`, the methods of
:class:`sim.timing.compute.RooflineComputeModel` that time an iteration in this form (a mixin: it holds no fields
and reads the model's). The formulas and their sources are in each docstring and in
``docs/validation/cross-workload/PLAN.md``. The module-level names are re-exported by :mod:`sim.timing.compute`.
"""
from __future__ import annotations

import math
from functools import cached_property

import numpy as np


ATTENTION_TILE_ROWS = 128
"""Query rows of one FlashAttention-2 forward thread block (``kBlockM`` of the head-dim-128 kernels,
flash-attn ``flash_fwd_launch_template.h``; the replay's attention is that kernel, ``hwbackend.replay.model``)."""


def attention_block_terms(tokens: int, context: int) -> tuple[int, int]:
    """Thread blocks (per query head) and keys they read for one sequence's share of an iteration.

    FlashAttention-2's varlen forward gives each sequence ``n = ceil(tokens / R)`` blocks of ``R =``
    :data:`ATTENTION_TILE_ROWS` query rows per query head, and never splits the keys: with the causal mask
    aligned bottom-right, block ``m`` reads keys ``0 .. context + min(tokens, (m + 1) R)``. Summed over the
    blocks: ``n context + R n (n - 1) / 2 + tokens`` keys (a decode: one block of ``context + 1`` keys).

    Args:
        tokens: new tokens of the sequence this iteration (``> 0``). context: its cached tokens.
    Returns:
        ``(blocks, keys)``.
    """
    n = -(-tokens // ATTENTION_TILE_ROWS)
    return n, n * context + ATTENTION_TILE_ROWS * n * (n - 1) // 2 + tokens


def _overlap(throughput, tail, serial: float, maximum, minimum):
    """Attention time of blocks whose throughput time is ``throughput`` and whose longest block alone takes
    ``tail`` (us): ``max(throughput, tail) + serial * min(throughput, tail)``; ``serial`` 0 (forms B-D): the
    longest block overlaps the rest; 1: it runs after them (form E fits it, PLAN.md round 2)."""
    if not serial:
        return maximum(throughput, tail)
    return maximum(throughput, tail) + serial * minimum(throughput, tail)


ENGINE_MAX_DECODE_SPLITS = 64
"""Most key splits of the engine replay's split-KV decode (``MAX_DECODE_SPLITS``, ``hwbackend/replay/engine.py``)."""


def engine_decode_splits(decodes, kv_heads: int, programs: float):
    """Key splits per sequence of the engine replay's split-KV decode (``hwbackend.replay.engine.decode_splits``):
    ``clamp(ceil(programs / (decodes x kv_heads)), 1, ENGINE_MAX_DECODE_SPLITS)``, with ``programs`` the
    target of concurrent programs (``PROGRAMS_PER_SM x SMs``: 4 x 132 = 528 on the H200). Each sequence's keys
    are cut into that many splits of ``ceil(len / splits)`` keys, so a decode-only iteration launches
    ``decodes x kv_heads x splits`` programs per layer, and its longest program reads ``ceil(longest / splits)``
    keys. In the block model (``_blocks_iteration_us``, ``split_kv_programs > 0``) the attention time per layer
    is then ``max(H' (tau0 b s + kappa (kv_read + b)) / P, tau0 + kappa_t ceil(longest / s))``: a per-program
    cost ``tau0`` (us; it carries the split's partial-output write and its share of the log-sum-exp merge), the
    KV bytes read per key ``kappa`` (us per key and KV head: 2 x head_dim x 2 bytes of K and V), and the tail of
    the longest split. ``decodes``: an int or an array (then an array of the same shape)."""
    if np.ndim(decodes):
        d = np.maximum(np.asarray(decodes, dtype=float) * kv_heads, 1.0)
        return np.clip(np.ceil(programs / d), 1, ENGINE_MAX_DECODE_SPLITS)
    return max(1, min(ENGINE_MAX_DECODE_SPLITS, math.ceil(programs / max(1, decodes * kv_heads))))


def fa2_num_splits(blocks: int, block_slots: int, n_blocks: int, max_splits: int = 128) -> int:
    """FlashAttention-2's ``num_splits_heuristic`` (flash-attn ``flash_api.cpp``): the number of key splits for
    ``blocks`` (batch x heads x query tiles) thread blocks on a GPU of ``block_slots`` concurrent blocks, over
    ``n_blocks`` key tiles of 128: 1 when the blocks nearly fill the GPU (``>= 0.8`` of the slots), else the
    fewest eligible splits whose wave efficiency is within 85% of the best. Checked against the H200 grid: the
    decode time stops growing with the context past ``ceil(n_blocks / s) * 128`` keys (``docs/validation``)."""
    if blocks >= 0.8 * block_slots:
        return 1
    max_splits = min(max_splits, block_slots, n_blocks)
    efficiency = []
    for splits in range(1, max_splits + 1):
        eligible = splits == 1 or -(-n_blocks // splits) != -(-n_blocks // (splits - 1))
        waves = blocks * splits / block_slots
        efficiency.append(waves / math.ceil(waves) if eligible else 0.0)
    best = max(efficiency, default=0.0)
    for splits, eff in enumerate(efficiency, start=1):
        if eff and eff >= 0.85 * best:
            return splits
    return 1



class BlockAttentionForm:
    """The block form's methods of :class:`sim.timing.compute.RooflineComputeModel` (which it is mixed into:
    ``self`` is that model, and ``BatchShape`` is :class:`sim.timing.compute.BatchShape`)."""

    def _blocks_iteration_us(self, new, kv_read, logits, longest, blocks, block_keys) -> np.ndarray:
        """Iterations (us, arrays of one length) with attention as FlashAttention-2 thread blocks (the block
        model, ``attention_key_us > 0``; ``docs/validation/cross-workload/PLAN.md``): the roofline's linear,
        logits and all-reduce terms, plus per layer::

            decode-only (split-KV, q heads packed per KV head):  H' heads, s = fa2_num_splits(b H', ...)
                A = b if s == 1 else max(b, (kv_read + b) / chunk + b / 2)    active blocks per head
                attn = max(H' (tau0 A + kappa (kv_read + b)) / P,  tau0 + kappa_t min(chunk, longest))
            with a prefill chunk (one block per 128 query rows and query head, keys never split):
                attn = max(Hq' (tau0 N + kappa_p K) / P,  tau0 + kappa_pt longest)

        ``tau0 = attention_block_us``, ``kappa = attention_key_us``, ``kappa_p = attention_prefill_key_us`` (0:
        ``kappa``), ``P = attention_slots``; the longest block's own time per key (form D,
        ``docs/validation/cross-workload/PLAN.md`` round 2: a lone block runs slower per key than the blocks'
        throughput ``kappa / P`` suggests, e.g. 32 decodes with one at 128K take 130 ms on the H200)
        ``kappa_t = attention_tail_key_us`` (0: ``kappa``), ``kappa_pt = attention_prefill_tail_key_us`` (0:
        ``kappa_p``); form E replaces each ``max(a, b)`` by ``max(a, b) + attention_tail_serial * min(a, b)``
        (:func:`_overlap`); ``N``, ``K``: :func:`attention_block_terms` summed (0 = unknown:
        one block per decode and per 128 chunk tokens, ``K = kv_read + new``). Attention is multiplied by
        the paged factor (:meth:`_paged_factor`) and ``layout_attention_factor`` as in the roofline. Decode-only iterations add
        ``decode_overhead_us`` and the batch correction with graphs; mixed ones ``overhead_us`` and the launch
        floor."""
        m, tp = self.model, self.tp
        heads_q, heads_kv, layers = m.num_q_heads // tp, max(m.num_kv_heads // tp, 1), m.num_layers
        mixed = new > logits
        base = self._time_us(new, 0.0, kv_read, logits, np.maximum, 0.0, attention=False)
        tau0, kappa = self.attention_block_us, self.attention_key_us
        kappa_p = self.attention_prefill_key_us or kappa
        kappa_t, kappa_pt = self.attention_tail_key_us or kappa, self.attention_prefill_tail_key_us or kappa_p
        if self.split_kv_programs:   # the engine replay's split-KV kernel (engine_decode_splits)
            splits = engine_decode_splits(logits, heads_kv, self.split_kv_programs)
            decode_blocks, tail_keys = logits * splits, np.ceil(longest / splits)
        else:
            chunk = self._split_chunk_tokens(logits, heads_kv)
            decode_blocks = np.where(np.isfinite(chunk), np.maximum(logits, (kv_read + logits) / chunk + logits / 2),
                                     logits)
            tail_keys = np.minimum(chunk, longest)
        decode_attn = _overlap(heads_kv * (tau0 * decode_blocks + kappa * (kv_read + logits)) / self.attention_slots,
                               tau0 + kappa_t * tail_keys, self.attention_tail_serial, np.maximum, np.minimum)
        known = blocks > 0
        n = np.where(known, blocks, logits + np.ceil(np.maximum(new - logits, 0) / ATTENTION_TILE_ROWS))
        k = np.where(known, block_keys, kv_read + new)
        mixed_attn = _overlap(heads_q * (tau0 * n + kappa_p * k) / self.attention_slots, tau0 + kappa_pt * longest,
                              self.attention_tail_serial, np.maximum, np.minimum)
        attn = (layers * np.where(mixed, mixed_attn, decode_attn)   # measured with vAttention's per-layer tensors
                * self._paged_factor(new, kv_read, logits) * self.layout_attention_factor)
        eager = np.maximum(self._eager_floor_us, base + attn + self.overhead_us)
        if not self.decode_graphs:
            return eager
        graphed = base + attn + self.decode_overhead_us + self._decode_correction_us(logits)
        return np.where(mixed, eager, graphed)

    def _blocks_one_us(self, batch) -> float:
        """:meth:`_blocks_iteration_us` of one iteration in plain floats (the simulator calls it once per
        stepped iteration; the array form costs numpy's per-call overhead several times over).

        A hybrid model's batch (``batch.group_reads``, :mod:`sim.timing.layer_reads`) takes the per-layer
        attention of each group of attention layers over what that group reads, weighted by its layers: the
        cached keys ``kv_read`` of the group, a lone block's keys bounded by the window (``min(longest, W)``),
        and, with a prefill chunk, the keys the query blocks read scaled by the group's share of the batch's
        (query, key) pairs (``K_g = K x pairs_g / pairs``: a block reads at most its window); linear (state)
        layers add no attention blocks (their state traffic is small beside the weights). A model of full
        layers only is the plain form bit for bit."""
        new, kv_read, logits, longest = batch.new_tokens, batch.kv_read_tokens, batch.logit_sequences, batch.max_context_tokens
        base = self._time_us(new, 0.0, kv_read, logits, max, 0.0, attention=False)
        if new > logits:   # a prefill chunk: blocks of 128 query rows per query head, keys never split
            if batch.attention_blocks > 0:
                n, k = batch.attention_blocks, batch.block_keys
            else:
                n, k = logits + math.ceil(max(new - logits, 0) / ATTENTION_TILE_ROWS), kv_read + new
        else:
            n = k = 0.0
        if batch.group_reads:
            pairs = batch.attention_pairs
            attn = 0.0
            for reads in batch.group_reads:
                group = reads.group
                if not group.grows:
                    continue
                window_longest = min(longest, group.window_tokens) if group.window_tokens else longest
                keys = k * reads.attention_pairs / pairs if pairs > 0 else k
                attn += group.num_layers * self._block_layer_us(new, reads.kv_read_tokens, logits, window_longest,
                                                                 n, keys)
            attn *= self._paged_factor(new, kv_read, logits) * self.layout_attention_factor
        else:   # the expression of the plain form, factor for factor (bit for bit)
            attn = self._block_layer_us(new, kv_read, logits, longest, n, k)
            attn *= self.model.num_layers * self._paged_factor(new, kv_read, logits) * self.layout_attention_factor
        if new > logits or not self.decode_graphs:
            return max(self._eager_floor_us, base + attn + self.overhead_us)
        return base + attn + self.decode_overhead_us + float(self._decode_correction_us(logits))

    def _block_layer_us(self, new: float, kv_read: float, logits: float, longest: float, n: float, k: float) -> float:
        """One layer's attention in the block form (:meth:`_blocks_iteration_us`'s formulas): ``n`` query blocks
        reading ``k`` keys with a prefill chunk (``new > logits``), else split-KV decodes over ``kv_read`` cached
        keys, the longest sequence ``longest`` tokens."""
        m, tp = self.model, self.tp
        tau0, kappa, slots = self.attention_block_us, self.attention_key_us, self.attention_slots
        if new > logits:
            kappa_p = self.attention_prefill_key_us or kappa
            kappa_pt = self.attention_prefill_tail_key_us or kappa_p
            return _overlap((m.num_q_heads // tp) * (tau0 * n + kappa_p * k) / slots, tau0 + kappa_pt * longest,
                            self.attention_tail_serial, max, min)
        heads_kv = max(m.num_kv_heads // tp, 1)
        if self.split_kv_programs:   # the engine replay's split-KV kernel (engine_decode_splits)
            splits = float(engine_decode_splits(logits, heads_kv, self.split_kv_programs))
            active, tail_keys = logits * splits, math.ceil(longest / splits)
        else:
            chunk = self._split_chunks.get(logits)
            if chunk is None:
                chunk = float(self._split_chunk_tokens(np.array([logits]), heads_kv)[0])
            active = logits if chunk == math.inf else max(logits, (kv_read + logits) / chunk + logits / 2)
            tail_keys = min(chunk, longest)
        kappa_t = self.attention_tail_key_us or kappa
        return _overlap(heads_kv * (tau0 * active + kappa * (kv_read + logits)) / slots,
                        tau0 + kappa_t * tail_keys, self.attention_tail_serial, max, min)

    @cached_property
    def _split_chunks(self) -> dict:
        """Decode batch size -> keys per split (:meth:`_split_chunk_tokens`), filled as batch sizes appear."""
        return {}

    def _split_chunk_tokens(self, decodes, heads_kv: int) -> np.ndarray:
        """Keys per split of a graphed decode batch of ``decodes`` sequences (inf: no split): FlashAttention-2
        packs the query heads of a KV head into one block when ``Hq > H'`` (``seqlenq_ngroups_swapped``) and
        splits the keys of a slot of ``split_kv_slot_tokens`` (the graphs' ``max_seqlen_k``) by its
        ``num_splits_heuristic`` over ``2 * split_kv_sms`` block slots (flash-attn ``flash_api.cpp``,
        ``set_params_splitkv``); 0 slot tokens: no split modelled."""
        sizes = np.asarray(decodes, dtype=float)
        if not self.split_kv_slot_tokens or self.model.num_q_heads <= self.model.num_kv_heads:
            return np.full(sizes.shape, np.inf)
        n_blocks = -(-int(self.split_kv_slot_tokens) // 128)

        def chunk(b: int) -> float:
            cached = self._split_chunks.get(b)
            if cached is None:
                splits = fa2_num_splits(b * heads_kv, int(2 * self.split_kv_sms), n_blocks) if b > 0 else 1
                cached = self._split_chunks[b] = math.ceil(n_blocks / splits) * 128.0 if splits > 1 else math.inf
            return cached

        if sizes.size and (sizes == sizes.flat[0]).all():   # a decode run: one batch size throughout
            return np.full(sizes.shape, chunk(int(sizes.flat[0])))
        table = {int(b): chunk(int(b)) for b in sorted(set(sizes.ravel().tolist()))}
        return np.array([table[int(b)] for b in sizes.ravel()], dtype=float).reshape(sizes.shape)
