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
    """

    new_tokens: int
    attention_pairs: float
    kv_read_tokens: int
    logit_sequences: int


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

    def __post_init__(self) -> None:
        self.model.check_tp(self.tp)
        for name in ("flops_efficiency", "bw_efficiency", "attention_flops_efficiency", "paged_attention_factor",
                     "layout_attention_factor"):
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
        pairs = batch.attention_pairs
        if batch.new_tokens > batch.logit_sequences:      # a prefill chunk is in the batch
            pairs += self.mixed_tile_rows * batch.kv_read_tokens
        return max(self.launch_floor_us, self._time_us(batch.new_tokens, pairs, batch.kv_read_tokens,
                                                       batch.logit_sequences, max))

    def decode_run_us(self, batch_size: int, kv_read_tokens: int, attention_pairs: float, steps: int) -> np.ndarray:
        """Durations (us, shape ``[steps]``) of ``steps`` consecutive pure-decode iterations of the same
        ``batch_size`` sequences, the first reading ``kv_read_tokens`` cached tokens with
        ``attention_pairs`` pairs; each later iteration reads ``batch_size`` more of each."""
        growth = np.arange(steps, dtype=float) * batch_size
        return np.maximum(self.launch_floor_us, self._time_us(batch_size, attention_pairs + growth,
                                                              kv_read_tokens + growth, batch_size, np.maximum))

    def _time_us(self, new_tokens, attention_pairs, kv_read_tokens, logit_sequences, maximum):
        m, tp = self.model, self.tp
        linear_us = maximum(2 * new_tokens * self._linear_params / self._flops_per_us,
                            self._streamed_weight_bytes / self._bytes_per_us)
        logits_us = 2 * logit_sequences * m.hidden_size * m.vocab_size / tp / self._flops_per_us
        attn_flops = 4 * attention_pairs * (m.num_q_heads // tp) * m.head_dim * m.num_layers
        kv_bytes = (kv_read_tokens + new_tokens) * self._kv_bytes_per_token
        attn_us = maximum(attn_flops / (self._flops_per_us * self.attention_flops_efficiency),
                          kv_bytes / self._bytes_per_us) * self.paged_attention_factor * self.layout_attention_factor
        return linear_us + logits_us + attn_us + self._comm_us(new_tokens) + self.overhead_us

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
                 "paged_attention_factor", "layout_attention_factor", "mixed_tile_rows", "launch_floor_us"}
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"unknown compute fields {sorted(unknown)}; known: {sorted(known)}")
        return replace(self, **{k: float(v) for k, v in overrides.items()})


def decode_batch(batch_size: int, context_tokens: int) -> BatchShape:
    """Shape of a pure decode iteration of ``batch_size`` sequences each with ``context_tokens`` cached."""
    return BatchShape(new_tokens=batch_size, attention_pairs=batch_size * (context_tokens + 1),
                      kv_read_tokens=batch_size * context_tokens, logit_sequences=batch_size)
