"""Tile tuning of the engine replay's split-KV decode kernel on the GPU (issue 30, PLAN.md step 1).

``python docs/validation/engine-profile/tune_decode.py --out DIR`` times ``hwbackend.replay.engine.split_kv_decode``
(split kernel + merge, the splits :func:`hwbackend.replay.engine.decode_splits` picks) for every tile of
:data:`TILES` on the decode batches where the replay ran 1.13-1.22x the roofline (64 and 256 sequences at 1K and
8K contexts, Llama-3-8B's 32 query / 8 KV heads of 128), checks each tile against a float32 reference on random
bf16 K/V (poisoned output, fresh inputs), and writes ``tune.json`` (all times, errors, the choice) and
``tile.env`` (``KVSIM_DECODE_TILE=...`` for the rest of the device call). A tile replaces the default only if it is
correct and its summed time is at least 3% under the default's (the repeat spread of a do_bench median is ~1%).
Times: ``triton.testing.do_bench`` medians (ms), K/V several times the 60 MB L2.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

TILES = [(n, w, s) for n in (32, 64, 128) for w in (4, 8) for s in (2, 3)] + [(16, 4, 2), (64, 2, 2)]
SHAPES = ((64, 1024), (256, 1024), (64, 8192), (256, 4096))
"""(decodes, cached tokens): the batches of the replay's 1.13-1.22x (256 x 8K exceeds the bench's pool)."""


def reference(q, k, v, starts, lens):
    """float32 attention of each sequence's query over its rows (``[n, Hq, D]``)."""
    import torch

    hq, hkv = q.shape[1], k.shape[1]
    out = []
    for b in range(q.shape[0]):
        s, n = int(starts[b]), int(lens[b])
        kb = k[s:s + n].float().repeat_interleave(hq // hkv, dim=1).transpose(0, 1)   # [Hq, n, D]
        vb = v[s:s + n].float().repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
        w = torch.softmax(q[b].float()[:, None, :] @ kb.transpose(1, 2) / math.sqrt(q.shape[2]), dim=-1)
        out.append((w @ vb)[:, 0])
    return torch.stack(out)


def main() -> int:
    import torch
    import triton

    from hwbackend.replay.engine import DECODE_TILE, decode_splits, split_kv_decode

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget-s", type=float, default=70.0, help="stop timing new tiles after this many seconds")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    hq, hkv, dim = 32, 8, 128
    gen = torch.Generator(device="cuda").manual_seed(7)
    rows = max(b * (c + 1) for b, c in SHAPES)
    k, v = (torch.randn(rows, hkv, dim, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cases = {}
    for b, c in SHAPES:
        q = torch.randn(b, hq, dim, generator=gen, device="cuda", dtype=torch.bfloat16)
        starts = torch.arange(b, device="cuda", dtype=torch.int64) * (c + 1)
        lens = torch.full((b,), c + 1, device="cuda", dtype=torch.int32)
        cases[(b, c)] = (q, starts, lens, decode_splits(b, hkv))
    # correctness case: uneven lengths (1..9000 keys), splits 1 / 7 / 23
    lens_small = torch.tensor([1, 63, 64, 65, 1000, 4097, 9000, 333], device="cuda", dtype=torch.int32)
    starts_small = torch.arange(8, device="cuda", dtype=torch.int64) * 9001
    results, default = [], tuple(DECODE_TILE)
    for tile in [default] + [t for t in TILES if t != default]:
        if time.perf_counter() - started > args.budget_s:
            break
        os.environ["KVSIM_DECODE_TILE"] = ",".join(map(str, tile))
        entry = {"tile": list(tile)}
        try:
            err = 0.0
            for splits in (1, 7, 23):
                qs = torch.randn(8, hq, dim, generator=gen, device="cuda", dtype=torch.bfloat16)
                got = split_kv_decode(qs, k, v, starts_small, lens_small, splits)
                ref = reference(qs, k, v, starts_small, lens_small)
                err = max(err, ((got.float() - ref).norm() / ref.norm()).item())
                if not torch.isfinite(got).all():
                    err = float("inf")
            entry["rel_error"] = err
            times = {}
            for (b, c), (q, starts, lens, splits) in cases.items():
                times[f"{b}x{c}"] = triton.testing.do_bench(
                    lambda: split_kv_decode(q, k, v, starts, lens, splits), warmup=10, rep=40, return_mode="median")
            entry["times_ms"] = times
            entry["total_ms"] = sum(times.values())
        except Exception as exc:  # noqa: BLE001 - a tile that does not compile (shared memory) is recorded
            entry["error"] = str(exc).splitlines()[0][:200]
        results.append(entry)
        print(entry, flush=True)
    base = results[0].get("total_ms", math.inf)
    ok = [r for r in results if "total_ms" in r and r["rel_error"] < 1e-2]
    best = min(ok, key=lambda r: r["total_ms"]) if ok else results[0]
    chosen = tuple(best["tile"]) if best.get("total_ms", math.inf) <= 0.97 * base else default
    (out / "tune.json").write_text(json.dumps({"default": list(default), "chosen": list(chosen),
                                               "default_total_ms": base, "results": results,
                                               "wall_s": round(time.perf_counter() - started, 1)}, indent=1) + "\n")
    (out / "tile.env").write_text(f"export KVSIM_DECODE_TILE={','.join(map(str, chosen))}\n")
    print(f"chosen tile {chosen} (default {default}: {base:.3f} ms summed; best {best.get('total_ms')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
