"""Compute-time model of one iteration: a documented roofline (Williams et al., CACM 2009) per worker.

For an iteration with ``T`` new tokens (prefill chunk tokens + one per decode), on one of ``tp`` workers::

    linear_us  = max(2 T W_lin / F,  (W_bytes - E_bytes) / B)       # projections + MLP: FLOPs vs weights read once
    logits_us  = 2 S h V / (tp F)                                     # LM head for the S sequences that emit a token
    attn_us    = max(4 A Hq' D N / F,  (K_read + T) * kv_bytes_per_token / B)
    comm_us    = 2 N * 2 (tp-1)/tp * T h P / nvlink   (tp > 1 only; two all-reduces per layer, ring)
    iteration  = linear_us + logits_us + attn_us + comm_us + overhead_us

``W_lin``: linear parameters per worker; ``E_bytes``: embedding table (only gathered rows are read);
``A``: attention (query, key) pairs, ``sum over sequences of q * (context + (q + 1) / 2)``; ``K_read``:
cached tokens read by attention; ``F = flops_efficiency * bf16_flops``; ``B = bw_efficiency * mem_bw``.

Defaults and their sources (domain.md, measurements on the project's H200):
* ``flops_efficiency = 788 / 989 = 0.797``: measured bf16 8192^3 matmul over the datasheet peak.
* ``bw_efficiency = 4.3 / 4.8 = 0.896``: measured device-copy bandwidth over the datasheet figure.
* ``overhead_us = 1300``: launch and framework overhead of one eager-PyTorch iteration, fitted to the
  four measured random-weight Llama-3-8B decode iterations of domain.md (batch 8 / ctx 1024: 5.1 ms,
  32 / 1024: 5.8, 64 / 2048: 8.9, 128 / 2048: 14.3); this model gives 5.05, 5.83, 8.87, 12.96 ms.
A calibration profile's ``compute`` section replaces any of them.

Two terms measured on the H200 replay (``kvsim calibrate --compute``, ``profiles/h200.json``
``compute.tiled_roofline``), both 0 by default:
* ``launch_floor_us``: a host-bound floor, ``iteration = max(launch_floor_us, roofline)`` (eager PyTorch
  launches ~450 kernels per iteration: below ~50 decodes the measured iteration stays at 8.5-9 ms);
* ``mixed_tile_rows``: in a batch that holds a prefill chunk (``new_tokens > logit_sequences``), one
  varlen FlashAttention call pads every decode to a full query tile: ``tile_rows * kv_read_tokens`` extra
  (query, key) pairs (measured: 48 decodes at 1,024 tokens plus a 64-token chunk take 18.2 ms, against
  9.6 ms and 7.3 ms for the two parts alone).

Decode iterations as CUDA graphs (``decode_graphs = 1``, as vLLM serves decodes and as the hardware replay
does by default, :class:`hwbackend.model.DecodeGraphs`): a decode-only iteration (``new_tokens ==
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
(:mod:`hwbackend.compute_inloop`, ``profiles/h200.json`` ``compute_in_loop``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from sim.catalog import GPUSpec, ModelSpec
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
    """

    new_tokens: int
    attention_pairs: float
    kv_read_tokens: int
    logit_sequences: int
    max_context_tokens: int = 0


