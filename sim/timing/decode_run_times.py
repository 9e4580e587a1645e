"""Runs of consecutive pure-decode iterations of one batch, timed at once (:class:`DecodeRunForms`, mixed into
:class:`sim.timing.compute.RooflineComputeModel`: the serving loop's fast path between arrivals)."""
from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property

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
        """:meth:`decode_run_us` as plain floats (us per iteration, the same floats bit for bit): the durations
        of :meth:`decode_run_until` without a stop."""
        yield from self.decode_run_until(batch_size, kv_read_tokens, attention_pairs, steps, max_context_tokens,
                                         0.0, 0.0, float("inf"))[1]

    def decode_run_until(self, batch_size: int, kv_read_tokens: int, attention_pairs: float, steps: int,
                         max_context_tokens: int, start_us: float, step_extra_us: float, stop_us: float,
                         long_steps: int | None = None) -> tuple[list[float], list[float], list[float]] | None:
        """The steps of :meth:`decode_run_us`'s run that start before ``stop_us``, timed one at a time in plain
        floats (the array form's floats bit for bit), so that the serving loop computes no step after the next
        arrival: step ``i`` starts at ``starts_us[i]`` (the first at ``start_us``) and ends at
        ``start + (duration + step_extra_us)`` (us; ``step_extra_us`` the block-table time of each step).

        Returns ``(starts_us, compute_us, gaps_us)``: k + 1 starts (the last one the run's end), k durations
        and k step lengths ``end - start`` (us, lists), k <= ``steps``; or None when ``long_steps`` is given,
        the run has more steps than that and the first step's length puts ``stop_us`` more than ``long_steps``
        steps away (the caller then computes the run as arrays: cheaper than plain floats for long runs).

        The roofline forms are evaluated with the array form's order of operations (the terms constant over
        the run computed once); the block form takes its array's values (:func:`steps_until`)."""
        if self.attention_key_us:
            return steps_until(self.decode_run_us(batch_size, kv_read_tokens, attention_pairs, steps,
                                                  max_context_tokens).tolist(),
                               start_us, step_extra_us, stop_us, long_steps)
        head, comm_us, correction_us = self._decode_run_batch_terms(batch_size)
        (flops_per_pair, heads_q, pair_dim, layers, attention_flops_per_us, kv_bytes_per_token, bytes_factor,
         bytes_per_us, layout_factor, memory_per_pair_bound) = self._decode_run_terms
        attention_factor, step_factors = self._decode_run_factors(batch_size, kv_read_tokens, steps)
        wave_per_token = self.wave_us_per_token
        graphs, floor_us, overhead_us = self.decode_graphs, self._eager_floor_us, self.overhead_us
        graph_overhead_us = self.decode_overhead_us
        # pairs and keys read grow by batch_size a step: integer-valued floats far below 2**53, so adding the
        # step's growth (the array form) or one batch_size a step gives the same floats
        pairs, kv_tokens = float(attention_pairs), kv_read_tokens + 0.0 + batch_size
        # the attention's compute time is not evaluated where its memory time provably wins at every step
        # (_decode_run_terms: a margin far above the rounding of either; pairs never above keys read)
        memory_bound = memory_per_pair_bound and 0.0 <= pairs <= kv_tokens
        if memory_bound and step_factors is None and not wave_per_token:
            return _memory_bound_run(head, comm_us, graph_overhead_us if graphs else None, correction_us,
                                     overhead_us, floor_us, kv_bytes_per_token, bytes_factor, bytes_per_us,
                                     attention_factor, layout_factor, kv_tokens, float(batch_size), steps, start_us,
                                     step_extra_us, stop_us, long_steps)
        starts_us, compute_us, gaps_us = [start_us], [], []
        for step in range(steps):
            if start_us >= stop_us:
                break
            memory_us = kv_tokens * kv_bytes_per_token * bytes_factor / bytes_per_us
            if step_factors is not None:
                attention_factor = step_factors[step]
            if memory_bound:
                attn_us = memory_us * attention_factor * layout_factor
            else:
                attention_us = flops_per_pair * pairs * heads_q * pair_dim * layers / attention_flops_per_us
                attn_us = (attention_us if attention_us >= memory_us else memory_us) * attention_factor * layout_factor
            roofline = head + attn_us + comm_us + 0.0
            wave_us = wave_per_token * (max_context_tokens + float(step)) if wave_per_token else 0.0
            if graphs:
                duration_us = roofline + graph_overhead_us + correction_us + wave_us
            else:
                eager_us = roofline + overhead_us + wave_us
                duration_us = eager_us if eager_us >= floor_us else floor_us
            if not step and long_steps is not None and steps > long_steps \
                    and stop_us - start_us > long_steps * (duration_us + step_extra_us):
                return None
            end_us = start_us + (duration_us + step_extra_us)
            compute_us.append(duration_us)
            gaps_us.append(end_us - start_us)
            starts_us.append(end_us)
            start_us = end_us
            pairs += batch_size
            kv_tokens += batch_size
        return starts_us, compute_us, gaps_us

    def _decode_run_batch_terms(self, batch_size: int) -> tuple[float, float, float]:
        """``(head, comm_us, correction_us)`` of a decode run of ``batch_size`` sequences (us), kept per batch
        size (the model is frozen): the first partial of :meth:`_time_us`'s sum (linear layers, then logits,
        left to right), the TP communication, and the graphed decodes' correction (0 without graphs)."""
        terms = self._decode_run_batch_cache.get(batch_size)
        if terms is None:
            m, tp, maximum = self.model, self.tp, max
            head = (maximum(2 * batch_size * self._linear_params / self._linear_flops_per_us,
                            self._weight_read_bytes(batch_size) / self._bytes_per_us)
                    + 2 * batch_size * m.hidden_size * m.vocab_size / tp / self._flops_per_us)
            correction_us = float(self._decode_correction_us(batch_size)) if self.decode_graphs else 0.0
            terms = self._decode_run_batch_cache[batch_size] = (head, self._comm_us(batch_size), correction_us)
        return terms

    @cached_property
    def _decode_run_batch_cache(self) -> dict[int, tuple[float, float, float]]:
        return {}

    @cached_property
    def _decode_run_terms(self) -> tuple:
        """The attention terms of :meth:`decode_run_until` that depend on nothing of the run: ``(flops_per_pair,
        heads_q, pair_dim, layers, attention_flops_per_us, kv_bytes_per_token, bytes_factor, bytes_per_us,
        layout_factor, memory_per_pair_bound)``. ``memory_per_pair_bound``: the attention's memory time per key
        read exceeds its compute time per query-key pair by more than a factor 1 + 1e-9, both positive and
        finite, so that with pairs <= keys the memory time wins the roofline's max at every step whatever the
        rounding (each side is a few correctly rounded operations: relative errors ~1e-15)."""
        m, tp = self.model, self.tp
        flops_per_pair = 2 if m.uses_mla else 4
        heads_q = m.num_q_heads // tp
        pair_dim = m.attention_qk_dim + m.attention_v_dim if m.uses_mla else m.head_dim
        attention_flops_per_us = self._flops_per_us * self.attention_flops_efficiency
        kv_bytes_per_token, bytes_factor, bytes_per_us = (self._kv_bytes_per_token, self.attention_bytes_factor,
                                                          self._bytes_per_us)
        bound = False
        if attention_flops_per_us > 0 and bytes_per_us > 0:
            compute_per_pair = flops_per_pair * heads_q * pair_dim * m.num_layers / attention_flops_per_us
            memory_per_key = kv_bytes_per_token * bytes_factor / bytes_per_us
            bound = (0.0 <= compute_per_pair < float("inf") and memory_per_key < float("inf")
                     and memory_per_key > compute_per_pair * (1 + 1e-9))
        return (flops_per_pair, heads_q, pair_dim, m.num_layers, attention_flops_per_us, kv_bytes_per_token,
                bytes_factor, bytes_per_us, self.layout_attention_factor, bound)

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


