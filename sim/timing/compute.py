"""Compute-time model of one iteration: a documented roofline (Williams et al., CACM 2009) per worker.

For an iteration with ``T`` new tokens (prefill chunk tokens + one per decode), on one of ``tp`` workers::

    linear_us  = max(2 T W_lin / F,  (W_bytes - E_bytes) / B)       # projections + MLP: FLOPs vs weights read once
    logits_us  = 2 S h V / (tp F)                                     # LM head for the S sequences that emit a token
    attn_us    = max(4 A Hq' D N / F,  (K_read + T) * kv_bytes_per_token / B)
    comm_us    = 2 N * allreduce(T h P)   (tp > 1 only; two all-reduces per layer, NCCL's latency + bytes / bus
                                           bandwidth, ring or tree as NCCL picks by size: nccl_allreduce_us)
    iteration  = linear_us + logits_us + attn_us + comm_us + overhead_us

``W_lin``: linear parameters per worker a token runs through (MoE: top-k routed and shared experts,
``ModelSpec.active_linear_params``); ``W_bytes``: weights per worker (a MoE iteration reads the routed experts its
``T`` tokens pick: ``E (1 - (1 - k/E)^T)`` of ``E`` per layer, uniform routing); ``F`` for the linear layers is
the fp8 peak for fp8 weights on GPUs that have one; attention FLOPs use ``2 (D_qk + D_v)`` per pair and head
(GQA ``4 D``; MLA absorbed ``D_qk = kv_lora_rank + qk_rope_head_dim``, ``D_v = kv_lora_rank``);
``E_bytes``: embedding table (only gathered rows are read; tied embeddings are read as the LM head);
``A``: attention (query, key) pairs, ``sum over sequences of q * (context + (q + 1) / 2)``; ``K_read``:
cached tokens read by attention; ``F = flops_efficiency * bf16_flops``; ``B = bw_efficiency * mem_bw``.
Under the ``paged`` policy ``attn_us`` is multiplied by the paged kernel's factor of the iteration's phase
(``paged_attention_factor``, or per phase and context ``paged_factors``: :mod:`sim.timing.paged_kernels`), in every
form below as well.
For a hybrid model (sliding-window, chunked-local or linear layers) the simulator passes the reads per layer
group (``BatchShape.group_reads``): the attention FLOPs and K/V bytes are then summed over groups, a window layer
reading at most its window and a linear layer its state (:mod:`sim.timing.layer_reads`); the block form and
pipeline stages still read every layer over the whole context.
With pipeline parallelism (``SimConfig.pp``) :class:`sim.timing.pipeline.PipelineComputeModel` applies this roofline to each
stage's layers and composes the stages into a round time (docs/models.md).

Defaults and their sources (domain.md, measurements on the project's H200):
* ``flops_efficiency = 788 / 989 = 0.797``: measured bf16 8192^3 matmul over the datasheet peak.
* ``bw_efficiency = 4.3 / 4.8 = 0.896``: measured device-copy bandwidth over the datasheet figure.
* ``overhead_us = 1300``: launch and framework overhead of one eager-PyTorch iteration, fitted to the
  four measured random-weight Llama-3-8B decode iterations of domain.md (batch 8 / ctx 1024: 5.1 ms,
  32 / 1024: 5.8, 64 / 2048: 8.9, 128 / 2048: 14.3); this model gives 5.05, 5.83, 8.87, 12.96 ms.
A calibration profile's ``compute`` section replaces any of them. Per GPU (issue 31): ``flops_efficiency`` and
``bw_efficiency`` left unset (None) take the catalogue GPU's sourced fractions (``GPUSpec.flops_efficiency``,
``bw_efficiency``: the A100, H100 and A40 from Vidur's measured GEMMs, ``profiles/vidur-*.json``), and the H200's
above where the catalogue has none (``GPUSpec.efficiency_note``); the H200's own runs are unchanged.

Two terms measured on the H200 replay (``kvsim calibrate --compute``, ``profiles/h200.json``
``compute.tiled_roofline``), both 0 by default:
* ``launch_floor_us``: a host-bound floor, ``iteration = max(launch_floor_us, roofline)`` (eager PyTorch
  launches ~450 kernels per iteration: below ~50 decodes the measured iteration stays at 8.5-9 ms);
* ``mixed_tile_rows``: in a batch that holds a prefill chunk (``new_tokens > logit_sequences``), one
  varlen FlashAttention call pads every decode to a full query tile: ``tile_rows * kv_read_tokens`` extra
  (query, key) pairs (measured: 48 decodes at 1,024 tokens plus a 64-token chunk take 18.2 ms, against
  9.6 ms and 7.3 ms for the two parts alone).
Per-layer and per-worker host overheads (:mod:`sim.timing.overheads`, all 0 by default): ``launch_us_per_layer``
raises the eager floor to ``max(launch_floor_us, launch_us_per_layer * layers)`` (not-graphed iterations only);
``allreduce_launch_us`` and ``allreduce_skew_us`` add Vidur's host cost per all-reduce to ``comm_us``.

Decode iterations as CUDA graphs (``decode_graphs = 1``, as vLLM serves decodes and as the hardware replay
does by default, :class:`hwbackend.replay.model.DecodeGraphs`): a decode-only iteration (``new_tokens ==
logit_sequences``) is launched in one call, so it has no host launch floor and its own fixed cost
``decode_overhead_us`` replaces ``overhead_us``. ``attention_bytes_factor`` (default 1) multiplies the K/V
bytes attention reads: FlashAttention-2's varlen kernel with a causal mask does not pack the query heads of
one KV head together, so each KV head is read once per query head that shares it (up to ``Hq / H'`` = 4
for Llama-3-8B). ``decode_batch_knots`` / ``decode_batch_correction_us``: a measured correction (added time) of graphed
decode iterations by batch size, piecewise linear between the knots. The GEMM kernels change tile shapes with the batch, and
FlashAttention's decode grid (one block per sequence and query head, no split of the keys) fills the GPU
in waves, so time per cached token depends on the batch: steps a roofline has no term for (+3.5 ms from
24 to 48 decodes on the H200). ``wave_us_per_token``: time per key of the batch's longest sequence
(``BatchShape.max_context_tokens``): FlashAttention's varlen grid has one block per sequence and query head
and does not split the keys, so the last wave of blocks runs as long as the longest sequence (0 by default).
All are fitted on a replay's own iterations
(:mod:`hwbackend.calibration.inloop`, ``profiles/h200.json`` ``compute_in_loop``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from sim.setup.catalog import GPUSpec, ModelSpec
from sim.timing.allreduce import NCCL_BASE_LATENCY_US, NCCL_HOP_LATENCY_US, nccl_allreduce_us  # noqa: F401
from sim.timing.attention_blocks import (ATTENTION_TILE_ROWS, ENGINE_MAX_DECODE_SPLITS,  # noqa: F401
                                         BlockAttentionForm, attention_block_terms, engine_decode_splits,
                                         fa2_num_splits)
from sim.timing.compute_fields import (SCALAR_FIELDS, TABLE_FIELDS, ComputeFieldError,  # noqa: F401
                                       _unknown_fields, check_compute_field, finite_number, show_value)
from sim.timing.decode_run_times import DecodeRunForms
from sim.timing.layer_reads import attention_terms
from sim.timing.overheads import EagerLaunchFloor, collective_host_us
from sim.timing.paged_kernels import PagedFactors
from sim.units import US_PER_S


@dataclass(frozen=True)
class BatchShape:
    """What one iteration computes (per request, summed over the batch).

    Attributes:
        new_tokens: T, prefill-chunk tokens plus one token per decode.
        attention_pairs: A, (query, key) pairs attention computes.
        kv_read_tokens: cached tokens attention reads (context before this iteration, all sequences).
        logit_sequences: S, sequences that emit a token this iteration (decodes + finishing prefills).
        max_context_tokens: keys the longest sequence attends to (its cached plus new tokens); 0 if unknown.
        attention_blocks: FlashAttention thread blocks per query head, summed over sequences
            (:func:`attention_block_terms`); 0 if unknown.
        block_keys: keys those blocks read, summed (:func:`attention_block_terms`); 0 if unknown.
        group_reads: a hybrid model's reads per layer group (:func:`sim.timing.layer_reads.batch_reads`); empty
            (every layer reads the whole context) for a model whose layers are all full attention.
    """

    new_tokens: int
    attention_pairs: float
    kv_read_tokens: int
    logit_sequences: int
    max_context_tokens: int = 0
    attention_blocks: int = 0
    block_keys: float = 0.0
    group_reads: tuple = ()



H200_FLOPS_EFFICIENCY = 788 / 989
"""Measured bf16 8192^3 matmul over the datasheet peak on the project's H200 (module docstring)."""
H200_BW_EFFICIENCY = 4.3 / 4.8
"""Measured device-copy bandwidth over the datasheet figure on the project's H200 (module docstring)."""


