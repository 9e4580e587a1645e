"""Attention cost of the two KV layouts (issue 10, profile section ``layout``).

* per-layer (vAttention): 2N' tensors ``[B, L_max, H', D]``; layer ``l`` reads its own contiguous tensor.
* cross-layer: one K and one V tensor ``[B, L_max, N', H', D]``; layer ``l`` reads the strided view
  ``[:, :, l]`` (token stride ``N' * H' * D`` elements instead of ``H' * D``), flattened to rows
  ``[B * L_max, H', D]`` without a copy (:func:`hwbackend.vmm.tensors.layer_views`).

The same data is placed in both layouts; for each grid point the attention of all N' layers of one
iteration (the replay model's call, :func:`hwbackend.replay.model.attend`, FlashAttention-2 varlen reading the
cache rows in place) is timed with CUDA events, layouts alternating, median over repetitions. The factor is
``time(cross-layer) / time(per-layer)``; the profile stores the median factor over the grid, which the
simulator multiplies into attention time for ``kv_layout=cross-layer`` (``layout_attention_factor``).
If the kernel refuses a strided view, the view is copied to a contiguous buffer first and the copy is
timed with it (``copy_needed``).

Run on the GPU: ``python -m hwbackend.beyond.layout --out layout.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

# (label, decode batch, decode context, chunk tokens, chunk cached tokens); context = tokens attended
DEFAULT_GRID = (
    ("decode b16 ctx1024", 16, 1024, 0, 0),
    ("decode b16 ctx4096", 16, 4096, 0, 0),
    ("decode b64 ctx1024", 64, 1024, 0, 0),
    ("decode b64 ctx4096", 64, 4096, 0, 0),
    ("prefill chunk 2048 at 0", 0, 0, 2048, 0),
    ("prefill chunk 512 at 3584", 0, 0, 512, 3584),
    ("mixed b32 ctx2048 + chunk 512 at 1024", 32, 2048, 512, 1024),
)


def grid_work(point: tuple, seq_work: Any) -> list:
    """``SeqWork`` list of one grid point: decodes in slots ``0..b-1``, the chunk in slot ``b``."""
    _, batch, context, chunk, cached = point
    work = [seq_work(slot, context - 1, 1, True) for slot in range(batch)]
    if chunk:
        work.append(seq_work(batch, cached, chunk, True))
    return work


def build_layouts(num_layers: int, slots: int, max_tokens: int, heads: int, head_dim: int, device: Any,
                  dtype: Any, seed: int = 0) -> tuple[tuple[list, list], tuple[list, list], list]:
    """The same random K/V in both layouts. Returns ``((k, v) per-layer flat views, (k, v) cross-layer flat
    views, the tensors)``; every view is ``[slots * max_tokens, heads, head_dim]``."""
    import torch

    from hwbackend.vmm.tensors import layer_views

    gen = torch.Generator(device=device).manual_seed(seed)
    per_layer = [torch.randn(slots, max_tokens, heads, head_dim, generator=gen, device=device, dtype=dtype)
                 for _ in range(2 * num_layers)]
    cross = [torch.empty(slots, max_tokens, num_layers, heads, head_dim, device=device, dtype=dtype)
             for _ in range(2)]
    for t, tensor in enumerate(per_layer):
        cross[t // num_layers][:, :, t % num_layers].copy_(tensor)
    return (layer_views(per_layer, flat=True), layer_views(cross, flat=True), per_layer + cross)


def attention_all_layers(backend: str, q: Any, k_views: list, v_views: list, inputs: Any,
                         contiguous: bool = False) -> list:
    """One iteration's attention: every layer over its K/V view (``contiguous``: copy the view first)."""
    from hwbackend.replay.model import attend

    outs = []
    for k, v in zip(k_views, v_views):
        if contiguous:
            k, v = k.contiguous(), v.contiguous()
        outs.append(attend(backend, q, k, v, inputs))
    return outs


