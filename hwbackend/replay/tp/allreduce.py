"""``python -m hwbackend.replay.tp.allreduce``: the time of the tensor-parallel decoder's all-reduces, one
process per rank, as the replay runs them (``torch.distributed.all_reduce`` of ``[T, hidden]`` activations in
the model's dtype, NCCL with NVLink multicast off, or gloo on CPU).

For each token count ``T`` (default 1..2048, the replay's batch sizes and chunk lengths):

* ``eager``: one all-reduce launched from Python, timed with CUDA events around each (``--iters`` of them
  after ``--warmup``), as in an eager (mixed prefill) iteration;
* ``graph``: ``2 * num_layers`` all-reduces back to back captured in one CUDA graph (one decode iteration's
  worth), replayed ``--graph-replays`` times; the time per all-reduce is the replay's time over their number.

Per layer a decoder iteration runs two of them, so ``2 * num_layers * all-reduce`` is the communication an
iteration adds at TP > 1 (the simulator's ``comm_us`` models only the bandwidth part, ``sim/timing/compute.py``). The
result (``--out``, JSON) records every rank's device, GPU name and UUID and the NCCL version.

Example (``docs/tp2/device-replay.sh``)::

    python -m hwbackend.replay.tp.allreduce --devices cuda:0,cuda:1 --out $OUT/allreduce.json
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50_us": round(statistics.median(ordered), 2), "mean_us": round(statistics.fmean(ordered), 2),
            "p10_us": round(pick(0.10), 2), "p90_us": round(pick(0.90), 2), "min_us": round(ordered[0], 2)}


def measure_rank(rank: int, options: dict, queue: Any = None) -> dict:
    """Rank ``rank``'s measurements (rank 0's are the result; every rank takes part in every all-reduce)."""
    import os
    import platform
    import socket
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from hwbackend.replay.tp.session import set_no_multicast

    set_no_multicast()
    device = torch.device(options["devices"][rank])
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    tp = len(options["devices"])
    extra = {"device_id": device} if options["backend"] == "nccl" else {}
    dist.init_process_group(options["backend"], init_method=options["init_method"], rank=rank, world_size=tp,
                            timeout=timedelta(seconds=options["timeout_s"]), **extra)
    info: dict = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(), "device": str(device),
                  "torch_version": torch.__version__, "python_version": platform.python_version()}
    if cuda:
        props = torch.cuda.get_device_properties(device)
        info.update(gpu_name=props.name, gpu_uuid=str(getattr(props, "uuid", "")),
                    nccl_version=".".join(map(str, torch.cuda.nccl.version())))
    dtype = torch.bfloat16 if cuda else torch.float32
    hidden, layers = options["hidden"], options["num_layers"]
    rows = []
    try:
        for tokens in options["tokens"]:
            x = torch.ones(tokens, hidden, device=device, dtype=dtype)
            for _ in range(options["warmup"]):
                dist.all_reduce(x)
            times = []
            for _ in range(options["iters"]):
                if cuda:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    dist.all_reduce(x)
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end) * 1e3)
                else:
                    started = time.perf_counter()
                    dist.all_reduce(x)
                    times.append((time.perf_counter() - started) * 1e6)
                x.fill_(1.0)
            row = {"tokens": tokens, "bytes": tokens * hidden * x.element_size(), "eager": _quantiles(times)}
            if cuda and options["graph_replays"]:
                row["graph"] = _graph_time(x, 2 * layers, options["graph_replays"])
            rows.append(row)
    finally:
        dist.destroy_process_group()
    result = {"rank": info, "rows": rows}
    if queue is not None:
        queue.put((rank, result))
    return result


def _graph_time(x: Any, count: int, replays: int) -> dict:
    """``count`` all-reduces of ``x`` in one CUDA graph; time per all-reduce over ``replays`` replays."""
    import torch
    import torch.distributed as dist

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        dist.all_reduce(x)  # warm on the capture stream
        side.synchronize()
        with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
            for _ in range(count):
                dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / count)
    return {"all_reduces_per_graph": count, **_quantiles(times)}


def measure(devices: list[str], backend: str, tokens: tuple[int, ...] = DEFAULT_TOKENS, hidden: int = 4096,
            num_layers: int = 32, warmup: int = 20, iters: int = 200, graph_replays: int = 50,
            timeout_s: float = 300.0) -> dict:
    """Run every rank (rank 0 here, the others spawned) and return rank 0's result with every rank's identity."""
    folder = Path(tempfile.mkdtemp(prefix="kvsim-allreduce-"))
    options = {"devices": list(devices), "backend": backend, "init_method": f"file://{folder / 'store'}",
               "tokens": list(tokens), "hidden": hidden, "num_layers": num_layers, "warmup": warmup, "iters": iters,
               "graph_replays": graph_replays, "timeout_s": timeout_s}
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    processes = [ctx.Process(target=measure_rank, args=(rank, options, queue), daemon=True)
                 for rank in range(1, len(devices))]
    try:
        for process in processes:
            process.start()
        result = measure_rank(0, options)
        ranks = [result["rank"]] + [queue.get(timeout=timeout_s)[1]["rank"] for _ in processes]
    finally:
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.terminate()
        shutil.rmtree(folder, ignore_errors=True)
    per_layer = {row["tokens"]: round(2 * row.get("graph", row["eager"])["p50_us"], 2) for row in result["rows"]}
    return {"format": "kvsim-allreduce/1", "tp": len(devices), "backend": backend, "hidden": hidden,
            "num_layers": num_layers, "warmup": warmup, "iters": iters, "graph_replays": graph_replays,
            "ranks": sorted(ranks, key=lambda r: r["rank"]), "rows": result["rows"],
            "per_layer_us_p50": per_layer,
            "per_layer_note": "two all-reduces per layer: graphed p50 where measured, else eager p50"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hwbackend.replay.tp.allreduce", description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="cuda:0,cuda:1", help="one device per rank (cpu,cpu: gloo)")
    parser.add_argument("--backend", default="auto", choices=("auto", "nccl", "gloo"))
    parser.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="comma-separated token counts")
    parser.add_argument("--hidden", type=int, default=4096, help="hidden size (Llama-3-8B: 4096)")
    parser.add_argument("--num-layers", type=int, default=32, help="layers (graph: 2 all-reduces per layer)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--graph-replays", type=int, default=50, help="0: no graph measurement")
    parser.add_argument("--out", default=None, help="JSON file to write")
    args = parser.parse_args(argv)
    devices = [d.strip() for d in args.devices.split(",")]
    backend = args.backend if args.backend != "auto" else ("gloo" if devices[0] == "cpu" else "nccl")
    try:
        tokens = tuple(int(t) for t in args.tokens.split(","))
    except ValueError:
        print(f"allreduce: error: --tokens {args.tokens!r}: whole numbers, comma-separated", file=sys.stderr)
        return 2
    from hwbackend.replay.tp.cli import gpu_preflight
    problem = gpu_preflight(tuple(devices), "--devices cpu,cpu measures gloo on the CPU", cpu_needs_torch=True)
    if problem:
        print(f"allreduce: error: {problem}", file=sys.stderr)
        return 2
    result = measure(devices, backend, tokens, args.hidden, args.num_layers, args.warmup, args.iters,
                     args.graph_replays if devices[0] != "cpu" else 0)
    text = json.dumps(result, indent=1) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(f"{'tokens':>7} {'bytes':>10} {'eager p50 us':>13} {'graph p50 us':>13} {'per layer us':>13}")
    for row in result["rows"]:
        graph = row.get("graph", {}).get("p50_us", float("nan"))
        print(f"{row['tokens']:>7} {row['bytes']:>10} {row['eager']['p50_us']:>13.2f} {graph:>13.2f} "
              f"{result['per_layer_us_p50'][row['tokens']]:>13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
