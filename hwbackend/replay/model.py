"""A decoder-only transformer at a model's real shape (random bf16 weights, no download) whose attention
reads each sequence's K/V straight out of the slot layout of the vAttention cache.

Per layer, for the ``T`` new tokens of one iteration (prefill chunks and decodes packed together)::

    h = rms_norm(x);  q, k, v = split(h @ W_qkv^T)               # [T, Hq*D], [T, H'*D], [T, H'*D]
    K_t[slot, pos] = k;  V_t[slot, pos] = v                      # new K/V written into the mapped pages
    a = attention(q, K_t[slot, :computed + tokens], ...)          # causal over prior context + the chunk
    x = x + a @ W_o^T;  h = rms_norm(x);  x = x + (silu(h W_g^T) * h W_u^T) @ W_d^T
    logits = rms_norm(x[last token of each emitting sequence]) @ W_lm^T;  next = argmax(logits)

Rotary embeddings are left out (elementwise work of ~1% of an iteration); everything else is as in
Llama (Touvron et al., 2023). Cache tensors are the hardware backend's ``[B, L_max, H', D]`` per layer,
seen as ``[B * L_max, H', D]`` ("flat"): slot ``s`` token ``i`` is row ``s * L_max + i``.

Attention backends (``ATTENTION_BACKENDS``):

* ``varlen``: FlashAttention-2 varlen (``aten._flash_attention_forward``) over the flat cache *without a
  copy*: sequence ``b`` starts at row ``cu_seq_k[b] = slot_b * L_max`` and holds ``seqused_k[b]`` tokens;
  causal masking is bottom-right aligned (flash-attn >= 2.1), so a chunk sees its prior context. CUDA only.
* ``gather``: copy each sequence's rows into a packed buffer (``index_select``), then the same kernel.
* ``reference``: one SDPA per sequence with an explicit mask (any device; tests and CPU runs).

Decode-only iterations can run as CUDA graphs (:class:`DecodeGraphs`, as vLLM and SGLang serve decodes):
one graph of the whole forward per decode batch size, captured once over the cache's fixed virtual
addresses, replayed with the batch's index tensors copied into static buffers. Eager PyTorch launches
~20 kernels per layer from Python (~9 ms per Llama-3-8B iteration on the lent H200's host, more at times:
``docs/validation/README.md``); a graph replay launches them in one call, so the iteration follows the
GPU. Iterations that hold a prefill chunk stay eager.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.setup.catalog import ModelSpec

ATTENTION_BACKENDS = ("varlen", "gather", "reference")


@dataclass(frozen=True)
class SeqWork:
    """One sequence's share of an iteration: ``tokens`` new tokens at positions ``computed..`` of ``slot``;
    ``emits``: the chunk completes the sequence, so its last token's logits are computed."""

    slot: int
    computed: int
    tokens: int
    emits: bool


class BatchInputs:
    """Index tensors of one iteration, built once on the host and copied to the device in one transfer.

    Sequences are ordered by slot (FlashAttention's ``cu_seq_k`` must not decrease).

    Attributes:
        work: the sequences, slot-ascending. write_rows: [T] flat cache row of each new token.
        cu_seq_q / cu_seq_k: [n+1] int32 starts of queries / of each slot's rows. seqused_k: [n] int32.
        logit_rows: [S] packed index of each emitting sequence's last token. max_q / max_k: python ints.
    """

    def __init__(self, work: list[SeqWork], slot_tokens: int, device: Any):
        import torch

        self.work = sorted(work, key=lambda w: w.slot)
        tokens = np.array([w.tokens for w in self.work], dtype=np.int64)
        computed = np.array([w.computed for w in self.work], dtype=np.int64)
        slots = np.array([w.slot for w in self.work], dtype=np.int64)
        cu_q = np.concatenate(([0], np.cumsum(tokens)))
        offsets = np.arange(int(cu_q[-1])) - np.repeat(cu_q[:-1], tokens)
        write_rows = np.repeat(slots * slot_tokens + computed, tokens) + offsets
        cu_k = np.concatenate((slots * slot_tokens, [(slots[-1] + 1) * slot_tokens]))
        used_k = computed + tokens
        logit_rows = (cu_q[1:] - 1)[[w.emits for w in self.work]]
        packed = np.concatenate((write_rows, cu_q, cu_k, used_k, logit_rows))
        flat = torch.from_numpy(packed).to(device, non_blocking=True)
        n, total = len(self.work), int(cu_q[-1])
        parts = torch.split(flat, [total, n + 1, n + 1, n, len(logit_rows)])
        self.write_rows, self.logit_rows = parts[0], parts[4]
        self.cu_seq_q, self.cu_seq_k, self.seqused_k = (p.to(torch.int32) for p in parts[1:4])
        self.max_q, self.max_k = int(tokens.max()), int(used_k.max())
        self.num_tokens, self.slot_tokens = total, slot_tokens
        self.host_used_k, self.host_cu_q = used_k, cu_q

    def gather_rows(self, device: Any) -> tuple[Any, Any]:
        """Flat rows of every sequence's K/V (``[sum(used_k)]``) and their packed starts (``[n+1]`` int32)."""
        import torch

        used, starts = self.host_used_k, np.array([w.slot * self.slot_tokens for w in self.work])
        cu = np.concatenate(([0], np.cumsum(used)))
        rows = np.repeat(starts, used) + (np.arange(int(cu[-1])) - np.repeat(cu[:-1], used))
        return torch.from_numpy(rows).to(device), torch.from_numpy(cu).to(device=device, dtype=torch.int32)


