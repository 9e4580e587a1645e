"""``python -m hwbackend.replay.cli``: replay a trace on the GPU and write a run directory.

Same options as ``kvsim simulate`` for the workload and the configuration (``--trace``, ``--num-requests``,
``--rate-scale``, ``--model``, ``--sync-mapping``, ...), so that ``kvsim validate`` can rebuild the very same
simulation. The run directory has the simulator's layout (``analysis/results.py``: requests.parquet,
iterations.parquet, summary.json, config.json) plus ``shapes.parquet`` (what each iteration computed, for
:mod:`hwbackend.calibration.inloop`). The replayed trace slice is not copied: ``kvsim validate`` rebuilds it
from ``requests.parquet`` (arrival, prompt and output tokens of every request, as replayed).

Example (the H200 validation runs, ``docs/validation/README.md``)::

    python -m hwbackend.replay.cli --trace ../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv --num-requests 1000 \\
        --rate-scale 3 --out $OUT/hw-async
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from hwbackend.replay.model import DecoderModel
from hwbackend.replay.loop import ReplayLoop
from hwbackend.replay.kv import open_kv, pin_base_pages
from sim.setup.catalog import ModelSpec
from sim.results.json_text import nan_for_null

TINY_SHAPE = ModelSpec(name="tiny-decoder", num_layers=2, hidden_size=256, num_q_heads=8, num_kv_heads=8, head_dim=128,
                       ffn_size=512, vocab_size=1000, max_context_tokens=8192)
"""A CPU-sized decoder with Llama-3-8B's KV head shape (so a 2 MiB page still holds 1024 tokens)."""


def choose_attention(model: DecoderModel, requested: str) -> tuple[str, dict]:
    """``auto``: ``varlen`` (zero-copy) if it matches ``gather`` on a random case, else ``gather``; CPU:
    ``reference``. Returns the backend and the check's figures (max abs difference)."""
    import torch

    if model.device.type != "cuda":
        return ("reference" if requested == "auto" else requested), {}
    if requested != "auto":
        return requested, {}
    from hwbackend.replay.model import BatchInputs, SeqWork, attend

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


WARMUP_SHAPES = ((0, 0, ((2048, 0),)), (0, 0, ((1024, 1024),)), (64, 512, ()), (16, 1024, ()),
                 (48, 512, ((1024, 0),)), (8, 1024, ((64, 0),)), (1, 256, ()))
"""(decodes, decode context, prefill chunks (tokens, context)) run by :func:`warm_up`: the largest
activations an iteration of the default token budget (2048) allocates, and the kernels of every kind of
batch, so that neither the caching allocator nor kernel selection runs inside the timed loop."""


def warm_up(model: DecoderModel, seconds: float = 0.0) -> int:
    """Run :data:`WARMUP_SHAPES` eagerly on scratch K/V (twice each, then round after round until
    ``seconds`` have passed: a host that has just started runs the first tens of seconds slower,
    ``docs/validation/README.md``). Returns the number of forwards run."""
    import torch

    from hwbackend.replay.model import BatchInputs, SeqWork

    s, slot_tokens = model.shape, 2048
    slots = max(d + len(c) for d, _, c in WARMUP_SHAPES)
    scratch = torch.zeros(slots * slot_tokens, s.num_kv_heads, s.head_dim, device=model.device, dtype=model.dtype)
    batches = [[SeqWork(i, ctx, 1, True) for i in range(d)]
               + [SeqWork(d + j, c, t, True) for j, (t, c) in enumerate(chunks)] for d, ctx, chunks in WARMUP_SHAPES]
    started, runs = time.perf_counter(), 0
    while runs < 2 * len(batches) or time.perf_counter() - started < seconds:
        for work in batches:
            inputs = getattr(model, "batch_inputs", BatchInputs)(work, slot_tokens, model.device)
            model.eager_forward(inputs, [scratch] * s.num_layers,
                                [scratch] * s.num_layers).cpu()
            runs += 1
    del scratch
    return runs


