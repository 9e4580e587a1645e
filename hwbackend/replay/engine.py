"""Engine-like compute for the hardware replay (``--compute engine``; issue 30 item 1).

The harness decoder (:class:`hwbackend.replay.model.DecoderModel`, ``--compute harness``) launches ~20 kernels
per layer from Python (unfused norms, residual adds and activations, two K/V copies) and runs every phase's
attention through FlashAttention-2's varlen forward. :class:`EngineDecoderModel` computes the same layer with
the kernels a serving engine (vLLM v1, SGLang) launches:

* fused residual-add + RMSNorm and fused SiLU-and-mul (vLLM ``fused_add_rms_norm`` / ``silu_and_mul``), and
  one kernel that writes a token's K and V rows straight out of the QKV projection into the cache (vLLM
  ``reshape_and_cache``), as Triton kernels;
* split-KV ("flash-decoding", Dao et al. 2023) attention for decodes: a Triton kernel over the cache's slot
  rows (no copy), one program per (sequence, KV head, key split) holding the whole GQA group of query heads,
  then a kernel that merges the splits by their log-sum-exp (the scheme of vLLM's / SGLang's Triton decode
  attention, ``triton_decode_attention.py``);
* FlashAttention-2 varlen for prefill chunks over the cache without copies (as the harness's ``varlen``);
* CUDA graphs for decode-only iterations (as the harness, with fewer kernels inside);
* optionally (``piecewise_graphs``, :class:`EnginePiecewiseGraphs`) piecewise CUDA graphs for iterations with a
  prefill chunk of up to :data:`PIECEWISE_SIZES`' largest token count, as vLLM v1 runs them: everything but
  attention captured per padded token count, between layers' attention calls, which run eagerly (their grids
  depend on the batch's sequences).

Per layer: 1 norm, 3 GEMMs + the down GEMM, 1 K/V store, 2 attention kernels (decodes) and/or 1
(chunks), 1 SiLU-mul, 1 add+norm: 9-10 launches instead of ~20; with piecewise graphs, one graph launch and
the attention kernels (2-4 launches).

Tokens are packed decodes first (slot order), then chunks (slot order): :class:`EngineBatch`. On CPU (tests,
emulated replays) every kernel has a torch equivalent computing the same function (the split-KV one with the
same splits and merge), so the path runs without a GPU or Triton.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from hwbackend.replay.model import DecoderModel, SeqWork, capture_graphs, reference_attention

try:  # Triton ships with CUDA builds of torch; absent on CPU-only machines
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = tl = None

COMPUTE_MODES = ("harness", "engine")
"""``--compute``: ``harness`` (:class:`hwbackend.replay.model.DecoderModel`, the replays before 2026-12) or
``engine`` (:class:`EngineDecoderModel`)."""

DECODE_BLOCK_KEYS = 64
"""Keys per tile of the split-KV decode kernel (vLLM's Triton decode attention uses 64 for head dim 128)."""
DECODE_TILE = (DECODE_BLOCK_KEYS, 4, 2)
"""(keys per tile, warps, pipeline stages) of the split-KV decode kernel; ``KVSIM_DECODE_TILE=N,W,S`` overrides it
(:func:`decode_tile`; the tuning of ``docs/validation/engine-profile/tune_decode.py`` picks one on the GPU)."""


def decode_tile() -> tuple[int, int, int]:
    """The split-KV decode tile (:data:`DECODE_TILE`, or ``KVSIM_DECODE_TILE`` = ``keys,warps,stages``).

    Raises:
        ValueError: a ``KVSIM_DECODE_TILE`` that is not three integers, keys a power of two in 16..256, warps in
            1, 2, 4, 8, stages in 1..5.
    """
    import os

    text = os.environ.get("KVSIM_DECODE_TILE")
    if not text:
        return DECODE_TILE
    try:
        keys, warps, stages = (int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"KVSIM_DECODE_TILE={text!r}: expected keys,warps,stages (three integers)") from None
    if keys not in (16, 32, 64, 128, 256) or warps not in (1, 2, 4, 8) or not 1 <= stages <= 5:
        raise ValueError(f"KVSIM_DECODE_TILE={text!r}: keys must be a power of two in 16..256, warps 1/2/4/8, "
                         "stages 1..5")
    return keys, warps, stages
MAX_DECODE_SPLITS = 64
PROGRAMS_PER_SM = 4


def decode_splits(num_decodes: int, kv_heads: int, sms: int = 132) -> int:
    """Key splits of the split-KV decode for a batch of ``num_decodes`` sequences: enough programs
    (``decodes x kv_heads x splits``) for ``PROGRAMS_PER_SM`` per multiprocessor, 1..``MAX_DECODE_SPLITS``.
    The split length adapts to each sequence's context inside the kernel (``ceil(len / splits)`` rounded up
    to :data:`DECODE_BLOCK_KEYS`), so one value serves a captured graph of every context. 132 SMs: the H200."""
    return max(1, min(MAX_DECODE_SPLITS, -(-PROGRAMS_PER_SM * sms // max(1, num_decodes * kv_heads))))


if triton is not None:
    @triton.jit
    def _decode_split_kernel(Q, K, V, Starts, Lens, PartO, PartL, stride_qt, stride_qh, stride_kr, stride_kh,
                             stride_vr, stride_vh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, scale,
                             num_splits, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
                             HEAD_DIM: tl.constexpr):
        seq, kvh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        length = tl.load(Lens + seq)
        start_row = tl.load(Starts + seq)
        split_len = tl.cdiv(tl.cdiv(length, num_splits), BLOCK_N) * BLOCK_N
        lo = split * split_len
        hi = tl.minimum(lo + split_len, length)
        g, d, n = tl.arange(0, BLOCK_G), tl.arange(0, HEAD_DIM), tl.arange(0, BLOCK_N)
        heads = kvh * GROUP + g
        gmask = g < GROUP
        q = tl.load(Q + seq * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
        for s in range(lo, hi, BLOCK_N):
            keys = s + n
            kmask = keys < hi
            rows = start_row + keys
            k = tl.load(K + rows[:, None] * stride_kr + kvh * stride_kh + d[None, :], mask=kmask[:, None], other=0.0)
            qk = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
            qk = tl.where(kmask[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.exp(qk - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + rows[:, None] * stride_vr + kvh * stride_vh + d[None, :], mask=kmask[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m_i = m_new
        has = l_i > 0
        out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(PartO + seq * stride_pt + heads[:, None] * stride_ph + split * stride_ps + d[None, :], out,
                 mask=gmask[:, None])
        tl.store(PartL + seq * stride_lt + heads * stride_lh + split, lse, mask=gmask)

    @triton.jit
    def _decode_merge_kernel(PartO, PartL, Out, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_ot,
                             stride_oh, num_splits, BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr):
        seq, head = tl.program_id(0), tl.program_id(1)
        s, d = tl.arange(0, BLOCK_S), tl.arange(0, HEAD_DIM)
        smask = s < num_splits
        lse = tl.load(PartL + seq * stride_lt + head * stride_lh + s, mask=smask, other=float("-inf"))
        weight = tl.exp(lse - tl.max(lse, 0))
        weight = weight / tl.sum(weight, 0)
        o = tl.load(PartO + seq * stride_pt + head * stride_ph + s[:, None] * stride_ps + d[None, :],
                    mask=smask[:, None], other=0.0)
        tl.store(Out + seq * stride_ot + head * stride_oh + d, tl.sum(o * weight[:, None], 0).to(Out.dtype.element_ty))

    @triton.jit
    def _add_rms_norm_kernel(X, Delta, W, H, stride_x, stride_d, stride_h, N, eps, HAS_DELTA: tl.constexpr,
                             BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_DELTA:
            x += tl.load(Delta + row * stride_d + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(X + row * stride_x + cols, x.to(X.dtype.element_ty), mask=mask)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / N + eps)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(H + row * stride_h + cols, (x * rstd * w).to(H.dtype.element_ty), mask=mask)

    @triton.jit
    def _silu_mul_kernel(GU, Out, stride_g, stride_o, F, BLOCK: tl.constexpr):
        row, block = tl.program_id(0), tl.program_id(1)
        cols = block * BLOCK + tl.arange(0, BLOCK)
        mask = cols < F
        gate = tl.load(GU + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(GU + row * stride_g + F + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Out + row * stride_o + cols, (gate / (1.0 + tl.exp(-gate)) * up).to(Out.dtype.element_ty), mask=mask)

    @triton.jit
    def _store_kv_kernel(QKV, Rows, K, V, stride_t, k_offset, v_offset, stride_kr, stride_vr,
                         KV_DIM: tl.constexpr, BLOCK: tl.constexpr):
        t = tl.program_id(0)
        row = tl.load(Rows + t)
        cols = tl.arange(0, BLOCK)
        mask = (cols < KV_DIM) & (row >= 0)     # row -1: a padding token of a piecewise graph, not stored
        k = tl.load(QKV + t * stride_t + k_offset + cols, mask=mask)
        v = tl.load(QKV + t * stride_t + v_offset + cols, mask=mask)
        tl.store(K + row * stride_kr + cols, k, mask=mask)
        tl.store(V + row * stride_vr + cols, v, mask=mask)


def use_triton(tensor: Any) -> bool:
    """Whether the Triton kernels run on ``tensor``'s device: CUDA with Triton importable, or any device under
    Triton's interpreter (``TRITON_INTERPRET=1``, the CPU tests)."""
    import os

    return triton is not None and (tensor.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def _pow2(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


def split_kv_decode(q: Any, k_flat: Any, v_flat: Any, starts: Any, lens: Any, splits: int,
                    triton_kernels: bool | None = None, out: Any = None) -> Any:
    """Split-KV attention of one query per sequence over its cache rows.

    Args:
        q: ``[n, Hq, D]`` queries. k_flat / v_flat: ``[rows, H', D]`` cache (row stride ``H' * D``).
        starts: ``[n]`` int64 first row of each sequence (``slot * L_max``). lens: ``[n]`` int32 keys each
            sequence attends to (cached + the new one). splits: key splits (:func:`decode_splits`).
        triton_kernels: run the Triton kernels (default: :func:`use_triton`), else the torch equivalent.
        out: ``[n, Hq, D]`` tensor to write the result into (default: a new one).
    Returns:
        ``[n, Hq, D]`` in ``q``'s dtype (``out`` when given).
    """
    import torch

    if not 1 <= splits <= MAX_DECODE_SPLITS:
        raise ValueError(f"splits {splits}: must lie in 1..{MAX_DECODE_SPLITS}")
    n, hq, dim = q.shape
    hkv = k_flat.shape[1]
    group = hq // hkv
    scale = 1.0 / math.sqrt(dim)
    if triton_kernels is None:
        triton_kernels = use_triton(q)
    if not triton_kernels:
        result = _split_kv_decode_torch(q, k_flat, v_flat, starts, lens, splits, scale)
        return result if out is None else out.copy_(result)
    block_keys, warps, stages = decode_tile()
    part_o = torch.empty((n, hq, splits, dim), device=q.device, dtype=torch.float32)
    part_l = torch.empty((n, hq, splits), device=q.device, dtype=torch.float32)
    out = torch.empty_like(q) if out is None else out
    _decode_split_kernel[(n, hkv, splits)](
        q, k_flat, v_flat, starts, lens, part_o, part_l, q.stride(0), q.stride(1), k_flat.stride(0), k_flat.stride(1),
        v_flat.stride(0), v_flat.stride(1), part_o.stride(0), part_o.stride(1), part_o.stride(2), part_l.stride(0),
        part_l.stride(1), scale, splits, GROUP=group, BLOCK_G=max(16, _pow2(group)), BLOCK_N=block_keys,
        HEAD_DIM=dim, num_warps=warps, num_stages=stages)
    _decode_merge_kernel[(n, hq)](
        part_o, part_l, out, part_o.stride(0), part_o.stride(1), part_o.stride(2), part_l.stride(0), part_l.stride(1),
        out.stride(0), out.stride(1), splits, BLOCK_S=_pow2(MAX_DECODE_SPLITS), HEAD_DIM=dim)
    return out


def _split_kv_decode_torch(q: Any, k_flat: Any, v_flat: Any, starts: Any, lens: Any, splits: int,
                           scale: float) -> Any:
    """The split-KV decode's function in torch (per sequence, the kernel's splits and log-sum-exp merge)."""
    import torch

    hkv = k_flat.shape[1]
    group = q.shape[1] // hkv
    outs = []
    for b in range(q.shape[0]):
        length, start = int(lens[b]), int(starts[b])
        block_keys = decode_tile()[0]
        split_len = -(-(-(-length // splits)) // block_keys) * block_keys
        qb = q[b].float().view(hkv, group, -1)                                # [H', G, D]
        parts, lses = [], []
        for lo in range(0, length, split_len):
            hi = min(lo + split_len, length)
            k = k_flat[start + lo:start + hi].float().transpose(0, 1)          # [H', n, D]
            v = v_flat[start + lo:start + hi].float().transpose(0, 1)
            scores = qb @ k.transpose(1, 2) * scale                            # [H', G, n]
            lse = torch.logsumexp(scores, dim=-1)                              # [H', G]
            parts.append(torch.softmax(scores, dim=-1) @ v)                    # [H', G, D]
            lses.append(lse)
        weight = torch.softmax(torch.stack(lses), dim=0)                       # [splits, H', G]
        outs.append((torch.stack(parts) * weight[..., None]).sum(0).reshape(q.shape[1], -1))
    return torch.stack(outs).to(q.dtype)


def add_rms_norm(x: Any, delta: Any | None, weight: Any, eps: float = 1e-5) -> Any:
    """``x += delta`` in place (when given), then ``rms_norm(x) * weight``; ``x``: ``[T, N]``. Returns ``[T, N]``."""
    import torch
    import torch.nn.functional as F

    if not use_triton(x):
        if delta is not None:
            x.add_(delta)
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = torch.empty_like(x)
    if x.shape[0]:
        _add_rms_norm_kernel[(x.shape[0],)](x, x if delta is None else delta, weight, h, x.stride(0),
                                            0 if delta is None else delta.stride(0), h.stride(0), x.shape[1], eps,
                                            HAS_DELTA=delta is not None, BLOCK=_pow2(x.shape[1]), num_warps=8)
    return h


def silu_mul(gate_up: Any) -> Any:
    """``silu(gate) * up`` of ``gate_up = [gate | up]`` (``[T, 2F]`` -> ``[T, F]``)."""
    import torch
    import torch.nn.functional as F

    ffn = gate_up.shape[1] // 2
    if not use_triton(gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
    out = torch.empty((gate_up.shape[0], ffn), device=gate_up.device, dtype=gate_up.dtype)
    if gate_up.shape[0]:
        block = 1024
        _silu_mul_kernel[(gate_up.shape[0], -(-ffn // block))](gate_up, out, gate_up.stride(0), out.stride(0), ffn,
                                                              BLOCK=block, num_warps=4)
    return out


def store_kv(qkv: Any, rows: Any, k_flat: Any, v_flat: Any, q_dim: int, kv_dim: int) -> None:
    """Write each token's K and V (columns ``q_dim..`` of ``qkv [T, q + 2 kv]``) into cache rows ``rows [T]``;
    a row of -1 (a padding token of :class:`EnginePiecewiseGraphs`) is not written."""
    if not use_triton(qkv):
        heads = k_flat.shape[1]
        keep = rows >= 0
        if not bool(keep.all()):     # CPU only (the torch path): padding rows dropped
            qkv, rows = qkv[keep], rows[keep]
        k_flat.index_copy_(0, rows, qkv[:, q_dim:q_dim + kv_dim].reshape(-1, heads, kv_dim // heads))
        v_flat.index_copy_(0, rows, qkv[:, q_dim + kv_dim:].reshape(-1, heads, kv_dim // heads))
        return
    if qkv.shape[0]:
        _store_kv_kernel[(qkv.shape[0],)](qkv, rows, k_flat, v_flat, qkv.stride(0), q_dim, q_dim + kv_dim,
                                          k_flat.stride(0), v_flat.stride(0), KV_DIM=kv_dim, BLOCK=_pow2(kv_dim),
                                          num_warps=4)


class EngineBatch:
    """Index tensors of one iteration for :class:`EngineDecoderModel`, built on the host and sent in one copy.

    Tokens are packed decodes first, then prefill chunks (a sequence with one new token is a decode: one
    query at position ``computed`` over ``computed + 1`` keys). Both parts are slot-ascending.

    Attributes:
        work: the sequences in packed order. num_tokens / num_decodes: T and n_d. write_rows: [T] int64.
        dec_starts: [n_d] int64 first cache row of each decode's slot. dec_lens: [n_d] int32 keys.
        cu_seq_q / cu_seq_k / seqused_k: FlashAttention varlen arguments of the chunks (queries counted from
        the first chunk token). max_q / max_k: ints. logit_rows: [S] packed index of each emitting sequence's
        last token. splits: :func:`decode_splits` of n_d.
    """

    def __init__(self, work: list[SeqWork], slot_tokens: int, device: Any, kv_heads: int = 8, sms: int = 132):
        import torch

        decodes = sorted((w for w in work if w.tokens == 1), key=lambda w: w.slot)
        chunks = sorted((w for w in work if w.tokens > 1), key=lambda w: w.slot)
        self.work = decodes + chunks
        self.num_decodes = n_d = len(decodes)
        tokens = np.array([w.tokens for w in self.work], dtype=np.int64)
        computed = np.array([w.computed for w in self.work], dtype=np.int64)
        slots = np.array([w.slot for w in self.work], dtype=np.int64)
        cu = np.concatenate(([0], np.cumsum(tokens)))
        total = int(cu[-1])
        write_rows = np.repeat(slots * slot_tokens + computed, tokens) + (np.arange(total) - np.repeat(cu[:-1], tokens))
        used = computed + tokens
        c_slots, c_tokens = slots[n_d:], tokens[n_d:]
        cu_q = np.concatenate(([0], np.cumsum(c_tokens)))
        cu_k = (np.concatenate((c_slots * slot_tokens, [(c_slots[-1] + 1) * slot_tokens])) if len(chunks)
                else np.zeros(1, dtype=np.int64))
        logit_rows = (cu[1:] - 1)[[w.emits for w in self.work]]
        parts = (write_rows, slots[:n_d] * slot_tokens, used[:n_d], cu_q, cu_k, used[n_d:], logit_rows)
        flat = torch.from_numpy(np.concatenate(parts)).to(device, non_blocking=True)
        split = torch.split(flat, [len(p) for p in parts])
        self.write_rows, self.dec_starts, self.logit_rows = split[0], split[1], split[6]
        self.dec_lens, self.cu_seq_q, self.cu_seq_k, self.seqused_k = (p.to(torch.int32) for p in split[2:6])
        self.num_tokens, self.slot_tokens = total, slot_tokens
        self.max_q = int(c_tokens.max()) if len(chunks) else 0
        self.max_k = int(used[n_d:].max()) if len(chunks) else 0
        self.splits = decode_splits(n_d, kv_heads, sms)
        self.host_cu_q, self.chunk_work = cu_q, chunks


class EngineDecoderModel(DecoderModel):
    """The harness decoder's weights (same seed, same values) computed with engine kernels (module docstring).

    Args: as :class:`hwbackend.replay.model.DecoderModel`; ``attention`` names the prefill-chunk backend
    (``varlen`` on CUDA, ``reference`` on CPU); decodes always use :func:`split_kv_decode`.
    """

    def __init__(self, shape: Any, device: str = "cuda:0", seed: int = 0, attention: str = "varlen"):
        import torch

        super().__init__(shape, device, seed, attention)
        self.sms = (torch.cuda.get_device_properties(self.device).multi_processor_count
                    if self.device.type == "cuda" else 132)
        self.piecewise: EnginePiecewiseGraphs | None = None

    @property
    def graph_class(self) -> type:
        """The decode graphs :func:`hwbackend.replay.model.capture_decode_graphs` captures for this model."""
        return EngineDecodeGraphs

    def batch_inputs(self, work: list[SeqWork], slot_tokens: int, device: Any) -> EngineBatch:
        """The replay loop's hook (:class:`hwbackend.replay.loop.ReplayLoop`): this model's index tensors."""
        return EngineBatch(work, slot_tokens, device, self.shape.num_kv_heads, self.sms)

    def forward(self, batch: EngineBatch, k_flat: list[Any], v_flat: list[Any]) -> Any:
        """One iteration (graph replay for decode-only batches of a captured size; piecewise graphs, when captured,
        for other batches of up to their largest token count); next token ids ``[S]``."""
        if (self.graphs is not None and batch.num_decodes == batch.num_tokens and batch.num_tokens in self.graphs.sizes
                and batch.logit_rows.shape[0] == batch.num_tokens):
            return self.graphs.replay(batch)
        if self.piecewise is not None and batch.num_tokens <= self.piecewise.max_tokens:
            return self.piecewise.replay(batch, k_flat, v_flat)
        return self.eager_forward(batch, k_flat, v_flat)

    def eager_forward(self, batch: Any, k_flat: list[Any], v_flat: list[Any], return_logits: bool = False) -> Any:
        """As :meth:`DecoderModel.eager_forward`, with fused kernels and split-KV decodes."""
        import torch
        import torch.nn.functional as F

        s = self.shape
        q_dim, kv_dim = s.num_q_heads * s.head_dim, s.num_kv_heads * s.head_dim
        n_d = batch.num_decodes
        x = self.embed[torch.zeros(batch.num_tokens, dtype=torch.long, device=self.device)]
        h = add_rms_norm(x, None, self.layers[0]["norm1"])
        for layer, w in enumerate(self.layers):
            qkv = F.linear(h, w["qkv"])
            store_kv(qkv, batch.write_rows, k_flat[layer], v_flat[layer], q_dim, kv_dim)
            q = qkv[:, :q_dim].view(-1, s.num_q_heads, s.head_dim)
            a = self.attend(q, k_flat[layer], v_flat[layer], batch, n_d)
            h = self.layer_tail(x, a.view(-1, q_dim), layer)
        logits = F.linear(h[batch.logit_rows], self.lm_head)
        return logits if return_logits else logits.argmax(dim=-1)

    def layer_tail(self, x: Any, a: Any, layer: int) -> Any:
        """Layer ``layer``'s part after attention: output projection of ``a [T, Hq * D]`` added to the residual
        ``x [T, hidden]`` (in place) and normalised, the MLP added likewise, then the next layer's input norm (the
        final norm after the last layer); returns that norm's output ``[T, hidden]``. Shared by
        :meth:`eager_forward` and the piecewise graphs' :meth:`pieces`, so both compute the same arithmetic."""
        import torch.nn.functional as F

        w = self.layers[layer]
        h = add_rms_norm(x, F.linear(a, w["o"]), w["norm2"])
        down = F.linear(silu_mul(F.linear(h, w["gate_up"])), w["down"])
        nxt = self.layers[layer + 1]["norm1"] if layer + 1 < len(self.layers) else self.final_norm
        return add_rms_norm(x, down, nxt)

    def attend(self, q: Any, k_flat: Any, v_flat: Any, batch: Any, n_d: int, out: Any = None) -> Any:
        """Decodes (first ``n_d`` rows) by split-KV, chunks by FlashAttention varlen (CPU: the reference);
        written into ``out`` (``[T, Hq, D]``) when given, else into a new tensor, which is returned."""
        import torch

        if n_d == q.shape[0]:
            return split_kv_decode(q, k_flat, v_flat, batch.dec_starts, batch.dec_lens, batch.splits, out=out)
        out = torch.empty_like(q) if out is None else out
        if n_d:
            split_kv_decode(q[:n_d], k_flat, v_flat, batch.dec_starts, batch.dec_lens, batch.splits, out=out[:n_d])
        qc = q[n_d:]
        if self.attention == "varlen":
            out[n_d:] = torch.ops.aten._flash_attention_forward(
                qc, k_flat, v_flat, batch.cu_seq_q, batch.cu_seq_k, batch.max_q, batch.max_k, 0.0, True, False,
                scale=1.0 / math.sqrt(q.shape[-1]), seqused_k=batch.seqused_k)[0]
        else:
            out[n_d:] = reference_attention(qc, k_flat, v_flat, _ChunkView(batch))
        return out

    def pieces(self, n: int, graphs: "EnginePiecewiseGraphs", k_flat: list[Any], v_flat: list[Any]) -> list[Any]:
        """The ``num_layers + 1`` pieces of :meth:`eager_forward` between attention calls, for ``n`` (padded)
        tokens over ``graphs``' static buffers: piece 0 embeds, normalises and projects layer 0's QKV and stores
        its K/V; piece ``l`` (1..L-1) runs layer ``l - 1``'s output projection and MLP, then layer ``l``'s norm, QKV
        and K/V store; piece L ends the last layer and returns the final norm's output ``[n, hidden]``. The same
        kernels and arithmetic as :meth:`eager_forward` (QKV written into the static buffer by ``out=``)."""
        import torch

        s = self.shape
        q_dim, kv_dim = s.num_q_heads * s.head_dim, s.num_kv_heads * s.head_dim
        x, qkv, attn, rows = graphs.x[:n], graphs.qkv[:n], graphs.attn[:n].view(n, q_dim), graphs.rows[:n]
        layers = self.layers

        def project(h: Any, layer: int) -> None:      # layer's QKV into the static buffer, its K/V into the cache
            torch.matmul(h, layers[layer]["qkv"].t(), out=qkv)
            store_kv(qkv, rows, k_flat[layer], v_flat[layer], q_dim, kv_dim)

        def first() -> None:
            x.copy_(self.embed[0].expand(n, -1))
            project(add_rms_norm(x, None, layers[0]["norm1"]), 0)

        def between(layer: int):
            def piece() -> Any:
                h = self.layer_tail(x, attn, layer - 1)
                if layer == len(layers):
                    return h
                project(h, layer)
                return None
            return piece

        return [first] + [between(layer) for layer in range(1, len(layers) + 1)]


PIECEWISE_SIZES = (16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448, 480, 512)
"""Token counts the piecewise graphs are captured for; a batch runs the smallest that holds it (its padding tokens
computed and not stored). vLLM v1's default capture sizes end at 512 tokens too (``max_capture_size``; its
steps are 8 to 256, then 16): larger batches run eagerly there as here."""


class EnginePiecewiseGraphs:
    """Piecewise CUDA graphs of :class:`EngineDecoderModel` (vLLM v1's scheme for batches with prefill chunks):
    per token count in ``sizes``, the ``num_layers + 1`` pieces of :meth:`EngineDecoderModel.pieces` captured as
    graphs into one memory pool over static buffers; at replay the batch's write rows go into the static row
    buffer (padding rows -1: :func:`store_kv` skips them), each piece's graph is launched and each layer's
    attention runs eagerly between them over the batch's own index tensors (its ``[T]`` real rows of the static
    query / output buffers), and the logits of the emitting rows are computed eagerly from the last piece's
    output.

    Args:
        model: the decoder. k_flat / v_flat: the cache views (fixed virtual addresses). sizes: token counts.
        capture: capture CUDA graphs (CUDA only); False runs the pieces as plain calls (the CPU tests' check that
            pieces and padding compute what :meth:`EngineDecoderModel.eager_forward` computes).

    Raises:
        RuntimeError: from CUDA if a capture fails.
    """

    def __init__(self, model: EngineDecoderModel, k_flat: list[Any], v_flat: list[Any],
                 sizes: Any = PIECEWISE_SIZES, capture: bool = True):
        import time

        import torch

        started = time.perf_counter()
        s, device = model.shape, model.device
        self.model, self.sizes = model, sorted(set(int(n) for n in sizes))
        self.max_tokens = self.sizes[-1]
        top = self.max_tokens
        q_dim, kv_dim = s.num_q_heads * s.head_dim, s.num_kv_heads * s.head_dim
        self.x = torch.zeros(top, s.hidden_size, device=device, dtype=model.dtype)
        self.qkv = torch.zeros(top, q_dim + 2 * kv_dim, device=device, dtype=model.dtype)
        self.attn = torch.zeros(top, s.num_q_heads, s.head_dim, device=device, dtype=model.dtype)
        self.rows = torch.full((top,), -1, device=device, dtype=torch.long)
        self.calls: dict[int, list[Any]] = {n: model.pieces(n, self, k_flat, v_flat) for n in self.sizes}
        self.graphs: dict[int, list[Any]] | None = None
        self.outputs: dict[int, Any] = {}
        if capture:
            self.graphs = {}
            pool = torch.cuda.graph_pool_handle()
            side = torch.cuda.Stream(device=device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for n in reversed(self.sizes):
                    for call in self.calls[n]:     # warm-up: kernels chosen, workspaces allocated; rows all -1
                        call()
                    graphs = []
                    for call in self.calls[n]:
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph, pool=pool, stream=side):
                            result = call()
                        graphs.append(graph)
                    self.graphs[n], self.outputs[n] = graphs, result
            torch.cuda.current_stream(device).wait_stream(side)
            torch.cuda.synchronize(device)
        self.capture_s = time.perf_counter() - started

    def bucket(self, num_tokens: int) -> int:
        """The smallest captured token count >= ``num_tokens``.

        Raises:
            ValueError: ``num_tokens`` above :attr:`max_tokens`.
        """
        import bisect

        index = bisect.bisect_left(self.sizes, num_tokens)
        if index == len(self.sizes):
            raise ValueError(f"{num_tokens} tokens: piecewise graphs hold at most {self.max_tokens}")
        return self.sizes[index]

    def replay(self, batch: EngineBatch, k_flat: list[Any], v_flat: list[Any]) -> Any:
        """One iteration of ``batch`` (:class:`EngineBatch`, at most :attr:`max_tokens` tokens); next token ids
        ``[S]``."""
        import torch.nn.functional as F

        model, s = self.model, self.model.shape
        t, n = batch.num_tokens, self.bucket(batch.num_tokens)
        self.rows[:t].copy_(batch.write_rows)
        if n > t:
            self.rows[t:n].fill_(-1)
        q = self.qkv[:t, :s.num_q_heads * s.head_dim].view(t, s.num_q_heads, s.head_dim)
        steps = self.graphs[n] if self.graphs is not None else self.calls[n]
        out = None
        for layer, step in enumerate(steps):
            if layer:
                model.attend(q, k_flat[layer - 1], v_flat[layer - 1], batch, batch.num_decodes, out=self.attn[:t])
            if self.graphs is not None:
                step.replay()
            else:
                out = step()
        h = (self.outputs[n] if self.graphs is not None else out)[:t]
        return F.linear(h[batch.logit_rows], model.lm_head).argmax(dim=-1)


def capture_piecewise_graphs(model: EngineDecoderModel, kv: Any, sizes: Any = PIECEWISE_SIZES) -> float:
    """Capture :class:`EnginePiecewiseGraphs` on ``model`` over an open :class:`hwbackend.replay.kv.ReplayKV`
    (``model.piecewise``); returns the capture's wall time (s). No cache row is written: every padding row is -1.

    Raises:
        RuntimeError: from CUDA if a capture fails.
    """
    model.piecewise = EnginePiecewiseGraphs(model, kv.k, kv.v, sizes)
    return model.piecewise.capture_s


class _ChunkView:
    """The chunk part of an :class:`EngineBatch` as :func:`hwbackend.replay.model.reference_attention` reads it."""

    def __init__(self, batch: EngineBatch):
        self.work, self.host_cu_q, self.slot_tokens = batch.chunk_work, batch.host_cu_q, batch.slot_tokens


class _StaticEngineDecode:
    """A decode batch of ``n`` as views of :class:`EngineDecodeGraphs`' static buffers."""

    def __init__(self, graphs: "EngineDecodeGraphs", n: int, splits: int):
        self.num_tokens = self.num_decodes = n
        self.write_rows, self.logit_rows = graphs.write_rows[:n], graphs.arange[:n]
        self.dec_starts, self.dec_lens, self.splits = graphs.starts[:n], graphs.lens[:n], splits


class EngineDecodeGraphs:
    """CUDA graphs of :meth:`EngineDecoderModel.eager_forward` for decode-only batches (as
    :class:`hwbackend.replay.model.DecodeGraphs`: captured largest first into one pool over ``scratch_slot``).
    The split-KV kernel reads each sequence's length from ``lens`` at replay, so one graph serves every
    context. ``sizes``: the batch sizes to capture (default ``1..max_batch``).

    Raises:
        RuntimeError: from CUDA if a capture fails.
    """

    def __init__(self, model: EngineDecoderModel, k_flat: list[Any], v_flat: list[Any], slot_tokens: int,
                 scratch_slot: int, max_batch: int, sizes: Any = None):
        import torch

        device = model.device
        start = scratch_slot * slot_tokens
        self.arange = torch.arange(max_batch + 1, device=device, dtype=torch.long)
        self.write_rows = start + self.arange[:max_batch].clone()
        self.starts = torch.full((max_batch,), start, device=device, dtype=torch.long)
        self.lens = torch.ones(max_batch, device=device, dtype=torch.int32)
        self.graphs, self.outputs = capture_graphs(
            model, k_flat, v_flat, sorted(sizes or range(1, max_batch + 1)),
            lambda n: _StaticEngineDecode(self, n, decode_splits(n, model.shape.num_kv_heads, model.sms)))
        self.sizes = frozenset(self.graphs)

    def replay(self, batch: EngineBatch) -> Any:
        """Copy ``batch``'s rows and lengths into the static buffers and replay; next token ids ``[n]``."""
        n = batch.num_tokens
        self.write_rows[:n].copy_(batch.write_rows)
        self.starts[:n].copy_(batch.dec_starts)
        self.lens[:n].copy_(batch.dec_lens)
        self.graphs[n].replay()
        return self.outputs[n]


def build_model(compute: str, shape: Any, device: str, seed: int) -> DecoderModel:
    """The decoder of ``--compute`` (:data:`COMPUTE_MODES`).

    Raises:
        ValueError: an unknown mode.
    """
    if compute not in COMPUTE_MODES:
        raise ValueError(f"--compute {compute!r}: choose one of {', '.join(COMPUTE_MODES)}")
    return (EngineDecoderModel if compute == "engine" else DecoderModel)(shape, device=device, seed=seed)
