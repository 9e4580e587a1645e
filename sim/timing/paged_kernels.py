"""PagedAttention kernels: the attention-time factor of each paged kernel, per phase, against the contiguous
kernel the roofline models (vAttention's FlashAttention-2 over virtually contiguous KV).

A factor multiplies an iteration's attention time (:class:`sim.timing.compute.RooflineComputeModel`): the prefill
factor an iteration that holds a prefill chunk, the decode factor a decode-only iteration. Defaults per kernel
(``paged:kernel=NAME``; ``prefill_factor=`` / ``decode_factor=`` replace one phase's, ``factor=`` both):

======================  =======  =============================================  ==========================
kernel                  prefill  decode                                         source
======================  =======  =============================================  ==========================
``vllm-sosp23``         1.23     1.23                                           Kwon et al. SOSP'23 s7.1
``vllm-v0``             1.0      1.23 at <= 1,024 keys per sequence, 2.8 at     vAttention s7.1, s7.2
                                 >= 16,384, linear in between                   (Table 7, Figure 9)
``fa2-paged``           1.37     1.0                                            vAttention s3.3, s7.1-7.2
``flashinfer``          1.0      1.0                                            see below (no figure)
======================  =======  =============================================  ==========================

* ``vllm-sosp23`` (the default, today's model): vLLM's paged kernel has 20-26% higher attention latency than
  FasterTransformer's contiguous one (Kwon et al., SOSP'23, section 7.1, quoted in vAttention ASPLOS'25 section
  3.3.1); 1.23 is the middle of that range, for both phases.
* ``vllm-v0``: vLLM v0.2.7's paged decode kernel against FlashAttention-2's at 16K context: FlashAttention-2 up
  to 2.85x faster than the best vLLM configuration (block 16; Yi-6B, batch 16 x 16K; vAttention section 7.2,
  Figure 9; Table 7 of the ASPLOS'25 version: up to 2.8x). At short context the kernels differ little; the
  SOSP'23 1.23 is taken at 1,024 keys per sequence, and the factor is a straight line in the keys per sequence
  between (1,024, 1.23) and (16,384, 2.8), held at the ends (not extrapolated): a modelling choice through two
  published points, range [1.23, 2.8]. Prefill 1.0: vLLM v0 has no paged prefill kernel of its own and runs
  FlashAttention's (vAttention section 7.1: "it does not have a prefill kernel of its own but instead uses
  FlashAttention kernel").
* ``fa2-paged``: FlashAttention-2's own paged kernels (``flash_attn_with_kvcache`` with a block table): decode on
  par with the non-paged kernel (vAttention section 7.2), prefill up to 37% slower (vAttention sections 3.3 and
  7.1, chunked prefills of 2,048 tokens): 1.37, the published maximum (range [1.0, 1.37] over the paper's
  contexts; ``prefill_factor=`` sets another point).
* ``flashinfer``: FlashInfer's paged kernels are its primary path; the sources at hand give no overhead figure
  (``../shared/reference/vattention_article_zh.txt``, summarising vAttention section 7: its paged decode is on par
  with the contiguous kernel, its dedicated paged prefill "already stronger, the gap smaller" than
  FlashAttention-2's). 1.0 for both phases: the optimistic end of [1.0, 1.37].

The decode factor of a context-dependent kernel is evaluated at the iteration's mean keys per decoding sequence,
``kv_read_tokens / sequences + 1``. An iteration holding a prefill chunk takes the prefill factor for its whole
attention (one varlen call computes chunk and decodes together in FlashAttention-2's and FlashInfer's paged
paths, and in the replay); vLLM v0 runs the decodes of a mixed batch in its separate paged decode kernel, so for
``vllm-v0`` this understates the decodes' share in mixed iterations (the iteration's per-phase totals are not
kept in :class:`sim.timing.compute.BatchShape`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PagedFactors:
    """Attention-time factors of one paged kernel (dimensionless, >= 1).

    Attributes:
        prefill: factor of an iteration that holds a prefill chunk.
        decode: factor of a decode-only iteration (at ``short_tokens`` keys per sequence or fewer when
            ``decode_long`` is set).
        decode_long: decode factor at ``long_tokens`` keys per sequence or more; ``None``: ``decode`` at every
            context. Linear in the keys per sequence in between.
        short_tokens / long_tokens: the two knots (keys per sequence).
    """

    prefill: float
    decode: float
    decode_long: float | None = None
    short_tokens: float = 1024.0
    long_tokens: float = 16384.0

    @property
    def is_constant(self) -> bool:
        """One factor for both phases at every context."""
        return self.decode_long is None and self.prefill == self.decode

    def decode_at(self, keys_per_sequence):
        """Decode factor at ``keys_per_sequence`` (a number or an array): ``decode`` up to ``short_tokens``,
        ``decode_long`` from ``long_tokens``, linear in between (only +, -, *, / and clipping, so that the scalar
        and the array forms give the same floats)."""
        if self.decode_long is None:
            return self.decode
        span = self.long_tokens - self.short_tokens
        if np.ndim(keys_per_sequence) == 0:
            keys = min(max(float(keys_per_sequence), self.short_tokens), self.long_tokens)
        else:
            keys = np.minimum(np.maximum(np.asarray(keys_per_sequence, dtype=float), self.short_tokens),
                              self.long_tokens)
        return self.decode + (self.decode_long - self.decode) * ((keys - self.short_tokens) / span)

    def describe(self) -> str:
        """``prefill x1.37, decode x1`` or ``prefill x1, decode x1.23 (<= 1024 keys) to x2.8 (>= 16384 keys)``."""
        decode = f"x{self.decode:g}"
        if self.decode_long is not None:
            decode += f" (<= {self.short_tokens:g} keys) to x{self.decode_long:g} (>= {self.long_tokens:g} keys)"
        return f"prefill x{self.prefill:g}, decode {decode}"


PAGED_KERNELS: dict[str, PagedFactors] = {
    "vllm-sosp23": PagedFactors(prefill=1.23, decode=1.23),
    "vllm-v0": PagedFactors(prefill=1.0, decode=1.23, decode_long=2.8),
    "fa2-paged": PagedFactors(prefill=1.37, decode=1.0),
    "flashinfer": PagedFactors(prefill=1.0, decode=1.0),
}
"""Kernel name -> its default factors (sources: the module docstring)."""

DEFAULT_PAGED_KERNEL = "vllm-sosp23"
"""The kernel of ``paged`` without ``kernel=``: its 1.23 is :attr:`sim.setup.config.SimConfig.paged_attention_factor`'s
default, so that runs without the new keys are unchanged."""


def resolve_paged_factors(kernel: str | None, factor: float, prefill: float | None,
                          decode: float | None) -> PagedFactors:
    """The factors in force: a named ``kernel``'s defaults, else ``factor`` for both phases (``factor=``, or a
    profile's ``paged_attention.factor``, or 1.23); then ``prefill`` / ``decode`` where given (a given decode
    factor is constant over the context).

    Raises:
        KeyError: an unknown kernel (:class:`sim.setup.config.SimConfig` checks the name first).
    """
    base = PAGED_KERNELS[kernel] if kernel is not None else PagedFactors(prefill=factor, decode=factor)
    return PagedFactors(prefill=base.prefill if prefill is None else prefill,
                        decode=base.decode if decode is None else decode,
                        decode_long=base.decode_long if decode is None else None,
                        short_tokens=base.short_tokens, long_tokens=base.long_tokens)
