"""``python -m hwbackend.replay.tp.cli``: the tensor-parallel hardware replay (``--tp N``, one process per
rank) writing the one-GPU replay's run directory (requests / iterations / shapes Parquet, ``config.json``
recording ``tp`` and every rank's device, GPU name and UUID, ``summary.json``), so that ``kvsim validate
--hw-run`` and ``kvsim calibrate --from-run`` read it unchanged.

Same options as ``python -m hwbackend.replay.cli`` (workload and configuration as ``kvsim simulate``), plus
``--devices`` (one per rank; default ``cuda:0..cuda:N-1``, or ``cpu`` for every rank with ``--device cpu``)
and ``--dist-backend`` (``auto``: NCCL on GPUs, gloo on CPU). On CPU every rank runs the tiny decoder over an
emulated VMM driver with gloo all-reduces (tests, development). NVLink multicast stays off
(``NCCL_NVLS_ENABLE=0``). Example (the two-H200 runs, ``docs/tp2/PLAN.md``)::

    python -m hwbackend.replay.tp.cli --tp 2 --trace shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv \\
        --num-requests 1000 --warmup-s 10 --out $OUT/tp2-test-async
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from sim.results.json_text import nan_for_null

PROG = "python -m hwbackend.replay.tp.cli"


def build_parser():
    from hwbackend.replay.cli import build_parser as one_gpu_parser

    parser = one_gpu_parser(PROG, description="the tensor-parallel hardware replay (--tp N, one process per rank) "
                                              "writing the one-GPU replay's run directory")
    parser.add_argument("--devices", default=None,
                        help="one device per rank, comma-separated (cuda:0,cuda:1); default: --device's index and "
                             "the next ones, or cpu for every rank")
    parser.add_argument("--dist-backend", default="auto", choices=("auto", "nccl", "gloo"),
                        help="torch.distributed backend of the all-reduces (auto: nccl on GPUs, gloo on CPU)")
    return parser


def resolve_devices(device: str, devices: str | None, tp: int) -> tuple[str, ...]:
    """One device per rank.

    Raises:
        ValueError: a list of the wrong length, a device twice, or mixed CPU and GPU ranks.
    """
    if devices:
        chosen = tuple(d.strip() for d in devices.split(","))
    elif device == "cpu":
        chosen = ("cpu",) * tp
    else:
        prefix, _, ordinal = device.partition(":")
        if prefix != "cuda" or not ordinal.isdigit():
            raise ValueError(f"--device {device!r}: use cuda:N or cpu")
        chosen = tuple(f"cuda:{int(ordinal) + r}" for r in range(tp))
    if len(chosen) != tp:
        raise ValueError(f"--devices {devices}: {len(chosen)} devices for --tp {tp}; give one per rank")
    kinds = {d == "cpu" for d in chosen}
    if len(kinds) > 1:
        raise ValueError(f"--devices {','.join(chosen)}: every rank on cpu or every rank on a GPU")
    if chosen[0] != "cpu":
        for d in chosen:
            prefix, _, ordinal = d.partition(":")
            if prefix != "cuda" or not ordinal.isdigit():
                raise ValueError(f"--devices: {d!r} is not cuda:N")
        if len(set(chosen)) != tp:
            raise ValueError(f"--devices {','.join(chosen)}: one GPU per rank (a GPU named twice)")
    return chosen


def dist_backend_for(requested: str, devices: tuple[str, ...]) -> str:
    if requested != "auto":
        return requested
    return "gloo" if devices[0] == "cpu" else "nccl"


def unsupported_tp(config: Any, devices: tuple[str, ...], attention: str, backend: str) -> str | None:
    """A configuration the tensor-parallel replay does not run (one line), or None."""
    if config.preemption != "recompute":
        return f"--preemption {config.preemption}: the hardware replay implements recompute preemption only"
    if devices[0] == "cpu" and attention == "varlen":
        return "--attention varlen needs CUDA (FlashAttention); on cpu use auto, gather or reference"
    if devices[0] == "cpu" and backend == "nccl":
        return "--dist-backend nccl needs GPUs; on cpu use gloo (or auto)"
    return None


def gpu_preflight(devices: tuple[str, ...], cpu_hint: str = "--device cpu runs the emulated replay",
                  cpu_needs_torch: bool = False) -> str | None:
    """Why ``devices`` cannot be used (one line), or None: torch importable and seeing a CUDA device, enough GPUs
    for every rank (each rank checks VMM support on its own device). The GPU scripts (``python -m
    hwbackend.replay.tp.allreduce``, ``python -m hwbackend.beyond.gpu``, ``bench/bench_hw.py``) print it and exit
    2, as the replay commands do; ``cpu_hint`` says what runs without a GPU. Each device must be ``cpu`` or
    ``cuda:N``, all of one kind; ``cpu_needs_torch``: the CPU devices run torch too (gloo), so torch must import."""
    import re

    for device in devices:
        if device != "cpu" and not re.fullmatch(r"cuda:[0-9]+", device):
            return f"--devices {','.join(devices)}: {device!r} is not cpu or cuda:N"
    if len({device == "cpu" for device in devices}) > 1:
        return f"--devices {','.join(devices)}: all ranks on the CPU (cpu,cpu) or all on GPUs (cuda:0,cuda:1)"
    if devices[0] == "cpu" and not cpu_needs_torch:
        return None
    try:
        import torch
    except ImportError:
        if devices[0] == "cpu":
            return "needs torch, also on the CPU (gloo): pip install -e '.[hw]'"
        return f"needs torch with CUDA and an NVIDIA GPU (pip install -e '.[hw]'); {cpu_hint}"
    if devices[0] == "cpu":
        return None

    if not torch.cuda.is_available():
        return f"torch sees no CUDA device (torch {torch.__version__}); {cpu_hint}"
    highest = max(int(d.partition(":")[2]) for d in devices)
    if highest >= torch.cuda.device_count():
        return f"--devices {','.join(devices)}: torch sees {torch.cuda.device_count()} GPU(s)"
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit 0 on success, 2 for an option, trace or machine that cannot be used (one line)."""
    from hwbackend.replay.cli import TINY_SHAPE, preflight, write_hw_run
    from hwbackend.replay.kv import layout_for
    from hwbackend.replay.tp.replay import replay_tp
    from hwbackend.replay.tp.session import PeerSpec
    from sim.frontend.options import config_from_args
    from traces.workload import load_workload

    from sim.frontend.flags import flag_message, parser_flags
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        devices = resolve_devices(args.device, args.devices, config.tp)
    except ValueError as exc:  # one message naming the flag (the core's errors name fields)
        print(f"replay: error: {flag_message(exc, parser_flags(parser))}", file=sys.stderr)
        return 2
    backend = dist_backend_for(args.dist_backend, devices)
    problem = (unsupported_tp(config, devices, args.attention, backend)
               or preflight(devices[0], args.out, args.force, args.warmup_s) or gpu_preflight(devices))
    if problem:
        print(f"replay: error: {problem}", file=sys.stderr)
        return 2
    try:
        trace, notes = load_workload(args, config.seed, config.slot_max_tokens)
    except (ValueError, OSError) as exc:
        print(f"replay: error: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"replay: warning: {note}", file=sys.stderr)
    shape = TINY_SHAPE if devices[0] == "cpu" else config.model_spec
    rendezvous = Path(tempfile.mkdtemp(prefix="kvsim-tp-"))
    try:
        spec = PeerSpec(tp=config.tp, devices=devices, layout=layout_for(config, shape.per_worker(config.tp)),
                        pool_page_groups=config.pool_page_groups, runner="model", dist_backend=backend,
                        init_method=f"file://{rendezvous / 'store'}", create_on_demand=config.create_on_demand,
                        shape=shape, seed=config.seed)
        output, meta = replay_tp(config, trace, spec, args.attention, cuda_graphs=not args.no_cuda_graphs,
                                 warmup_s=args.warmup_s, exit_after_peer_loss_s=60.0)
    except MemoryError as exc:
        print(f"replay: error: the KV cache or model does not fit this machine's memory ({exc})", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(rendezvous, ignore_errors=True)
    meta.update(trace_source=trace.attrs.get("source", args.trace), rate_scale=args.rate_scale,
                num_requests=args.num_requests, skip_requests=args.skip_requests,
                command=" ".join([PROG, *(sys.argv[1:] if argv is None else argv)]))
    out = write_hw_run(output, config, meta, args.out, force=args.force)
    output.rank_launches.to_parquet(out / "tp_launches.parquet", index=False)
    summary = nan_for_null(json.loads((out / "summary.json").read_text()))
    print(f"wrote {out}: tp {config.tp} on {','.join(devices)} ({backend}), {summary['finished']} finished, "
          f"{summary['iterations']} iterations, iteration p50 {summary['iteration_p50_ms']:.2f} ms, TTFT p50 "
          f"{summary['ttft_p50_ms']:.1f} ms, TPOT p50 {summary['tpot_p50_ms']:.2f} ms, wall {meta['replay_wall_s']:.1f} s, "
          f"page tables {meta['tp_page_tables']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