@dataclass(frozen=True)
class RooflineComputeModel(BlockAttentionForm, DecodeRunForms, EagerLaunchFloor):
    """Iteration time for one model on one GPU type at tensor-parallel degree ``tp`` (see module docstring).

    Raises:
        CatalogError: if ``tp`` does not divide the model's heads (from :meth:`ModelSpec.check_tp`).
    """

    model: ModelSpec
    gpu: GPUSpec
    tp: int = 1
    flops_efficiency: float | None = None
    bw_efficiency: float | None = None
    attention_flops_efficiency: float = 0.5
    overhead_us: float = 1300.0
    paged_attention_factor: float = 1.0
    layout_attention_factor: float = 1.0
    mixed_tile_rows: float = 0.0
    launch_floor_us: float = 0.0
    decode_graphs: float = 0.0
    decode_overhead_us: float = 0.0
    attention_bytes_factor: float = 1.0
    wave_us_per_token: float = 0.0
    decode_batch_knots: tuple[float, ...] = ()
    decode_batch_correction_us: tuple[float, ...] = ()
    attention_block_us: float = 0.0
    attention_key_us: float = 0.0
    attention_prefill_key_us: float = 0.0
    attention_slots: float = 264.0
    split_kv_slot_tokens: float = 0.0
    split_kv_sms: float = 132.0
    attention_tail_key_us: float = 0.0
    attention_prefill_tail_key_us: float = 0.0
    attention_tail_serial: float = 0.0
    paged_factors: PagedFactors | None = None
    allreduce_base_us: float = 0.0
    allreduce_hop_us: float = 0.0
    allreduce_bus_bytes_per_s: float = 0.0
    split_kv_programs: float = 0.0
    launch_us_per_layer: float = 0.0
    allreduce_launch_us: float = 0.0
    allreduce_skew_us: float = 0.0

    def __post_init__(self) -> None:
        """Check every field's type and range (:func:`check_compute_field`), the two decode tables' lengths,
        and that no graphed decode iteration gets a negative time from its correction.

        Raises:
            CatalogError: a ``tp`` that does not divide the model's heads.
            ComputeFieldError: naming the field and the value.
        """
        self.model.check_tp(self.tp)
        for name, h200 in (("flops_efficiency", H200_FLOPS_EFFICIENCY), ("bw_efficiency", H200_BW_EFFICIENCY)):
            if getattr(self, name) is None:   # the GPU's sourced default (catalog.toml), else the H200's
                object.__setattr__(self, name, getattr(self.gpu, name, 0.0) or h200)
        for name in SCALAR_FIELDS:
            check_compute_field(name, getattr(self, name))
        knots, corrections = self.decode_batch_knots, self.decode_batch_correction_us
        if knots or corrections:
            check_compute_field("decode_batch_knots", knots)
            check_compute_field("decode_batch_correction_us", corrections)
            if len(knots) != len(corrections):
                raise ComputeFieldError("decode_batch_correction_us", f"must have one value per decode_batch_knots "
                                        f"entry ({len(knots)}), got {len(corrections)}")
            if self.decode_graphs:
                self._check_decode_times()

    def _check_decode_times(self) -> None:
        """A correction below ``-(decode_overhead_us + roofline)`` would give a graphed decode iteration a
        negative time. The least time over batch sizes ``b >= 1`` is at zero context (context only adds time);
        there the roofline is ``max(a b, c) + d b`` (FLOPs or streamed weights, plus terms proportional to
        ``b``), convex with one kink, and the correction is linear between knots and constant outside them, so
        the minimum lies at ``b = 1``, at a knot, or at the kink: those are checked."""
        knots = np.asarray(self.decode_batch_knots, dtype=float)
        kink = (self._streamed_weight_bytes / self._bytes_per_us) / (2 * self._linear_params / self._flops_per_us)
        # sorted, repeats kept (np.unique would import numpy.ma at every start: ~7 ms)
        sizes = np.sort(np.clip(np.concatenate(([1.0, kink], knots)), 1.0, max(knots[-1], 1.0)))
        times = (self._time_us(sizes, sizes, 0.0, sizes, np.maximum, 0.0) + self.decode_overhead_us
                 + self._decode_correction_us(sizes))
        if np.any(times < 0):
            worst = int(np.argmin(times))
            raise ComputeFieldError(
                "decode_batch_correction_us",
                f"gives a graphed decode iteration of batch {sizes[worst]:g} a negative time "
                f"({times[worst]:.1f} us; decode_overhead_us {self.decode_overhead_us:g}), got "
                f"{show_value(list(self.decode_batch_correction_us))}")

    @cached_property
    def _flops_per_us(self) -> float:
        return self.flops_efficiency * self.gpu.bf16_flops / US_PER_S

    @cached_property
    def _bytes_per_us(self) -> float:
        return self.bw_efficiency * self.gpu.mem_bw_bytes_per_s / US_PER_S

    @cached_property
    def _linear_flops_per_us(self) -> float:
        """FLOP/us of the linear layers: the GPU's fp8 peak for fp8 weights on a GPU with fp8 tensor cores
        (vLLM runs fp8 checkpoints W8A8 there), else the bf16 rate."""
        if self.model.dtype_bytes == 1 and self.gpu.fp8_flops:
            return self.flops_efficiency * self.gpu.fp8_flops / US_PER_S
        return self._flops_per_us

    def _weight_read_bytes(self, new_tokens):
        """Weight bytes one iteration of ``new_tokens`` tokens streams: all but the unread embedding; for a MoE
        model only the routed experts some token picks, ``E (1 - (1 - k/E)^T)`` of ``E`` per layer in
        expectation (uniform routing; shared experts always)."""
        m = self.model
        if not m.uses_moe:
            return self._streamed_weight_bytes
        untouched = np.power(1.0 - m.experts_per_token / m.num_experts, np.asarray(new_tokens, dtype=float))
        read = self._streamed_weight_bytes - m.routed_expert_bytes(self.tp) * untouched
        return float(read) if np.ndim(read) == 0 else read

    def iteration_us(self, batch: BatchShape) -> float:
        """Modelled duration (us) of one iteration of ``batch``; 0 for an empty batch."""
        if batch.new_tokens <= 0:
            return 0.0
        mixed = batch.new_tokens > batch.logit_sequences  # a prefill chunk is in the batch
        if self.attention_key_us:
            return self._blocks_one_us(batch)
        pairs = batch.attention_pairs + (self.mixed_tile_rows * batch.kv_read_tokens if mixed else 0.0)
        wave_us = self.wave_us_per_token * batch.max_context_tokens
        terms = (attention_terms(batch.group_reads, batch.new_tokens, self._flops_per_pair_per_layer,
                                 self.mixed_tile_rows if mixed else 0.0) if batch.group_reads else None)
        if self.decode_graphs and not mixed:
            size = batch.logit_sequences
            correction_us = self._decode_correction_of(size) if self.decode_batch_knots else 0.0
            return (self._time_us(size, pairs, batch.kv_read_tokens, size, max, 0.0, terms=terms)
                    + self.decode_overhead_us + correction_us + wave_us)
        roofline = self._time_us(batch.new_tokens, pairs, batch.kv_read_tokens, batch.logit_sequences, max, 0.0,
                                 terms=terms)
        return max(self._eager_floor_us, roofline + self.overhead_us + wave_us)

    def _decode_correction_of(self, batch_size: int) -> float:
        """:meth:`_decode_correction_us` of one batch size as a float, kept per size (the model is frozen: the
        same float as evaluating it each time)."""
        cache = self._decode_correction_cache
        value = cache.get(batch_size)
        if value is None:
            value = cache[batch_size] = float(self._decode_correction_us(batch_size))
        return value

    @cached_property
    def _decode_correction_cache(self) -> dict[int, float]:
        return {}

    def _decode_correction_us(self, batch_size):
        """The measured per-batch-size correction of graphed decode iterations (piecewise linear between
        ``decode_batch_knots``, constant beyond the ends; 0 without knots)."""
        if not self.decode_batch_knots:
            return 0.0 * np.asarray(batch_size, dtype=float)
        return np.interp(batch_size, self.decode_batch_knots, self.decode_batch_correction_us)

    def iteration_us_array(self, new_tokens: np.ndarray, attention_pairs: np.ndarray, kv_read_tokens: np.ndarray,
                           logit_sequences: np.ndarray, max_context_tokens: np.ndarray | float = 0.0,
                           attention_blocks: np.ndarray | float = 0.0,
                           block_keys: np.ndarray | float = 0.0) -> np.ndarray:
        """:meth:`iteration_us` of many iterations at once (arrays of one length: the fields of
        :class:`BatchShape`); used by the fits (``hwbackend.calibration.inloop``). Empty batches give 0."""
        if self.attention_key_us:
            shape = np.broadcast_shapes(np.shape(new_tokens), np.shape(kv_read_tokens))
            arrays = [np.broadcast_to(np.asarray(a, dtype=float), shape) for a in
                      (new_tokens, kv_read_tokens, logit_sequences, max_context_tokens, attention_blocks, block_keys)]
            return np.where(arrays[0] > 0, self._blocks_iteration_us(*arrays), 0.0)
        wave_us = self.wave_us_per_token * np.asarray(max_context_tokens, dtype=float)
        new = np.asarray(new_tokens, dtype=float)
        logits = np.asarray(logit_sequences, dtype=float)
        kv_read = np.asarray(kv_read_tokens, dtype=float)
        mixed = new > logits  # a prefill chunk is in the batch
        pairs = np.asarray(attention_pairs, dtype=float) + np.where(mixed, self.mixed_tile_rows * kv_read, 0.0)
        eager = np.maximum(self._eager_floor_us, self._time_us(new, pairs, kv_read, logits, np.maximum, 0.0)
                           + self.overhead_us + wave_us)
        if not self.decode_graphs:
            return np.where(new > 0, eager, 0.0)
        graphed = (self._time_us(new, pairs, kv_read, logits, np.maximum, 0.0) + self.decode_overhead_us
                   + self._decode_correction_us(logits) + wave_us)
        return np.where(new > 0, np.where(mixed, eager, graphed), 0.0)


    def _paged_factor(self, new_tokens, kv_read_tokens, logit_sequences):
        """The paged kernel's attention-time factor of iterations (numbers or arrays of one length): without
        :attr:`paged_factors`, ``paged_attention_factor`` (one factor for both phases, the model before
        per-phase factors); else the prefill factor where the iteration holds a prefill chunk
        (``new_tokens > logit_sequences``) and the decode factor at ``kv_read_tokens / logit_sequences + 1`` keys
        per sequence otherwise (:mod:`sim.timing.paged_kernels`)."""
        factors = self.paged_factors
        if factors is None:
            return self.paged_attention_factor
        if np.ndim(new_tokens) == 0 and np.ndim(kv_read_tokens) == 0 and np.ndim(logit_sequences) == 0:
            if new_tokens > logit_sequences:
                return factors.prefill
            return factors.decode_at(kv_read_tokens / max(logit_sequences, 1) + 1.0)
        new, logits = np.asarray(new_tokens, dtype=float), np.asarray(logit_sequences, dtype=float)
        keys = np.asarray(kv_read_tokens, dtype=float) / np.maximum(logits, 1.0) + 1.0
        return np.where(new > logits, factors.prefill, factors.decode_at(keys))


    def _time_us(self, new_tokens, attention_pairs, kv_read_tokens, logit_sequences, maximum, overhead_us,
                 attention: bool = True, terms: tuple[float, float] | None = None):
        """The roofline's sum (module docstring); ``terms``: a hybrid model's ``(attention FLOPs, KV bytes)``
        per layer group (:func:`sim.timing.layer_reads.attention_terms`) in place of every layer's."""
        m, tp = self.model, self.tp
        linear_us = maximum(2 * new_tokens * self._linear_params / self._linear_flops_per_us,
                            self._weight_read_bytes(new_tokens) / self._bytes_per_us)
        logits_us = 2 * logit_sequences * m.hidden_size * m.vocab_size / tp / self._flops_per_us
        if m.uses_mla:   # absorbed MLA (vLLM's decode path): q.k over latent + rope dims, p.v over the latent
            attn_flops = 2 * attention_pairs * (m.num_q_heads // tp) * (m.attention_qk_dim + m.attention_v_dim) * m.num_layers
        else:
            attn_flops = 4 * attention_pairs * (m.num_q_heads // tp) * m.head_dim * m.num_layers
        kv_bytes = (kv_read_tokens + new_tokens) * self._kv_bytes_per_token * self.attention_bytes_factor
        if terms is not None:
            attn_flops, kv_bytes = terms[0], terms[1] * self.attention_bytes_factor
        attn_us = maximum(attn_flops / (self._flops_per_us * self.attention_flops_efficiency),
                          kv_bytes / self._bytes_per_us) * self._paged_factor(new_tokens, kv_read_tokens,
                                                              logit_sequences) * self.layout_attention_factor
        if not attention:
            attn_us = 0.0
        return linear_us + logits_us + attn_us + self._comm_us(new_tokens) + overhead_us

    @cached_property
    def _linear_params(self) -> int:
        return self.model.active_linear_params(self.tp)     # dense: num_layers * linear_params_per_layer

    @cached_property
    def _streamed_weight_bytes(self) -> int:
        """Weights read once per iteration: all but the embedding table (only gathered rows are read)."""
        m = self.model
        return m.weight_bytes(self.tp) - m.unread_embedding_bytes(self.tp)

    @cached_property
    def _flops_per_pair_per_layer(self) -> int:
        """Attention FLOPs of one (query, key) pair in one layer on one worker (GQA ``4 Hq' D``; absorbed MLA
        ``2 Hq' (D_qk + D_v)``), the factors of :meth:`_time_us`."""
        m, heads = self.model, self.model.num_q_heads // self.tp
        return 2 * heads * (m.attention_qk_dim + m.attention_v_dim) if m.uses_mla else 4 * heads * m.head_dim

    @cached_property
    def _kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(self.tp)

    def _comm_us(self, new_tokens):
        """Time (us) of the ``2 N`` all-reduces of one iteration of ``new_tokens`` tokens (a number or an array),
        each of ``T h P`` bytes over the GPU's link, as NCCL costs them (:func:`nccl_allreduce_us`); 0 at tp 1.
        With a measured ``allreduce_bus_bytes_per_s`` (a profile's fit of Vidur's ``all_reduce.csv``,
        :mod:`hwbackend.calibration.vidur`) each costs ``base + hop (n - 1) + 2 (n - 1) / n * bytes / busbw``
        instead (nccl-tests' bus bandwidth, ``doc/PERFORMANCE.md``). Each all-reduce also costs the host
        ``allreduce_launch_us + allreduce_skew_us * tp^1.25`` (Vidur's form, :func:`collective_host_us`; 0 by
        default)."""
        if self.tp == 1:
            return 0.0
        total = self._transfer_us(new_tokens)
        if self.allreduce_launch_us or self.allreduce_skew_us:   # host cost per collective (sim.timing.overheads)
            total = total + 2 * self.model.num_layers * collective_host_us(self.allreduce_launch_us,
                                                                           self.allreduce_skew_us, self.tp)
        return total

    def _transfer_us(self, new_tokens):
        """The transfer part of :meth:`_comm_us` (us, a number or an array like ``new_tokens``)."""
        m = self.model
        nbytes = np.asarray(new_tokens, dtype=float) * m.hidden_size * m.activation_bytes
        if self.allreduce_bus_bytes_per_s > 0:   # measured (kvsim calibrate --from-vidur): one line for every size
            ranks = self.tp
            per_call = (self.allreduce_base_us + self.allreduce_hop_us * (ranks - 1)
                        + 2 * (ranks - 1) / ranks * nbytes / (self.allreduce_bus_bytes_per_s / US_PER_S))
            total = 2 * m.num_layers * per_call
            return float(total) if np.ndim(total) == 0 else total
        nvlink = self.gpu.nvlink_bytes_per_s > self.gpu.pcie_bytes_per_s
        link_bytes_per_s = self.gpu.nvlink_bytes_per_s if nvlink else self.gpu.pcie_bytes_per_s
        total = 2 * m.num_layers * nccl_allreduce_us(nbytes, self.tp, link_bytes_per_s, nvlink)
        return float(total) if np.ndim(total) == 0 else total

    def with_overrides(self, overrides: dict) -> "RooflineComputeModel":
        """A copy with fields replaced from a profile's compute section (``{field: value}``, values as in
        the JSON file: numbers, and lists of numbers for :data:`TABLE_FIELDS`).

        Raises:
            ComputeFieldError: an unknown field, or a value of the wrong type or out of range
                (:func:`check_compute_field`); the message names the field and the value.
        """
        unknown = sorted(set(overrides) - set(SCALAR_FIELDS) - set(TABLE_FIELDS))
        if unknown:
            raise _unknown_fields(unknown)
        return replace(self, **{name: check_compute_field(name, value) for name, value in overrides.items()})



def decode_batch(batch_size: int, context_tokens: int) -> BatchShape:
    """Shape of a pure decode iteration of ``batch_size`` sequences each with ``context_tokens`` cached."""
    return BatchShape(new_tokens=batch_size, attention_pairs=batch_size * (context_tokens + 1),
                      kv_read_tokens=batch_size * context_tokens, logit_sequences=batch_size,
                      max_context_tokens=context_tokens + 1)