def replay(config: Any, trace: pd.DataFrame, device: str = "cuda:0", shape: ModelSpec | None = None,
           attention: str = "auto", sleep=time.sleep, cuda_graphs: bool = True,
           warmup_s: float = 20.0, compute: str = "harness", piecewise_graphs: bool = False) -> tuple[Any, dict]:
    """Replay ``trace`` under ``config``; returns the :class:`hwbackend.replay.loop.ReplayOutput` and run metadata.

    On CUDA: ``warmup_s`` seconds of eager warm-up (:func:`warm_up`), then, with ``cuda_graphs``, decode
    iterations as CUDA graphs (:func:`hwbackend.replay.model.capture_decode_graphs`, batch sizes 1..max batch).
    ``compute``: ``harness`` (:class:`hwbackend.replay.model.DecoderModel`) or ``engine``
    (:class:`hwbackend.replay.engine.EngineDecoderModel`: fused kernels, split-KV decodes); ``piecewise_graphs``
    (engine, with ``cuda_graphs``): batches with prefill chunks of up to 512 tokens run as piecewise CUDA graphs
    (:class:`hwbackend.replay.engine.EnginePiecewiseGraphs`).
    """
    shape = shape or config.model_spec.per_worker(config.tp)
    model, extra = prepare_model(shape, device, config.seed, attention, warmup_s, compute)
    kv = open_kv(config, shape, device)
    try:
        if compute == "engine" and model.device.type == "cuda":   # Triton checks the tensors' base pointers
            extra["anchor_slot"] = pin_base_pages(kv)
        capture_graphs(model, kv, config.max_batch_slots, cuda_graphs, extra, piecewise_graphs)
        gc.collect()
        gc.freeze()
        gc.disable()  # a full collection mid-run costs ~50 ms (docs/hwbackend.md)
        started = time.perf_counter()
        output = ReplayLoop(config, trace, model, kv, sleep=sleep).run()
        wall_s = time.perf_counter() - started
    finally:
        gc.enable()
        kv.close()
    meta = {"backend": "hardware", "device": device, "compute": compute, "replay_wall_s": wall_s,
            "transformer_shape": shape.decoder_shape(), **extra, **_environment(model)}
    return output, meta


def prepare_model(shape: ModelSpec, device: str, seed: int, attention: str = "auto", warmup_s: float = 20.0,
                  compute: str = "harness") -> tuple[Any, dict]:
    """The decoder of ``compute`` on ``device`` (:func:`hwbackend.replay.engine.build_model`), its attention
    backend chosen (:func:`choose_attention`) and, on CUDA, warmed up for ``warmup_s`` seconds (:func:`warm_up`).
    Returns the model and the run metadata so far (``attention_backend``, the check's figures, warm-up)."""
    from hwbackend.replay.engine import build_model

    model = build_model(compute, shape, device, seed)
    backend, check = choose_attention(model, attention)
    model.attention = backend
    extra: dict = {"cuda_graphs": False, "attention_backend": backend, **check}
    if model.device.type == "cuda":
        started = time.perf_counter()
        extra["warmup_forwards"] = warm_up(model, warmup_s)
        extra["warmup_s"] = round(time.perf_counter() - started, 1)
    return model, extra


def capture_graphs(model: Any, kv: Any, max_batch: int, cuda_graphs: bool, extra: dict,
                   piecewise_graphs: bool = False) -> None:
    """On CUDA with ``cuda_graphs``, capture decode iterations of batch 1..``max_batch`` as CUDA graphs over the
    open cache ``kv`` (:func:`hwbackend.replay.model.capture_decode_graphs`) and, with ``piecewise_graphs`` on the
    engine decoder, the piecewise graphs of batches with prefill chunks
    (:func:`hwbackend.replay.engine.capture_piecewise_graphs`); ``extra`` gets ``cuda_graphs``,
    ``graph_capture_s`` or ``graph_capture_error``, ``piecewise_graphs`` and ``piecewise_capture_s`` (a failed
    capture leaves those iterations eager, with a warning on stderr)."""
    backend = extra.get("attention_backend", getattr(model, "attention", ""))
    if not cuda_graphs or model.device.type != "cuda":
        return
    if backend != "varlen":
        # gather / reference read per-batch host data a captured graph would replay stale
        extra["graph_capture_error"] = f"decode graphs need the varlen attention backend, not {backend}"
        print(f"replay: warning: {extra['graph_capture_error']}; decodes run eagerly", file=sys.stderr)
        return
    from hwbackend.replay.model import capture_decode_graphs

    try:
        extra["graph_capture_s"] = round(capture_decode_graphs(model, kv, max_batch), 1)
        extra["cuda_graphs"] = True
    except RuntimeError as exc:  # recorded in config.json; the replay runs every iteration eagerly
        model.graphs = None
        extra["graph_capture_error"] = str(exc).splitlines()[0][:300]
        print(f"replay: warning: CUDA graph capture failed, decodes run eagerly: {exc}", file=sys.stderr)
    extra["piecewise_graphs"] = False
    if piecewise_graphs and hasattr(model, "pieces"):
        from hwbackend.replay.engine import capture_piecewise_graphs

        try:
            extra["piecewise_capture_s"] = round(capture_piecewise_graphs(model, kv), 1)
            extra["piecewise_graphs"] = True
        except RuntimeError as exc:
            model.piecewise = None
            extra["piecewise_capture_error"] = str(exc).splitlines()[0][:300]
            print(f"replay: warning: piecewise graph capture failed, mixed batches run eagerly: {exc}",
                  file=sys.stderr)