class DecoderModel:
    """Random-weight decoder (bf16 on CUDA; fp32 on CPU, where bf16 matmuls are slow).

    Args:
        shape: the sizes. device: ``"cuda:0"`` or ``"cpu"``. seed: weights' generator seed.
        attention: one of :data:`ATTENTION_BACKENDS`.
    """

    def __init__(self, shape: ModelSpec, device: str = "cuda:0", seed: int = 0, attention: str = "varlen"):
        import torch

        if attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention {attention!r}: choose one of {', '.join(ATTENTION_BACKENDS)}")
        self.shape, self.device, self.attention = shape, torch.device(device), attention
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        gen = torch.Generator(device=self.device).manual_seed(seed)
        s, q_dim, kv_dim = shape, shape.num_q_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim

        def weight(*size: int) -> Any:
            return (torch.randn(*size, generator=gen, device=self.device, dtype=self.dtype) * 0.02)

        self.embed = weight(s.vocab_size, s.hidden_size)
        self.layers = [dict(norm1=torch.ones(s.hidden_size, device=self.device, dtype=self.dtype),
                            qkv=weight(q_dim + 2 * kv_dim, s.hidden_size), o=weight(s.hidden_size, q_dim),
                            norm2=torch.ones(s.hidden_size, device=self.device, dtype=self.dtype),
                            gate_up=weight(2 * s.ffn_size, s.hidden_size), down=weight(s.hidden_size, s.ffn_size))
                       for _ in range(s.num_layers)]
        self.final_norm = torch.ones(s.hidden_size, device=self.device, dtype=self.dtype)
        self.lm_head = weight(s.vocab_size, s.hidden_size)
        self.graphs: DecodeGraphs | None = None

    def forward(self, batch: BatchInputs, k_flat: list[Any], v_flat: list[Any]) -> Any:
        """One iteration: write the new K/V into the cache, attend, return the next token ids ``[S]`` (device).

        Args:
            batch: the iteration's index tensors. k_flat / v_flat: per layer ``[B * L_max, H', D]`` views.
        """
        if (self.graphs is not None and batch.max_q == 1 and batch.num_tokens in self.graphs.sizes
                and batch.logit_rows.shape[0] == batch.num_tokens):  # every sequence decodes one token
            return self.graphs.replay(batch)
        return self.eager_forward(batch, k_flat, v_flat)

    def eager_forward(self, batch: Any, k_flat: list[Any], v_flat: list[Any], return_logits: bool = False) -> Any:
        """:meth:`forward` without graphs (``batch``: :class:`BatchInputs` or the graphs' static view);
        ``return_logits``: the LM head's output ``[S, vocab]`` instead of its argmax (tests)."""
        import torch
        import torch.nn.functional as F

        s = self.shape
        q_dim, kv_dim = s.num_q_heads * s.head_dim, s.num_kv_heads * s.head_dim
        x = self.embed[torch.zeros(batch.num_tokens, dtype=torch.long, device=self.device)]
        for layer, w in enumerate(self.layers):
            h = F.rms_norm(x, (s.hidden_size,), w["norm1"], 1e-5)
            q, k, v = F.linear(h, w["qkv"]).split([q_dim, kv_dim, kv_dim], dim=-1)
            k_flat[layer].index_copy_(0, batch.write_rows, k.reshape(-1, s.num_kv_heads, s.head_dim))
            v_flat[layer].index_copy_(0, batch.write_rows, v.reshape(-1, s.num_kv_heads, s.head_dim))
            a = attend(self.attention, q.reshape(-1, s.num_q_heads, s.head_dim), k_flat[layer], v_flat[layer], batch)
            x = x + self.reduce(F.linear(a.reshape(-1, q_dim), w["o"]))
            gate, up = F.linear(F.rms_norm(x, (s.hidden_size,), w["norm2"], 1e-5), w["gate_up"]).chunk(2, dim=-1)
            x = x + self.reduce(F.linear(F.silu(gate) * up, w["down"]))
        last = F.rms_norm(x[batch.logit_rows], (s.hidden_size,), self.final_norm, 1e-5)
        logits = F.linear(last, self.lm_head)
        return logits if return_logits else logits.argmax(dim=-1)

    def reduce(self, partial: Any) -> Any:
        """The sum over tensor-parallel workers of a row-parallel projection's output (attention out, MLP
        down); one worker holds the whole sum. :class:`hwbackend.replay.tp.shard.ShardedDecoderModel`
        all-reduces here."""
        return partial


