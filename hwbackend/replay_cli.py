"""``python -m hwbackend.replay_cli``: replay a trace on the GPU and write a run directory.

Same options as ``kvsim simulate`` for the workload and the configuration (``--trace``, ``--num-requests``,
``--rate-scale``, ``--model``, ``--sync-mapping``, ...), so that ``kvsim validate`` can rebuild the very same
simulation. The run directory has the simulator's layout (``analysis/results.py``: requests.parquet,
iterations.parquet, summary.json, config.json) plus ``trace.parquet``, the replayed trace slice (arrivals
already rate-scaled), so the comparison needs no trace file.

Example (the H200 validation runs, ``docs/validation/README.md``)::

    python -m hwbackend.replay_cli --trace docs/validation/azure_conv_2023_first1000.parquet \\
        --rate-scale 3 --out $OUT/hw-async
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from hwbackend.model import DecoderModel, TransformerShape
from hwbackend.replay import ReplayLoop
from hwbackend.replay_kv import open_kv

TINY_SHAPE = TransformerShape(num_layers=2, hidden_size=256, num_q_heads=8, num_kv_heads=8, head_dim=128,
                              ffn_size=512, vocab_size=1000)
"""A CPU-sized decoder with Llama-3-8B's KV head shape (so a 2 MiB page still holds 1024 tokens)."""


def choose_attention(model: DecoderModel, requested: str) -> tuple[str, dict]:
    """``auto``: ``varlen`` (zero-copy) if it matches ``gather`` on a random case, else ``gather``; CPU:
    ``reference``. Returns the backend and the check's figures (max abs difference)."""
    import torch

    if model.device.type != "cuda":
        return ("reference" if requested == "auto" else requested), {}
    if requested != "auto":
        return requested, {}
    from hwbackend.model import BatchInputs, SeqWork, attend

    s = model.shape
    gen = torch.Generator(device=model.device).manual_seed(1)
    k, v = (torch.randn(4 * 2048, s.num_kv_heads, s.head_dim, generator=gen, device=model.device,
                        dtype=model.dtype) for _ in range(2))
    work = [SeqWork(0, 1500, 1, True), SeqWork(2, 700, 300, True), SeqWork(3, 0, 64, False)]
    inputs = BatchInputs(work, 2048, model.device)
    q = torch.randn(inputs.num_tokens, s.num_q_heads, s.head_dim, generator=gen, device=model.device, dtype=model.dtype)
    try:
        diff = (attend("varlen", q, k, v, inputs).float() - attend("gather", q, k, v, inputs).float()).abs().max().item()
    except RuntimeError as exc:  # e.g. a torch build without seqused_k
        return "gather", {"attention_check_error": str(exc).splitlines()[0][:200]}
    return ("varlen" if diff < 1e-2 else "gather"), {"attention_check_max_abs_diff": diff}


def warm_up(model: DecoderModel) -> None:
    """Run a prefill and a decode on scratch K/V so kernels and allocator are ready before the clock starts."""
    import torch

    from hwbackend.model import BatchInputs, SeqWork

    s = model.shape
    scratch = torch.zeros(2 * 2048, s.num_kv_heads, s.head_dim, device=model.device, dtype=model.dtype)
    for work in ([SeqWork(0, 0, 1024, True)], [SeqWork(0, 1024, 1, True), SeqWork(1, 0, 512, True)]):
        for _ in range(2):
            model.forward(BatchInputs(work, 2048, model.device), [scratch] * s.num_layers,
                          [scratch] * s.num_layers).cpu()


def replay(config: Any, trace: pd.DataFrame, device: str = "cuda:0", shape: TransformerShape | None = None,
           attention: str = "auto", sleep=time.sleep) -> tuple[Any, dict]:
    """Replay ``trace`` under ``config``; returns the :class:`hwbackend.replay.ReplayOutput` and run metadata."""
    shape = shape or TransformerShape.from_spec(config.model_spec, config.tp)
    model = DecoderModel(shape, device=device, seed=config.seed)
    backend, check = choose_attention(model, attention)
    model.attention = backend
    if model.device.type == "cuda":
        warm_up(model)
    kv = open_kv(config, shape, device)
    try:
        gc.collect()
        gc.freeze()
        gc.disable()  # a full collection mid-run costs ~50 ms (docs/hwbackend.md)
        started = time.perf_counter()
        output = ReplayLoop(config, trace, model, kv, sleep=sleep).run()
        wall_s = time.perf_counter() - started
    finally:
        gc.enable()
        kv.close()
    meta = {"backend": "hardware", "device": device, "attention_backend": backend, "replay_wall_s": wall_s,
            "transformer_shape": asdict(shape),
            **check, **_environment(model)}
    return output, meta