@dataclass(frozen=True)
class RooflineComputeModel:
    """Iteration time for one model on one GPU type at tensor-parallel degree ``tp`` (see module docstring).

    Raises:
        CatalogError: if ``tp`` does not divide the model's heads (from :meth:`ModelSpec.check_tp`).
    """

    model: ModelSpec
    gpu: GPUSpec
    tp: int = 1
    flops_efficiency: float = 788 / 989
    bw_efficiency: float = 4.3 / 4.8
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

    def __post_init__(self) -> None:
        self.model.check_tp(self.tp)
        knots = self.decode_batch_knots
        if len(knots) != len(self.decode_batch_correction_us) or list(knots) != sorted(set(knots)):
            raise ValueError("decode_batch_knots must increase strictly and match decode_batch_correction_us "
                             f"in length, got {knots} and {self.decode_batch_correction_us}")
        for name in ("flops_efficiency", "bw_efficiency", "attention_flops_efficiency", "paged_attention_factor",
                     "layout_attention_factor", "attention_bytes_factor"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    @cached_property
    def _flops_per_us(self) -> float:
        return self.flops_efficiency * self.gpu.bf16_flops / US_PER_S

    @cached_property
    def _bytes_per_us(self) -> float:
        return self.bw_efficiency * self.gpu.mem_bw_bytes_per_s / US_PER_S

    def iteration_us(self, batch: BatchShape) -> float:
        """Modelled duration (us) of one iteration of ``batch``; 0 for an empty batch."""
        if batch.new_tokens <= 0:
            return 0.0
        mixed = batch.new_tokens > batch.logit_sequences  # a prefill chunk is in the batch
        pairs = batch.attention_pairs + (self.mixed_tile_rows * batch.kv_read_tokens if mixed else 0.0)
        wave_us = self.wave_us_per_token * batch.max_context_tokens
        if self.decode_graphs and not mixed:
            size = batch.logit_sequences
            return (self._time_us(size, pairs, batch.kv_read_tokens, size, max, 0.0) + self.decode_overhead_us
                    + float(self._decode_correction_us(size)) + wave_us)
        roofline = self._time_us(batch.new_tokens, pairs, batch.kv_read_tokens, batch.logit_sequences, max, 0.0)
        return max(self.launch_floor_us, roofline + self.overhead_us + wave_us)

    def _decode_correction_us(self, batch_size):
        """The measured per-batch-size correction of graphed decode iterations (piecewise linear between
        ``decode_batch_knots``, constant beyond the ends; 0 without knots)."""
        if not self.decode_batch_knots:
            return 0.0 * np.asarray(batch_size, dtype=float)
        return np.interp(batch_size, self.decode_batch_knots, self.decode_batch_correction_us)

    def iteration_us_array(self, new_tokens: np.ndarray, attention_pairs: np.ndarray, kv_read_tokens: np.ndarray,
                           logit_sequences: np.ndarray, max_context_tokens: np.ndarray | float = 0.0) -> np.ndarray:
        """:meth:`iteration_us` of many iterations at once (arrays of one length: the fields of
        :class:`BatchShape`); used by the fits (``hwbackend.compute_inloop``). Empty batches give 0."""
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
        wave_us = self.wave_us_per_token * (max_context_tokens + step) if self.wave_us_per_token else 0.0
        if self.decode_graphs:
            return (self._time_us(batch_size, attention_pairs + growth, kv_read_tokens + growth, batch_size,
                                  np.maximum, 0.0) + self.decode_overhead_us + float(self._decode_correction_us(batch_size))
                    + wave_us)
        roofline = self._time_us(batch_size, attention_pairs + growth, kv_read_tokens + growth, batch_size,
                                 np.maximum, 0.0)
        return np.maximum(self.launch_floor_us, roofline + self.overhead_us + wave_us)

    def _time_us(self, new_tokens, attention_pairs, kv_read_tokens, logit_sequences, maximum, overhead_us):
        m, tp = self.model, self.tp
        linear_us = maximum(2 * new_tokens * self._linear_params / self._flops_per_us,
                            self._streamed_weight_bytes / self._bytes_per_us)
        logits_us = 2 * logit_sequences * m.hidden_size * m.vocab_size / tp / self._flops_per_us
        attn_flops = 4 * attention_pairs * (m.num_q_heads // tp) * m.head_dim * m.num_layers
        kv_bytes = (kv_read_tokens + new_tokens) * self._kv_bytes_per_token * self.attention_bytes_factor
        attn_us = maximum(attn_flops / (self._flops_per_us * self.attention_flops_efficiency),
                          kv_bytes / self._bytes_per_us) * self.paged_attention_factor * self.layout_attention_factor
        return linear_us + logits_us + attn_us + self._comm_us(new_tokens) + overhead_us

    @cached_property
    def _linear_params(self) -> int:
        return self.model.num_layers * self.model.linear_params_per_layer(self.tp)

    @cached_property
    def _streamed_weight_bytes(self) -> int:
        """Weights read once per iteration: all but the embedding table (only gathered rows are read)."""
        m = self.model
        return m.weight_bytes(self.tp) - m.vocab_size * m.hidden_size * m.dtype_bytes // self.tp

    @cached_property
    def _kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(self.tp)

    def _comm_us(self, new_tokens: int) -> float:
        if self.tp == 1:
            return 0.0
        m = self.model
        bytes_per_allreduce = 2 * (self.tp - 1) / self.tp * new_tokens * m.hidden_size * m.dtype_bytes
        return 2 * m.num_layers * bytes_per_allreduce / (self.gpu.nvlink_bytes_per_s / US_PER_S)

    def with_overrides(self, overrides: dict) -> "RooflineComputeModel":
        """A copy with fields replaced from a profile's ``compute`` section.

        Raises:
            ValueError: naming an unknown field.
        """
        known = {"flops_efficiency", "bw_efficiency", "attention_flops_efficiency", "overhead_us",
                 "paged_attention_factor", "layout_attention_factor", "mixed_tile_rows", "launch_floor_us",
                 "decode_graphs", "decode_overhead_us", "attention_bytes_factor", "wave_us_per_token"}
        tables = {"decode_batch_knots", "decode_batch_correction_us"}
        unknown = set(overrides) - known - tables
        if unknown:
            raise ValueError(f"unknown compute fields {sorted(unknown)}; known: {sorted(known | tables)}")
        for name in tables & set(overrides):
            if not isinstance(overrides[name], (list, tuple)):
                raise ValueError(f"compute field {name} must be a list of numbers, got {overrides[name]!r}")
        try:
            return replace(self, **{k: tuple(float(x) for x in v) if k in tables else float(v)
                                    for k, v in overrides.items()})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"compute fields {sorted(overrides)}: {exc}") from None


def decode_batch(batch_size: int, context_tokens: int) -> BatchShape:
    """Shape of a pure decode iteration of ``batch_size`` sequences each with ``context_tokens`` cached."""
    return BatchShape(new_tokens=batch_size, attention_pairs=batch_size * (context_tokens + 1),
                      kv_read_tokens=batch_size * context_tokens, logit_sequences=batch_size,
                      max_context_tokens=context_tokens + 1)