class _StaticDecode:
    """The index tensors of a decode batch of ``n`` sequences, as views of :class:`DecodeGraphs`' static
    buffers (the attribute names of :class:`BatchInputs` that :meth:`DecoderModel.eager_forward` reads)."""

    def __init__(self, graphs: "DecodeGraphs", n: int):
        self.num_tokens, self.max_q, self.max_k = n, 1, graphs.slot_tokens
        self.write_rows, self.logit_rows = graphs.write_rows[:n], graphs.arange[:n]
        self.cu_seq_q, self.cu_seq_k, self.seqused_k = graphs.cu_q[:n + 1], graphs.cu_k[:n + 1], graphs.used_k[:n]


def capture_graphs(model: Any, k_flat: list[Any], v_flat: list[Any], sizes: list[int], static_of) -> tuple[dict, dict]:
    """CUDA graphs of ``model.eager_forward`` for each batch size in ``sizes``, captured largest first into one
    memory pool on a side stream (each after one eager warm-up run, so that kernels are chosen and workspaces
    allocated outside the capture); ``static_of(n)`` gives size ``n``'s static inputs. Returns ``(graphs,
    outputs)``: batch size -> ``torch.cuda.CUDAGraph`` and -> the graph's output tensor. Shared by the harness's
    :class:`DecodeGraphs` and the engine's :class:`hwbackend.replay.engine.EngineDecodeGraphs`.

    Raises:
        RuntimeError: from CUDA if a capture fails.
    """
    import torch

    device = model.device
    graphs: dict[int, Any] = {}
    outputs: dict[int, Any] = {}
    pool = torch.cuda.graph_pool_handle()
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for n in sorted(sizes, reverse=True):
            static = static_of(n)
            model.eager_forward(static, k_flat, v_flat)  # warm-up: kernels chosen, workspaces allocated
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=side):
                outputs[n] = model.eager_forward(static, k_flat, v_flat)
            graphs[n] = graph
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    return graphs, outputs


class DecodeGraphs:
    """CUDA graphs of :meth:`DecoderModel.eager_forward` for decode-only batches of 1..``max_batch`` sequences.

    Captured largest first into one memory pool (graphs never run concurrently and each output is read
    before the next replay). The capture runs the forward once per size (warm-up, on a side stream) over
    ``scratch_slot``, a slot whose first ``max_batch`` tokens the caller has mapped: every static row points
    into them then. ``max_k`` is fixed at ``slot_tokens`` (FlashAttention's varlen forward reads each sequence's
    true length from ``seqused_k``; the grid depends on ``max_q`` only).

    Args:
        model: the decoder. k_flat / v_flat: the cache views (fixed virtual addresses, as the graphs need).
        slot_tokens: L_max. scratch_slot: a mapped slot. max_batch: largest batch size captured.
        sizes: the batch sizes to capture (default ``1..max_batch``; benchmarks capture a few).

    Raises:
        RuntimeError: from CUDA if a capture fails (the caller falls back to eager decodes).
    """

    def __init__(self, model: DecoderModel, k_flat: list[Any], v_flat: list[Any], slot_tokens: int,
                 scratch_slot: int, max_batch: int, sizes: Any = None):
        import torch

        device, self.slot_tokens = model.device, slot_tokens
        start = scratch_slot * slot_tokens
        self.arange = torch.arange(max_batch + 1, device=device, dtype=torch.long)
        self.write_rows = start + self.arange[:max_batch].clone()  # rows 0..max_batch-1 of the scratch slot
        self.cu_q = self.arange.to(torch.int32)
        self.cu_k = torch.full((max_batch + 1,), start, device=device, dtype=torch.int32)
        self.used_k = torch.ones(max_batch, device=device, dtype=torch.int32)
        self.graphs, self.outputs = capture_graphs(model, k_flat, v_flat, sorted(sizes or range(1, max_batch + 1)),
                                                   lambda n: _StaticDecode(self, n))
        self.sizes = frozenset(self.graphs)

    def replay(self, batch: BatchInputs) -> Any:
        """Copy ``batch``'s rows, key starts and lengths into the static buffers and replay its graph;
        returns the next token ids ``[n]`` (a view of the graph's output: read it before the next replay)."""
        n = batch.num_tokens
        self.write_rows[:n].copy_(batch.write_rows)
        self.cu_k[:n + 1].copy_(batch.cu_seq_k)
        self.used_k[:n].copy_(batch.seqused_k)
        self.graphs[n].replay()
        return self.outputs[n]