def _environment(model: DecoderModel) -> dict:
    import torch

    env = {"torch_version": torch.__version__, "python_version": platform.python_version()}
    if model.device.type == "cuda":
        env["gpu_name"] = torch.cuda.get_device_name(model.device)
    return env


def write_hw_run(output: Any, config: Any, trace: pd.DataFrame, meta: dict, out_dir: str | Path,
                 force: bool = False) -> Path:
    """Write the run directory (simulator layout plus ``trace.parquet`` and ``counters.json``).

    Raises:
        FileExistsError: if ``out_dir`` already holds a run and ``force`` is false.
    """
    if not force and (Path(out_dir) / "summary.json").exists():
        raise FileExistsError(f"{out_dir} already holds a run; pass --force")
    requests, iterations = output.requests_frame(), output.iterations_frame()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trace.to_parquet(out / "trace.parquet", index=False)  # the raw data first: nothing below can lose it
    (out / "counters.json").write_text(json.dumps(output.counters, indent=1) + "\n")
    requests.to_parquet(out / "requests.parquet", index=False)
    iterations.to_parquet(out / "iterations.parquet", index=False)
    results = _results_module()
    config_dict = {**config.to_dict(), **meta}
    summary = results.summarize(requests, iterations, output.counters, config_dict)
    return results.write_run(results.RunResult(requests, iterations, summary, config_dict), out, overwrite=True)


def _results_module() -> Any:
    """``analysis.results`` (numpy and pandas only), loaded from its file when the ``analysis`` package
    itself cannot be imported (its ``__init__`` pulls plotly, absent on the GPU machine)."""
    try:
        import analysis.results as results
    except ImportError:
        import importlib.util

        path = Path(__file__).resolve().parent.parent / "analysis" / "results.py"
        spec = importlib.util.spec_from_file_location("_kvsim_analysis_results", path)
        results = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = results  # dataclasses look their module up there
        spec.loader.exec_module(results)
    return results


def build_parser() -> argparse.ArgumentParser:
    from cli import add_config_args, add_trace_args

    parser = argparse.ArgumentParser(prog="python -m hwbackend.replay_cli", description=__doc__.splitlines()[0])
    add_trace_args(parser)
    add_config_args(parser)
    parser.add_argument("--out", required=True, help="run directory to write")
    parser.add_argument("--force", action="store_true", help="overwrite the run files in --out")
    parser.add_argument("--device", default="cuda:0", help="cuda:N (real VMM) or cpu (emulated driver, tiny model)")
    parser.add_argument("--attention", default="auto", choices=("auto", "varlen", "gather", "reference"))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit 0 on success."""
    from cli import config_from_args, load_workload

    args = build_parser().parse_args(argv)
    config = config_from_args(args)
    trace, notes = load_workload(args, config.seed, config.slot_max_tokens)
    for note in notes:
        print(f"replay: warning: {note}", file=sys.stderr)
    shape = TINY_SHAPE if args.device == "cpu" else None
    output, meta = replay(config, trace, args.device, shape, args.attention)
    meta.update(trace_source=trace.attrs.get("source", args.trace), rate_scale=args.rate_scale,
                num_requests=args.num_requests, command=" ".join(["python -m hwbackend.replay_cli", *sys.argv[1:]]))
    out = write_hw_run(output, config, trace, meta, args.out, force=args.force)
    summary = json.loads((out / "summary.json").read_text())
    print(f"wrote {out}: {summary['finished']} finished, {summary['iterations']} iterations, "
          f"iteration p50 {summary['iteration_p50_ms']:.2f} ms, TTFT p50 {summary['ttft_p50_ms']:.1f} ms, "
          f"TPOT p50 {summary['tpot_p50_ms']:.2f} ms, wall {meta['replay_wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
