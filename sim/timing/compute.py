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

import json
import math
import numbers
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from sim.setup.catalog import GPUSpec, ModelSpec
from sim.timing.paged_kernels import PagedFactors
from sim.units import US_PER_S


SCALAR_FIELDS: dict[str, str] = {
    "flops_efficiency": "> 0", "bw_efficiency": "> 0", "attention_flops_efficiency": "> 0",
    "overhead_us": ">= 0", "paged_attention_factor": "> 0", "layout_attention_factor": "> 0",
    "mixed_tile_rows": ">= 0", "launch_floor_us": ">= 0", "decode_graphs": "0 or 1",
    "decode_overhead_us": ">= 0", "attention_bytes_factor": "> 0", "wave_us_per_token": ">= 0",
    "attention_block_us": ">= 0", "attention_key_us": ">= 0", "attention_prefill_key_us": ">= 0",
    "attention_slots": "> 0", "split_kv_slot_tokens": ">= 0", "split_kv_sms": "> 0", "split_kv_programs": ">= 0",
    "attention_tail_key_us": ">= 0", "attention_prefill_tail_key_us": ">= 0", "attention_tail_serial": "0 to 1",
    "allreduce_base_us": ">= 0", "allreduce_hop_us": ">= 0", "allreduce_bus_bytes_per_s": ">= 0",
}
"""The scalar fields of :class:`RooflineComputeModel` with their physical range (times in us and rows
``>= 0``, efficiencies and factors ``> 0``, ``decode_graphs`` a flag); every value must be finite."""

TABLE_FIELDS = ("decode_batch_knots", "decode_batch_correction_us")
"""The list fields of :class:`RooflineComputeModel`: batch sizes (``> 0``, strictly increasing) and the
added time (us, any sign) at each, of one length."""


class ComputeFieldError(ValueError):
    """A compute-model field out of its type or range; ``str()`` is ``"<field> <problem>"``, so a caller can
    prefix the section it read the field from (``sim.core.runner.load_models``)."""

    def __init__(self, field: str, problem: str):
        super().__init__(field, problem)
        self.field, self.problem = field, problem

    def __str__(self) -> str:
        return f"{self.field} {self.problem}"


