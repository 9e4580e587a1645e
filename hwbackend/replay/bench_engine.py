"""Per-phase iteration times of the replay's compute, harness vs engine (issue 30 item 1; GPU only).

``python -m hwbackend.replay.bench_engine --compute engine --out DIR`` times, over the VMM-backed cache
(:func:`hwbackend.replay.kv.open_kv`), each point of :func:`bench_points` the way a replay iteration runs it
(:func:`hwbackend.calibration.grid.measure_points`: executor step, host inputs, forward, token copy; decode-only
points as CUDA graphs) and writes ``points.csv`` (one row per point, :data:`hwbackend.calibration.grid.GRID_COLUMNS`
plus ``compute``) and ``bench.json`` (machine, versions, timings). ``--check`` runs instead the GPU checks:
split-KV decode against FlashAttention varlen on random K/V, and the engine's logits against the harness's
on a 2-layer decoder of the model's shape (``check.json``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

DECODE_BATCHES = (1, 16, 64, 256)
DECODE_CONTEXTS = (1024, 8192, 32768)
PREFILL_CHUNKS = ((512, 0), (2048, 0), (512, 8192), (2048, 8192))
MIXED = ((512, 0, 64, 1024), (2048, 0, 16, 8192), (1024, 4096, 128, 1024))
"""(chunk tokens, chunk context, decodes, decode context) of the mixed points."""
SMALL_PREFILL = ((128, 0), (256, 0), (256, 4096))
SMALL_MIXED = ((64, 0, 64, 1024), (128, 1024, 32, 4096), (256, 0, 16, 8192), (448, 2048, 64, 1024),
               (32, 4096, 128, 1024), (320, 4096, 192, 1024))
"""Points of at most 512 tokens (the piecewise graphs' largest size), measured with ``--piecewise``: eager, then
as piecewise graphs."""


def bench_points(pool_tokens: int, tokens_per_group: int, max_context: int, small: bool = False) -> list[dict]:
    """Decodes of :data:`DECODE_BATCHES` x :data:`DECODE_CONTEXTS` (cached tokens), prefill chunks
    :data:`PREFILL_CHUNKS` and :data:`MIXED` batches (with ``small``, also :data:`SMALL_PREFILL` and
    :data:`SMALL_MIXED`), less those whose pages exceed ``pool_tokens``."""
    points = []

    def add(family: str, seqs: list[tuple[int, int]]) -> None:
        groups = sum(-(-(c + t) // tokens_per_group) for t, c in seqs)
        if groups * tokens_per_group <= pool_tokens and all(c + t <= max_context for t, c in seqs):
            points.append({"family": family, "seqs": seqs})

    for c in DECODE_CONTEXTS:
        for b in DECODE_BATCHES:
            add("decode", [(1, c)] * b)
    for t, c in PREFILL_CHUNKS:
        add("prefill", [(t, c)])
    for t, c, d, dc in MIXED:
        add("mixed", [(1, dc)] * d + [(t, c)])
    if small:
        for t, c in SMALL_PREFILL:
            add("prefill", [(t, c)])
        for t, c, d, dc in SMALL_MIXED:
            add("mixed", [(1, dc)] * d + [(t, c)])
    return points


def run_bench(compute: str, out: Path, model_name: str, max_context: int, warmup_s: float, repeats: int,
              piecewise: bool = False) -> dict:
    """Time :func:`bench_points` (module docstring); with ``piecewise`` (engine), the points with a prefill chunk
    and at most 512 tokens are then timed again as piecewise CUDA graphs (rows of compute
    ``engine-piecewise``, with the capture time in the metadata)."""
    import gc

    import pandas as pd
    import torch

    from hwbackend.calibration.grid import GRID_COLUMNS, measure_points
    from hwbackend.replay.cli import choose_attention, warm_up
    from hwbackend.replay.engine import build_model
    from hwbackend.replay.kv import open_kv
    from hwbackend.replay.model import capture_decode_graphs
    from sim.setup.config import SimConfig

    started = time.perf_counter()
    config = SimConfig(model=model_name, sync_mapping=True, max_context_tokens=max_context, allow_long_context=True)
    shape = config.model_spec.per_worker(config.tp)
    model = build_model(compute, shape, "cuda:0", config.seed)
    model.attention, check = choose_attention(model, "auto")
    meta = {"compute": compute, "model": model_name, "max_context_tokens": max_context,
            "attention_backend": model.attention, **check}
    meta["warmup_forwards"] = warm_up(model, warmup_s)
    kv = open_kv(config, shape, "cuda:0")
    try:
        sizes = sorted(set(DECODE_BATCHES))
        meta["graph_capture_s"] = round(capture_decode_graphs(model, kv, max(sizes), sizes), 1)
        pc = kv.executor.policy.config
        pool_tokens = int(pc.pool_page_groups * pc.tokens_per_page * 0.95)
        points = bench_points(pool_tokens, pc.tokens_per_page, max_context, small=piecewise)
        meta.update(pool_tokens=pool_tokens, points=len(points))

        def timed(label: str, chosen: list[dict]) -> list[dict]:
            gc.collect()
            gc.disable()
            try:
                rows = measure_points(model, kv, chosen, warmup=3, repeats=repeats, progress=lambda i, n, r: print(
                    f"{label} {i + 1}/{n} {r['family']} decodes {r['decodes']} chunk {r['chunk_tokens']} "
                    f"max ctx {r['max_context_tokens']} graphed {r['graphed']}: {r['measured_us'] / 1000:.3f} ms",
                    flush=True))
            finally:
                gc.enable()
            return [{"compute": label, **row} for row in rows]

        rows = timed(compute, points)
        if piecewise and compute == "engine":
            from hwbackend.replay.engine import capture_piecewise_graphs

            meta["piecewise_capture_s"] = round(capture_piecewise_graphs(model, kv), 1)
            small = [p for p in points if p["family"] != "decode"
                     and sum(t for t, _ in p["seqs"]) <= model.piecewise.max_tokens]
            rows += timed("engine-piecewise", small)
    finally:
        kv.close()
    frame = pd.DataFrame(rows, columns=["compute", *GRID_COLUMNS])
    frame.to_csv(out / f"points-{compute}.csv", index=False)
    meta.update(gpu_name=torch.cuda.get_device_name(), torch_version=torch.__version__,
                wall_s=round(time.perf_counter() - started, 1))
    return meta


def run_check(out: Path, model_name: str) -> dict:
    """GPU checks (module docstring); returns the figures (max abs differences)."""
    import dataclasses
    import math

    import torch

    from hwbackend.replay.engine import EngineBatch, EngineDecoderModel, split_kv_decode
    from hwbackend.replay.model import BatchInputs, DecoderModel, SeqWork, attend
    from sim.setup.config import SimConfig

    spec = SimConfig(model=model_name).model_spec
    result: dict = {}
    gen = torch.Generator(device="cuda").manual_seed(1)
    slot_tokens, hkv, dim = 33792, spec.num_kv_heads, spec.head_dim
    k, v = (torch.randn(4 * slot_tokens, hkv, dim, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for lens in ((1, 1000, 8193, 32769), (64, 64, 64, 64)):
        work = [SeqWork(i, n - 1, 1, True) for i, n in enumerate(lens)]
        q = torch.randn(len(work), spec.num_q_heads, dim, generator=gen, device="cuda", dtype=torch.bfloat16)
        ref = attend("varlen", q, k, v, BatchInputs(work, slot_tokens, "cuda"))
        batch = EngineBatch(work, slot_tokens, "cuda", hkv)
        for splits in (1, 7, batch.splits):
            got = split_kv_decode(q, k, v, batch.dec_starts, batch.dec_lens, splits)
            result[f"split_kv_vs_varlen_lens{'-'.join(map(str, lens))}_splits{splits}"] = \
                (got.float() - ref.float()).abs().max().item()
    small = dataclasses.replace(spec, num_layers=2)
    harness, engine = DecoderModel(small, "cuda:0", 0), EngineDecoderModel(small, "cuda:0", 0)
    work = [SeqWork(0, 1500, 1, True), SeqWork(2, 700, 300, True), SeqWork(3, 0, 64, False), SeqWork(1, 90, 1, True)]
    logits = []
    for model in (harness, engine):
        caches = [k.clone() for _ in range(2)], [v.clone() for _ in range(2)]
        inputs = getattr(model, "batch_inputs", BatchInputs)(work, slot_tokens, "cuda")
        emit = [w.slot for w in inputs.work if w.emits]
        out_logits = model.eager_forward(inputs, caches[0], caches[1], return_logits=True).float()
        logits.append(out_logits[sorted(range(len(emit)), key=lambda i: emit[i])])
    result["engine_vs_harness_logits_max_abs"] = (logits[0] - logits[1]).abs().max().item()
    result["harness_logits_max_abs"] = logits[0].abs().max().item()
    result["engine_vs_harness_argmax_equal"] = bool((logits[0].argmax(-1) == logits[1].argmax(-1)).all())
    result["scale"] = 1.0 / math.sqrt(dim)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hwbackend.replay.bench_engine", description=__doc__.splitlines()[0])
    parser.add_argument("--compute", choices=("harness", "engine"), default="engine")
    parser.add_argument("--out", required=True, help="directory for points-COMPUTE.csv and bench-COMPUTE.json")
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--max-context", type=int, default=33792, help="slot length (tokens); default 33 x 1024")
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--check", action="store_true", help="run the GPU checks instead (check.json)")
    parser.add_argument("--piecewise", action="store_true",
                        help="engine: also time the points of <= 512 tokens with a prefill chunk as piecewise CUDA graphs")
    args = parser.parse_args(argv)
    from hwbackend.replay.tp.cli import gpu_preflight
    problem = gpu_preflight(("cuda:0",), "the per-phase timings need the GPU (tests/test_hw_replay_engine.py runs "
                                         "the CPU equivalents)")
    if problem:
        print(f"{parser.prog}: {problem}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.check:
        (out / "check.json").write_text(json.dumps(run_check(out, args.model), indent=1) + "\n")
        return 0
    meta = run_bench(args.compute, out, args.model, args.max_context, args.warmup_s, args.repeats, args.piecewise)
    meta["command"] = " ".join(["python -m hwbackend.replay.bench_engine", *(argv or sys.argv[1:])])
    (out / f"bench-{args.compute}.json").write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