def _memory_bound_run(head_us: float, comm_us: float, graph_overhead_us: float | None, correction_us: float,
                      overhead_us: float, floor_us: float, kv_bytes_per_token: float, bytes_factor: float,
                      bytes_per_us: float, attention_factor: float, layout_factor: float, kv_tokens: float,
                      growth: float, steps: int, start_us: float, step_extra_us: float, stop_us: float,
                      long_steps: int | None):
    """:meth:`DecodeRunForms.decode_run_until`'s loop where every step's attention is memory-bound, the paged
    factor one number and there is no wave term (the common case): the same operations in the same order, so
    the same floats (each dropped ``+ 0.0`` of the general loop is exact: every term is a positive float), with
    fewer branches per step. ``graph_overhead_us`` None: eager decodes (the eager floor applies).

    Compiled, it runs in C doubles (``decode_run_times.pxd`` types its arguments and locals; ``setup.py`` builds
    with ``-ffp-contract=off``, so each operation rounds once, as Python's floats do): the same floats, returned
    as Python floats where the source form may hand back numpy float64 scalars of the same value (a
    ``start_us`` that is one)."""
    starts_us, compute_us, gaps_us = [start_us], [], []
    graphs = graph_overhead_us is not None
    graph_us = graph_overhead_us if graphs else 0.0
    check_long = long_steps is not None and steps > long_steps     # decided on the first step's length
    for _ in range(steps):
        if start_us >= stop_us:
            break
        attn_us = kv_tokens * kv_bytes_per_token * bytes_factor / bytes_per_us * attention_factor * layout_factor
        if graphs:
            duration_us = head_us + attn_us + comm_us + graph_us + correction_us
        else:
            eager_us = head_us + attn_us + comm_us + overhead_us
            duration_us = eager_us if eager_us >= floor_us else floor_us
        if check_long:
            if stop_us - start_us > long_steps * (duration_us + step_extra_us):
                return None
            check_long = False
        end_us = start_us + (duration_us + step_extra_us)
        compute_us.append(duration_us)
        gaps_us.append(end_us - start_us)
        starts_us.append(end_us)
        start_us = end_us
        kv_tokens += growth
    return starts_us, compute_us, gaps_us


def steps_until(durations_us, start_us: float, step_extra_us: float, stop_us: float, long_steps: int | None = None):
    """:meth:`DecodeRunForms.decode_run_until` over given step durations (us, a sequence of floats: a model
    without the plain-float form); the same arguments and result."""
    steps = len(durations_us)
    if (long_steps is not None and steps > long_steps
            and stop_us - start_us > long_steps * (durations_us[0] + step_extra_us)):
        return None
    starts_us, compute_us, gaps_us = [start_us], [], []
    for duration_us in durations_us:
        if start_us >= stop_us:
            break
        end_us = start_us + (duration_us + step_extra_us)
        compute_us.append(duration_us)
        gaps_us.append(end_us - start_us)
        starts_us.append(end_us)
        start_us = end_us
    return starts_us, compute_us, gaps_us