def show_value(value, limit: int = 60) -> str:
    """``value`` as JSON text (``"x"``, ``null``, ``[1]``, ``NaN``), cut to ``limit`` characters, for error
    messages about a JSON file's fields."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def finite_number(value) -> float | None:
    """``value`` as a finite float, or None for a non-number (``bool``, ``None`` and strings included), NaN,
    infinity, or an integer too large for a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (OverflowError, TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _unknown_fields(names: list[str]) -> ComputeFieldError:
    return ComputeFieldError(names[0], f"is not a compute-model field (unknown compute fields {names}; known: "
                                       f"{', '.join(sorted(SCALAR_FIELDS) + list(TABLE_FIELDS))})")


def check_compute_field(name: str, value) -> float | tuple[float, ...]:
    """Convert one value of a compute-model field (e.g. from a profile's ``compute_in_loop.params``) after
    checking its type and physical range (:data:`SCALAR_FIELDS`; for :data:`TABLE_FIELDS` a non-empty list of
    finite numbers, knots ``> 0`` and strictly increasing). The two tables' lengths are checked together by
    :class:`RooflineComputeModel`.

    Returns:
        A float (scalar fields; ``decode_graphs`` as 0.0 or 1.0, ``true``/``false`` accepted), or a tuple of
        floats (table fields).

    Raises:
        ComputeFieldError: an unknown field, a non-number (null, string, bool), NaN, infinity, or a value
            out of range; the message names the field and the value.
    """
    if name in TABLE_FIELDS:
        if not isinstance(value, (list, tuple)) or not value:
            raise ComputeFieldError(name, f"must be a list of numbers (at least one), got {show_value(value)}")
        numbers_ = [finite_number(x) for x in value]
        for index, (raw, number) in enumerate(zip(value, numbers_)):
            if number is None:
                raise ComputeFieldError(f"{name}[{index}]", f"must be a finite number, got {show_value(raw)}")
            if name == "decode_batch_knots" and number <= 0:
                raise ComputeFieldError(f"{name}[{index}]", f"must be a batch size > 0, got {show_value(raw)}")
        if name == "decode_batch_knots":
            for index in range(1, len(numbers_)):
                if numbers_[index] <= numbers_[index - 1]:
                    raise ComputeFieldError(name, f"must increase strictly, got {show_value(value)}")
        return tuple(numbers_)
    rule = SCALAR_FIELDS.get(name)
    if rule is None:
        raise _unknown_fields([name])
    if rule == "0 or 1":
        number = float(value) if isinstance(value, bool) else finite_number(value)
        if number not in (0.0, 1.0):
            raise ComputeFieldError(name, f"must be 0 or 1 (decodes as CUDA graphs), got {show_value(value)}")
        return number
    number = finite_number(value)
    bad = number is None or (number <= 0 if rule == "> 0" else number < 0 or (rule == "0 to 1" and number > 1))
    if bad:
        unit = " (us)" if name.endswith("_us") else " (us per token)" if name == "wave_us_per_token" else ""
        raise ComputeFieldError(name, f"must be a finite number {rule}{unit}, got {show_value(value)}")
    return number


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
    """

    new_tokens: int
    attention_pairs: float
    kv_read_tokens: int
    logit_sequences: int
    max_context_tokens: int = 0
    attention_blocks: int = 0
    block_keys: float = 0.0


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


H200_FLOPS_EFFICIENCY = 788 / 989
"""Measured bf16 8192^3 matmul over the datasheet peak on the project's H200 (module docstring)."""
H200_BW_EFFICIENCY = 4.3 / 4.8
"""Measured device-copy bandwidth over the datasheet figure on the project's H200 (module docstring)."""


@dataclass(frozen=True)
class RooflineComputeModel:
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
        sizes = np.unique(np.clip(np.concatenate(([1.0, kink], knots)), 1.0, max(knots[-1], 1.0)))
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
        if self.decode_graphs and not mixed:
            size = batch.logit_sequences
            correction_us = float(self._decode_correction_us(size)) if self.decode_batch_knots else 0.0
            return (self._time_us(size, pairs, batch.kv_read_tokens, size, max, 0.0) + self.decode_overhead_us
                    + correction_us + wave_us)
        roofline = self._time_us(batch.new_tokens, pairs, batch.kv_read_tokens, batch.logit_sequences, max, 0.0)
        return max(self.launch_floor_us, roofline + self.overhead_us + wave_us)

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
        eager = np.maximum(self.launch_floor_us, self._time_us(new, pairs, kv_read, logits, np.maximum, 0.0)
                           + self.overhead_us + wave_us)
        if not self.decode_graphs:
            return np.where(new > 0, eager, 0.0)
        graphed = (self._time_us(new, pairs, kv_read, logits, np.maximum, 0.0) + self.decode_overhead_us
                   + self._decode_correction_us(logits) + wave_us)
        return np.where(new > 0, np.where(mixed, eager, graphed), 0.0)

    def decode_run_us(self, batch_size: int, kv_read_tokens: int, attention_pairs: float, steps: int,
                      max_context_tokens: int = 0) -> np.ndarray:
        """Durations (us, shape ``[steps]``) of ``steps`` consecutive pure-decode iterations of the same
        ``batch_size`` sequences, the first reading ``kv_read_tokens`` cached tokens with
        ``attention_pairs`` pairs and its longest sequence attending to ``max_context_tokens`` keys; each later
        iteration reads ``batch_size`` more tokens (one more of each sequence)."""
        step = np.arange(steps, dtype=float)
        growth = step * batch_size
        if self.attention_key_us:
            size = np.full(steps, float(batch_size))
            return self._blocks_iteration_us(size, kv_read_tokens + growth, size, max_context_tokens + step,
                                             size, kv_read_tokens + growth + size)
        wave_us = self.wave_us_per_token * (max_context_tokens + step) if self.wave_us_per_token else 0.0
        if self.decode_graphs:
            return (self._time_us(batch_size, attention_pairs + growth, kv_read_tokens + growth, batch_size,
                                  np.maximum, 0.0) + self.decode_overhead_us + float(self._decode_correction_us(batch_size))
                    + wave_us)
        roofline = self._time_us(batch_size, attention_pairs + growth, kv_read_tokens + growth, batch_size,
                                 np.maximum, 0.0)
        return np.maximum(self.launch_floor_us, roofline + self.overhead_us + wave_us)

    def decode_run_iter(self, batch_size: int, kv_read_tokens: int, attention_pairs: float, steps: int,
                        max_context_tokens: int = 0) -> Iterator[float]:
        """:meth:`decode_run_us` one step at a time (us per iteration, the same floats bit for bit), so that
        the serving loop can stop at the next arrival without computing the steps after it.

        The roofline forms are evaluated in plain floats with the array form's order of operations (the
        terms constant over the run computed once); the block form yields its array's values."""
        if self.attention_key_us:
            yield from self.decode_run_us(batch_size, kv_read_tokens, attention_pairs, steps,
                                          max_context_tokens).tolist()
            return
        m, tp = self.model, self.tp
        maximum = max
        # _time_us's terms that do not depend on the step, then its sum's first partial (left to right)
        head = (maximum(2 * batch_size * self._linear_params / self._linear_flops_per_us,
                        self._weight_read_bytes(batch_size) / self._bytes_per_us)
                + 2 * batch_size * m.hidden_size * m.vocab_size / tp / self._flops_per_us)
        comm_us = self._comm_us(batch_size)
        heads_q = m.num_q_heads // tp
        flops_per_pair = 2 if m.uses_mla else 4
        pair_dim = m.attention_qk_dim + m.attention_v_dim if m.uses_mla else m.head_dim
        attention_flops_per_us = self._flops_per_us * self.attention_flops_efficiency
        kv_bytes_per_token, bytes_factor = self._kv_bytes_per_token, self.attention_bytes_factor
        bytes_per_us, layers = self._bytes_per_us, m.num_layers
        layout_factor = self.layout_attention_factor
        attention_factor, step_factors = self._decode_run_factors(batch_size, kv_read_tokens, steps)
        wave_per_token = self.wave_us_per_token
        graphs, floor_us, overhead_us = self.decode_graphs, self.launch_floor_us, self.overhead_us
        graph_overhead_us = self.decode_overhead_us
        correction_us = float(self._decode_correction_us(batch_size)) if graphs else 0.0
        # pairs and keys read grow by batch_size a step: integer-valued floats far below 2**53, so adding the
        # step's growth (the array form) or one batch_size a step gives the same floats
        pairs, kv_tokens = float(attention_pairs), kv_read_tokens + 0.0 + batch_size
        for step in range(steps):
            compute_us = flops_per_pair * pairs * heads_q * pair_dim * layers / attention_flops_per_us
            memory_us = kv_tokens * kv_bytes_per_token * bytes_factor / bytes_per_us
            if step_factors is not None:
                attention_factor = step_factors[step]
            attn_us = (compute_us if compute_us >= memory_us else memory_us) * attention_factor * layout_factor
            roofline = head + attn_us + comm_us + 0.0
            wave_us = wave_per_token * (max_context_tokens + float(step)) if wave_per_token else 0.0
            if graphs:
                yield roofline + graph_overhead_us + correction_us + wave_us
            else:
                eager_us = roofline + overhead_us + wave_us
                yield eager_us if eager_us >= floor_us else floor_us
            pairs += batch_size
            kv_tokens += batch_size

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

    def _decode_run_factors(self, batch_size: int, kv_read_tokens: int, steps: int):
        """``(factor, None)`` when a decode run's paged factor is one number, else ``(None, per-step list)``
        evaluated as :meth:`decode_run_us` evaluates it (the same floats)."""
        factors = self.paged_factors
        if factors is None:
            return self.paged_attention_factor, None
        if factors.decode_long is None:
            return factors.decode, None
        growth = np.arange(steps, dtype=float) * batch_size
        return None, np.broadcast_to(self._paged_factor(batch_size, kv_read_tokens + growth, batch_size),
                                     (steps,)).tolist()

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
        eager = np.maximum(self.launch_floor_us, base + attn + self.overhead_us)
        if not self.decode_graphs:
            return eager
        graphed = base + attn + self.decode_overhead_us + self._decode_correction_us(logits)
        return np.where(mixed, eager, graphed)

    def _blocks_one_us(self, batch: BatchShape) -> float:
        """:meth:`_blocks_iteration_us` of one iteration in plain floats (the simulator calls it once per
        stepped iteration; the array form costs numpy's per-call overhead several times over)."""
        m, tp = self.model, self.tp
        new, kv_read, logits, longest = batch.new_tokens, batch.kv_read_tokens, batch.logit_sequences, batch.max_context_tokens
        tau0, kappa, slots = self.attention_block_us, self.attention_key_us, self.attention_slots
        base = self._time_us(new, 0.0, kv_read, logits, max, 0.0, attention=False)
        if new > logits:   # a prefill chunk: blocks of 128 query rows per query head, keys never split
            kappa_p = self.attention_prefill_key_us or kappa
            if batch.attention_blocks > 0:
                n, k = batch.attention_blocks, batch.block_keys
            else:
                n, k = logits + math.ceil(max(new - logits, 0) / ATTENTION_TILE_ROWS), kv_read + new
            kappa_pt = self.attention_prefill_tail_key_us or kappa_p
            attn = _overlap((m.num_q_heads // tp) * (tau0 * n + kappa_p * k) / slots, tau0 + kappa_pt * longest,
                            self.attention_tail_serial, max, min)
        else:
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
            attn = _overlap(heads_kv * (tau0 * active + kappa * (kv_read + logits)) / slots,
                            tau0 + kappa_t * tail_keys, self.attention_tail_serial, max, min)
        attn *= m.num_layers * self._paged_factor(new, kv_read, logits) * self.layout_attention_factor
        if new > logits or not self.decode_graphs:
            return max(self.launch_floor_us, base + attn + self.overhead_us)
        return base + attn + self.decode_overhead_us + float(self._decode_correction_us(logits))

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
        table = {int(b): chunk(int(b)) for b in np.unique(sizes)}
        return np.array([table[int(b)] for b in sizes.ravel()], dtype=float).reshape(sizes.shape)

    def _time_us(self, new_tokens, attention_pairs, kv_read_tokens, logit_sequences, maximum, overhead_us,
                 attention: bool = True):
        m, tp = self.model, self.tp
        linear_us = maximum(2 * new_tokens * self._linear_params / self._linear_flops_per_us,
                            self._weight_read_bytes(new_tokens) / self._bytes_per_us)
        logits_us = 2 * logit_sequences * m.hidden_size * m.vocab_size / tp / self._flops_per_us
        if m.uses_mla:   # absorbed MLA (vLLM's decode path): q.k over latent + rope dims, p.v over the latent
            attn_flops = 2 * attention_pairs * (m.num_q_heads // tp) * (m.attention_qk_dim + m.attention_v_dim) * m.num_layers
        else:
            attn_flops = 4 * attention_pairs * (m.num_q_heads // tp) * m.head_dim * m.num_layers
        kv_bytes = (kv_read_tokens + new_tokens) * self._kv_bytes_per_token * self.attention_bytes_factor
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
    def _kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(self.tp)

    def _comm_us(self, new_tokens):
        """Time (us) of the ``2 N`` all-reduces of one iteration of ``new_tokens`` tokens (a number or an array),
        each of ``T h P`` bytes over the GPU's link, as NCCL costs them (:func:`nccl_allreduce_us`); 0 at tp 1.
        With a measured ``allreduce_bus_bytes_per_s`` (a profile's fit of Vidur's ``all_reduce.csv``,
        :mod:`hwbackend.calibration.vidur`) each costs ``base + hop (n - 1) + 2 (n - 1) / n * bytes / busbw``
        instead (nccl-tests' bus bandwidth, ``doc/PERFORMANCE.md``)."""
        if self.tp == 1:
            return 0.0
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


NCCL_BASE_LATENCY_US = {("tree", "ll"): 4.4, ("tree", "simple"): 0.0, ("ring", "ll"): 3.6, ("ring", "simple"): 8.4}
"""NCCL's fixed latency per collective by algorithm and protocol, us (``baseLat``, NVIDIA/nccl
``src/graph/tuning.cc``, commit 01afd20a; LL128 is left out: NCCL enables it by default on Volta and Ampere with
NVLink only, and its figures lie between LL's and Simple's)."""

NCCL_HOP_LATENCY_US = {
    True: {("tree", "ll"): 0.52, ("tree", "simple"): 28.0, ("ring", "ll"): 0.47, ("ring", "simple"): 3.4},
    False: {("tree", "ll"): 1.0, ("tree", "simple"): 28.0, ("ring", "ll"): 1.0, ("ring", "simple"): 5.7},
}
"""NCCL's latency per step inside one server, us, over NVLink (``True``) or PCIe (``False``) (``hwLat``, same
file)."""


def nccl_allreduce_us(nbytes, ranks: int, link_bytes_per_s: float, nvlink: bool):
    """Time (us) of one all-reduce of ``nbytes`` bytes (a number or an array) over ``ranks`` GPUs of one server,
    as NCCL's own cost model predicts it and picks the algorithm and protocol (``ncclTopoTuneModel`` and
    ``ncclTopoGetAlgoTime``, NVIDIA/nccl ``src/graph/tuning.cc``): the least over ring and tree, LL and Simple, of
    ``latency + nbytes / algorithm_bandwidth`` with

        ring latency = baseLat + 2 (n - 1) hwLat,   ring bandwidth = busBw n / (2 (n - 1))   (LL: busBw / 4)
        tree latency = baseLat + 2 (n - 1) hwLat,   tree bandwidth = min(0.9 busBw, 110 GB/s) / 2  (LL: / 3.8)

    ``busBw`` is the link's bus bandwidth per direction (``link_bytes_per_s``): nccl-tests' definition,
    ``busbw = algbw * 2 (n - 1) / n`` for all-reduce (nccl-tests ``doc/PERFORMANCE.md``), so large messages take
    ``2 (n - 1) / n * nbytes / busBw`` plus the ring's latency, and small ones NCCL's LL latency, 3.6 + 0.94 (n - 1)
    us on NVLink. Not modelled: the tree's size correction factors, LL128, NVLS (NVSwitch multicast), and vLLM's
    custom all-reduce kernel that replaces NCCL below 8 MiB on fully NVLink-connected GPUs.

    Raises:
        ValueError: ``ranks < 2`` or a link bandwidth that is not > 0.
    """
    if ranks < 2 or not link_bytes_per_s > 0:
        raise ValueError(f"an all-reduce needs ranks >= 2 and a link bandwidth > 0, got {ranks}, {link_bytes_per_s}")
    bus_bytes_per_us = link_bytes_per_s / US_PER_S
    tree_bytes_per_us = min(0.9 * bus_bytes_per_us, 110e9 / US_PER_S) * 0.5
    algorithm_bytes_per_us = {("ring", "simple"): bus_bytes_per_us * ranks / (2 * (ranks - 1)),
                              ("ring", "ll"): bus_bytes_per_us / 4 * ranks / (2 * (ranks - 1)),
                              ("tree", "simple"): tree_bytes_per_us, ("tree", "ll"): tree_bytes_per_us / 3.8}
    hops = NCCL_HOP_LATENCY_US[bool(nvlink)]
    best = None
    for key, rate in algorithm_bytes_per_us.items():
        time_us = NCCL_BASE_LATENCY_US[key] + 2 * (ranks - 1) * hops[key] + np.asarray(nbytes, dtype=float) / rate
        best = time_us if best is None else np.minimum(best, time_us)
    return float(best) if np.ndim(best) == 0 else best


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


def decode_batch(batch_size: int, context_tokens: int) -> BatchShape:
    """Shape of a pure decode iteration of ``batch_size`` sequences each with ``context_tokens`` cached."""
    return BatchShape(new_tokens=batch_size, attention_pairs=batch_size * (context_tokens + 1),
                      kv_read_tokens=batch_size * context_tokens, logit_sequences=batch_size,
                      max_context_tokens=context_tokens + 1)