def measure_layout_attention(device: str = "cuda:0", grid: tuple = DEFAULT_GRID, repetitions: int = 15,
                             warmup: int = 3, num_layers: int = 32, slots: int = 64, max_tokens: int = 4096,
                             heads: int = 8, q_heads: int = 32, head_dim: int = 128,
                             backend: str = "varlen") -> dict[str, Any]:
    """Time attention over both layouts for each grid point; returns the profile's ``layout`` section.

    Defaults are Llama-3-8B's shape (32 layers, 8 KV heads, 32 query heads, head dim 128, bf16).
    """
    import torch

    from hwbackend.replay.model import BatchInputs, SeqWork

    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    start_s = time.perf_counter()
    (pk, pv), (ck, cv), tensors = build_layouts(num_layers, slots, max_tokens, heads, head_dim, dev, dtype)
    rows: list[dict[str, Any]] = []
    copy_needed, copy_error = False, None
    for point in grid:
        inputs = BatchInputs(grid_work(point, SeqWork), max_tokens, dev)
        q = torch.randn(inputs.num_tokens, q_heads, head_dim, device=dev, dtype=dtype)
        ref = attention_all_layers(backend, q, pk[:1], pv[:1], inputs)[0]
        try:
            got = attention_all_layers(backend, q, ck[:1], cv[:1], inputs, contiguous=copy_needed)[0]
        except RuntimeError as exc:
            copy_needed, copy_error = True, str(exc).splitlines()[0][:300]
            got = attention_all_layers(backend, q, ck[:1], cv[:1], inputs, contiguous=True)[0]
        max_diff = float((got.float() - ref.float()).abs().max())
        times: dict[str, list[float]] = {"per-layer": [], "cross-layer": []}
        for rep in range(warmup + repetitions):
            for name, (k, v) in (("per-layer", (pk, pv)), ("cross-layer", (ck, cv))):
                elapsed = _time_ms(dev, lambda: attention_all_layers(
                    backend, q, k, v, inputs, contiguous=copy_needed and name == "cross-layer"))
                if rep >= warmup:
                    times[name].append(elapsed)
        per, cross = float(np.median(times["per-layer"])), float(np.median(times["cross-layer"]))
        label, batch, context, chunk, cached = point
        rows.append({"label": label, "decode_batch": batch, "decode_context": context, "chunk_tokens": chunk,
                     "chunk_cached_tokens": cached, "per_layer_ms": round(per, 4), "cross_layer_ms": round(cross, 4),
                     "factor": round(cross / per, 4), "max_abs_diff": max_diff,
                     "per_layer_spread_ms": [round(min(times["per-layer"]), 4), round(max(times["per-layer"]), 4)],
                     "cross_layer_spread_ms": [round(min(times["cross-layer"]), 4),
                                               round(max(times["cross-layer"]), 4)]})
    del tensors
    factors = [r["factor"] for r in rows]
    return {"cross_layer_attention_factor": round(float(np.median(factors)), 4),
            "factor_range": [min(factors), max(factors)], "grid": rows, "copy_needed": copy_needed,
            "copy_error": copy_error,
            "method": (f"attention of all {num_layers} layers of one iteration ({backend}: "
                       "aten._flash_attention_forward varlen reading cache rows in place, seqused_k) over the same "
                       f"random bf16 K/V in both layouts ({slots} slots x {max_tokens} tokens, {heads} KV heads, "
                       f"{q_heads} query heads, head dim {head_dim}; torch allocations); per-layer: "
                       "[B, L_max, H, D] per layer; cross-layer: [B, L_max, N, H, D] read through the strided "
                       "view [:, :, layer] flattened to rows (token stride N*H*D); CUDA events, layouts "
                       f"alternating, {warmup} warm-ups, median of {repetitions}; factor = cross / per-layer, "
                       "profile value = median over the grid"),
            "seconds": round(time.perf_counter() - start_s, 1)}


def _time_ms(device: Any, fn: Any) -> float:
    import torch

    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hwbackend.beyond.layout", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--repetitions", type=int, default=15)
    args = parser.parse_args(argv)
    section = measure_layout_attention(args.device, repetitions=args.repetitions)
    with open(args.out, "w") as f:
        json.dump(section, f, indent=1)
    for row in section["grid"]:
        print(f"layout: {row['label']:<40} per-layer {row['per_layer_ms']:8.3f} ms  cross {row['cross_layer_ms']:8.3f} ms"
              f"  factor {row['factor']:.3f}  diff {row['max_abs_diff']:.2e}")
    print(f"layout: cross_layer_attention_factor {section['cross_layer_attention_factor']} "
          f"copy_needed {section['copy_needed']} ({section['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