def capture_decode_graphs(model: DecoderModel, kv: Any, max_batch: int, sizes: Any = None) -> float:
    """Capture :class:`DecodeGraphs` (or the model's ``graph_class``, e.g.
    :class:`hwbackend.replay.engine.EngineDecodeGraphs`) of batch ``sizes`` (default ``1..max_batch``) on
    ``model`` over an open :class:`hwbackend.replay.kv.ReplayKV`;
    a scratch slot is taken from the executor for the capture and freed afterwards (its page group
    returns to the pool by the policy's own rules). Returns the capture's wall time (s).

    Raises:
        RuntimeError: if the executor cannot map the scratch slot, or a capture fails.
    """
    import time

    started = time.perf_counter()
    slot = kv.executor.alloc_slot(1)
    # the capture's warm-up writes rows 0..max_batch-1 of the scratch slot: map the page groups they need
    if slot is None or not kv.executor.step({slot: max_batch}):
        raise RuntimeError("no slot or page group free for the decode graphs' capture")
    try:
        graph_class = getattr(model, "graph_class", DecodeGraphs)
        model.graphs = graph_class(model, kv.k, kv.v, kv.slot_tokens, slot, max_batch, sizes)
    finally:
        kv.executor.iteration_launched(-1)
        kv.executor.free_slot(slot, -1)
    return time.perf_counter() - started


def attend(backend: str, q: Any, k_flat: Any, v_flat: Any, batch: BatchInputs) -> Any:
    """Causal attention of the packed queries ``q [T, Hq, D]`` over each sequence's cache rows.

    Query ``j`` of a sequence with ``c`` cached tokens (position ``c + j``) sees keys ``0..c + j``.
    Returns ``[T, Hq, D]``.
    """
    import torch

    if backend == "reference":
        return reference_attention(q, k_flat, v_flat, batch)
    if backend == "gather":
        rows, cu_k = batch.gather_rows(q.device)
        k, v, used = k_flat.index_select(0, rows), v_flat.index_select(0, rows), None
    else:
        k, v, cu_k, used = k_flat, v_flat, batch.cu_seq_k, batch.seqused_k
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, batch.cu_seq_q, cu_k, batch.max_q, batch.max_k, 0.0, True, False,
        scale=1.0 / math.sqrt(q.shape[-1]), seqused_k=used)
    return out[0]


def reference_attention(q: Any, k_flat: Any, v_flat: Any, batch: BatchInputs) -> Any:
    """Per-sequence SDPA in fp32 with an explicit bottom-right causal mask (slow; the test oracle)."""
    import torch
    import torch.nn.functional as F

    outs = []
    group = q.shape[1] // k_flat.shape[1]
    for b, work in enumerate(batch.work):
        q_b = q[int(batch.host_cu_q[b]): int(batch.host_cu_q[b + 1])].float().transpose(0, 1)  # [Hq, t, D]
        start, used = work.slot * batch.slot_tokens, work.computed + work.tokens
        k_b = k_flat[start:start + used].float().transpose(0, 1).repeat_interleave(group, dim=0)
        v_b = v_flat[start:start + used].float().transpose(0, 1).repeat_interleave(group, dim=0)
        query_pos = torch.arange(work.computed, used, device=q.device).view(-1, 1)
        mask = torch.arange(used, device=q.device).view(1, -1) <= query_pos
        outs.append(F.scaled_dot_product_attention(q_b, k_b, v_b, attn_mask=mask).transpose(0, 1).to(q.dtype))
    return torch.cat(outs)