def _environment(model: DecoderModel) -> dict:
    import torch

    env = {"torch_version": torch.__version__, "python_version": platform.python_version()}
    if model.device.type == "cuda":
        env["gpu_name"] = torch.cuda.get_device_name(model.device)
    return env


def write_hw_run(output: Any, config: Any, meta: dict, out_dir: str | Path, force: bool = False) -> Path:
    """Write the run directory (simulator layout plus ``shapes.parquet`` and ``counters.json``).

    Raises:
        FileExistsError: if ``out_dir`` already holds a run and ``force`` is false.
    """
    if not force and (Path(out_dir) / "summary.json").exists():
        raise FileExistsError(f"{out_dir} already holds a run; pass --force")
    requests, iterations = output.requests_frame(), output.iterations_frame()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "counters.json").write_text(json.dumps(output.counters, indent=1) + "\n")
    requests.to_parquet(out / "requests.parquet", index=False)
    iterations.to_parquet(out / "iterations.parquet", index=False)
    output.shapes_frame().to_parquet(out / "shapes.parquet", index=False)
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

        path = Path(__file__).resolve().parents[2] / "analysis" / "results.py"
        spec = importlib.util.spec_from_file_location("_kvsim_analysis_results", path)
        results = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = results  # dataclasses look their module up there
        spec.loader.exec_module(results)
    return results


def build_parser(prog: str = "python -m hwbackend.replay.cli", description: str | None = None) -> argparse.ArgumentParser:
    from sim.frontend.options import add_config_args
    from traces.workload import add_trace_args

    parser = argparse.ArgumentParser(prog=prog, description=description or __doc__.splitlines()[0])
    add_trace_args(parser)
    add_config_args(parser)
    parser.add_argument("--out", required=True, help="run directory to write")
    parser.add_argument("--force", action="store_true", help="overwrite the run files in --out")
    parser.add_argument("--device", default="cuda:0", help="cuda:N (real VMM) or cpu (emulated driver, tiny model)")
    parser.add_argument("--attention", default="auto", choices=("auto", "varlen", "gather", "reference"))
    parser.add_argument("--compute", choices=("engine", "harness"), default="engine",
                        help="decoder kernels: engine (fused norms and activations, split-KV decode attention; "
                             "default) or harness (the unfused decoder of the replays before 2026-12)")
    parser.add_argument("--no-cuda-graphs", action="store_true",
                        help="run decode iterations eagerly too (default: CUDA graphs for decode-only batches)")
    parser.add_argument("--piecewise-graphs", action="store_true",
                        help="engine compute: run batches with prefill chunks of up to 512 tokens as piecewise CUDA "
                             "graphs (all but attention captured per padded token count, as vLLM v1); default off")
    parser.add_argument("--warmup-s", type=float, default=20.0,
                        help="seconds of eager warm-up before the clock starts (CUDA); default 20")
    return parser


def preflight(device: str, out_dir: str | Path, force: bool, warmup_s: float) -> str | None:
    """Why a replay on ``device`` into ``out_dir`` cannot start (one line), or None. Checked before the trace
    is loaded and before minutes of GPU time: torch present, ``cpu`` or ``cuda:N`` with that device
    visible and supporting CUDA VMM (:class:`hwbackend.vmm.driver.CudaVmmDriver` opened and closed), ``--out``
    not a file and not holding a run unless ``force``, ``warmup_s`` >= 0."""
    if not warmup_s >= 0:
        return f"--warmup-s {warmup_s}: must be >= 0 seconds"
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        return f"--out {out}: exists and is not a directory"
    if not force and (out / "summary.json").exists():
        return f"--out {out}: already holds a run (summary.json); pass --force to overwrite its run files"
    created = [p for p in (out, *out.parents) if not p.exists()]      # removed again if a later check fails
    try:  # the run directory is made now, so that a path that cannot hold one fails before the replay
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"--out {out}: cannot create the run directory ({exc.strerror or exc})"
    reason = _device_problem(device)
    if reason is not None:
        for directory in created:          # deepest first: a refused run leaves nothing behind
            try:
                directory.rmdir()
            except OSError:
                break
    return reason


