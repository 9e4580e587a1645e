"""Runs of consecutive pure-decode iterations of one batch, timed at once (:class:`DecodeRunForms`, mixed into
:class:`sim.timing.compute.RooflineComputeModel`: the serving loop's fast path between arrivals)."""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class DecodeRunForms:
    """The decode-run methods of :class:`sim.timing.compute.RooflineComputeModel` (which it is mixed into:
    ``self`` is that model; it holds no fields)."""

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
        return np.maximum(self._eager_floor_us, roofline + self.overhead_us + wave_us)

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
        graphs, floor_us, overhead_us = self.decode_graphs, self._eager_floor_us, self.overhead_us
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