def _device_problem(device: str) -> str | None:
    """Why the replay cannot run on ``device`` (torch missing, no such CUDA device, no VMM support), or None."""
    try:
        import torch
    except ImportError:
        return ("the replay needs torch (and cuda-python for --device cuda:N): pip install -e '.[hw]'")
    if device == "cpu":
        return None
    prefix, _, ordinal = device.partition(":")
    if prefix != "cuda" or not ordinal.isdigit():
        return f"--device {device!r}: use cuda:N (a GPU with CUDA VMM) or cpu (emulated driver, tiny model)"
    if not torch.cuda.is_available():
        return f"--device {device}: torch sees no CUDA device (torch {torch.__version__}); --device cpu runs the emulated replay"
    from hwbackend.vmm.driver import CudaVmmDriver, GpuUnavailableError

    try:
        CudaVmmDriver(int(ordinal)).close()
    except GpuUnavailableError as exc:
        return f"--device {device}: {exc}"
    return None


def unsupported(config: Any, device: str, attention: str) -> str | None:
    """A configuration the hardware replay does not implement (one line), or None: tensor parallelism (one
    GPU, one worker), swap preemption (recompute only), the ``varlen`` FlashAttention backend on CPU."""
    if config.tp != 1:
        return (f"--tp {config.tp}: this replay runs one worker on one GPU (tp 1); the tensor-parallel replay is "
                f"python -m hwbackend.replay.tp.cli (one process per GPU)")
    if config.preemption != "recompute":
        return f"--preemption {config.preemption}: the hardware replay implements recompute preemption only"
    if device == "cpu" and attention == "varlen":
        return "--attention varlen needs CUDA (FlashAttention); on --device cpu use auto, gather or reference"
    return None


def main(argv: list[str] | None = None, prog: str = "python -m hwbackend.replay.cli",
         description: str | None = None) -> int:
    """Entry point; exit 0 on success, 2 for an option, trace or machine that cannot be used (one line on
    stderr, checked before the replay starts)."""
    from sim.frontend.options import config_from_args
    from traces.workload import load_workload

    from sim.frontend.flags import flag_message, parser_flags
    parser = build_parser(prog, description)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:  # a bad option value: one message naming the flag, no traceback
        print(f"replay: error: {flag_message(exc, parser_flags(parser))}", file=sys.stderr)
        return 2
    problem = unsupported(config, args.device, args.attention) or preflight(args.device, args.out, args.force,
                                                                              args.warmup_s)
    if problem:
        print(f"replay: error: {problem}", file=sys.stderr)
        return 2
    try:
        trace, notes = load_workload(args, config.seed, config.slot_max_tokens)
    except (ValueError, OSError) as exc:  # a bad trace: one message, no traceback
        print(f"replay: error: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"replay: warning: {note}", file=sys.stderr)
    shape = TINY_SHAPE if args.device == "cpu" else None
    try:
        output, meta = replay(config, trace, args.device, shape, args.attention, cuda_graphs=not args.no_cuda_graphs,
                              piecewise_graphs=args.piecewise_graphs,
                              warmup_s=args.warmup_s, compute=args.compute)
    except MemoryError as exc:
        print(f"replay: error: the KV cache or model does not fit this machine's memory ({exc})", file=sys.stderr)
        return 2
    meta.update(trace_source=trace.attrs.get("source", args.trace), rate_scale=args.rate_scale,
                num_requests=args.num_requests, skip_requests=args.skip_requests, command=" ".join([prog, *(sys.argv[1:] if argv is None else argv)]))
    out = write_hw_run(output, config, meta, args.out, force=args.force)
    summary = nan_for_null(json.loads((out / "summary.json").read_text()))
    print(f"wrote {out}: {summary['finished']} finished, {summary['iterations']} iterations, "
          f"iteration p50 {summary['iteration_p50_ms']:.2f} ms, TTFT p50 {summary['ttft_p50_ms']:.1f} ms, "
          f"TPOT p50 {summary['tpot_p50_ms']:.2f} ms, wall {meta['replay_wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
