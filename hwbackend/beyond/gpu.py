"""The one GPU session of issue 10 (and the x1.5 re-validation of issue 5), as a deadline-bounded runner.

``python -m hwbackend.beyond.gpu --out DIR [--deadline-s 545]`` runs, each part in its own subprocess with
a timeout inside the deadline, writing its result under ``DIR`` as soon as it finishes:

1. ``pytest -m gpu tests/test_hw_beyond.py`` (prefix sharing / COW, zero-on-reuse, cross-layer over VMM);
2. ``memory``: memset and copy bandwidth over mapped VMM pages -> ``memory.json`` (profile section ``memory``);
3. ``layout``: attention per KV layout -> ``layout.json`` (profile section ``layout``);
4. ``pytest -m gpu tests/test_hw_tp_gpu.py``;
5. the hardware replay of the trace's first 1,000 requests at ``--rate-scale 1.5``, asynchronous then
   synchronous mapping (:mod:`hwbackend.beyond.replay`), each only if the time left can hold it.

Part logs and run directories go to ``DIR/runs/``; ``times.json`` records each part's status and seconds.
Exit status 1 if any part that ran failed (non-zero exit or killed), 2 without the trace or without a GPU that
torch sees (one line).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TRACE_CANDIDATES = ("shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
                    "../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv")
"""Where the Azure 2023 conversation trace lies: beside the checkout on the device machine, or one level up
(the traces are never copied into the repository)."""
REPLAY_NEEDS_S = 185


def memory_part(out: Path) -> None:
    from hwbackend.calibration.vmm import environment, measure_memory_bandwidth
    from hwbackend.vmm.driver import CudaVmmDriver

    import torch
    torch.cuda.init()
    with CudaVmmDriver(0) as driver:
        section = measure_memory_bandwidth(driver)
        section["environment"] = environment(driver)
    out.write_text(json.dumps(section, indent=1) + "\n")
    print(f"memory: memset {section['memset_bytes_per_s'] / 1e12:.3f} TB/s, copy (read+write) "
          f"{section['copy_bytes_per_s'] / 1e12:.3f} TB/s; all: "
          + ", ".join(f"{k} {v / 1e12:.3f}" for k, v in section["bytes_per_s"].items()))


def layout_part(out: Path) -> None:
    from hwbackend.beyond.layout import main
    main(["--out", str(out)])


def run_part(name: str, cmd: list[str], log: Path, timeout_s: float, times: dict) -> int:
    """Run ``cmd``, echo its output (and copy it to ``log``), kill it after ``timeout_s``."""
    import threading

    start = time.perf_counter()
    print(f"=== {name}: {' '.join(cmd)} (timeout {timeout_s:.0f} s)", flush=True)
    rc = -1
    with log.open("w") as f:
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})

            def pump() -> None:
                for line in proc.stdout:  # type: ignore[union-attr]
                    sys.stdout.write(line)
                    sys.stdout.flush()
                    f.write(line)

            reader = threading.Thread(target=pump, daemon=True)
            reader.start()
            try:
                rc = proc.wait(timeout=max(1.0, timeout_s))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = -9
                print(f"{name}: killed after {timeout_s:.0f} s")
            reader.join(timeout=5)
        except Exception as exc:  # noqa: BLE001 - record and go on with the next part
            print(f"{name}: failed to run: {exc!r}")
    times[name] = {"rc": rc, "seconds": round(time.perf_counter() - start, 1)}
    print(f"=== {name}: rc {rc}, {times[name]['seconds']} s", flush=True)
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hwbackend.beyond.gpu")
    parser.add_argument("--out", required=True)
    parser.add_argument("--deadline-s", type=float, default=545.0)
    parser.add_argument("--part", choices=("memory", "layout"), help="run one measurement in this process")
    parser.add_argument("--trace", help="the Azure 2023 conversation trace (default: the first of "
                                        f"{', '.join(TRACE_CANDIDATES)} that exists)")
    args = parser.parse_args(argv)
    from hwbackend.replay.tp.cli import gpu_preflight
    problem = gpu_preflight(("cuda:0",), "these measurements need the GPU (tests/test_hw_beyond.py runs the "
                                         "emulated parts on the CPU)")
    if problem:
        parser.exit(2, f"{parser.prog}: error: {problem}\n")
    trace = args.trace or next((t for t in TRACE_CANDIDATES if Path(t).is_file()), None)
    if args.part is None and (trace is None or not Path(trace).is_file()):
        parser.exit(2, f"{parser.prog}: error: trace not found: {args.trace or ' or '.join(TRACE_CANDIDATES)}\n")
    out = Path(args.out)
    if args.part == "memory":
        memory_part(out)
        return 0
    if args.part == "layout":
        layout_part(out)
        return 0
    t0 = time.perf_counter()
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    times: dict = {}

    def left() -> float:
        return args.deadline_s - (time.perf_counter() - t0)

    def save() -> None:
        (out / "times.json").write_text(json.dumps(times, indent=1) + "\n")

    py = sys.executable
    parts = [
        ("pytest_beyond", [py, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_hw_beyond.py"], 100),
        ("memory", [py, "-m", "hwbackend.beyond.gpu", "--part", "memory", "--out", str(out / "memory.json")], 60),
        ("layout", [py, "-m", "hwbackend.beyond.gpu", "--part", "layout", "--out", str(out / "layout.json")], 90),
        ("pytest_tp", [py, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_hw_tp_gpu.py"], 100),
    ]
    for name, cmd, limit in parts:
        if left() < 20:
            times[name] = {"rc": None, "skipped": "no time left"}
            continue
        run_part(name, cmd, runs / f"{name}.log", min(limit, left() - 10), times)
        save()
    for mode, extra in (("async", []), ("sync", ["--sync-mapping"])):
        name = f"replay_{mode}"
        if left() < REPLAY_NEEDS_S:
            times[name] = {"rc": None, "skipped": f"{left():.0f} s left < {REPLAY_NEEDS_S} s"}
            print(f"=== {name}: skipped ({left():.0f} s left)", flush=True)
            continue
        cmd = [py, "-m", "hwbackend.beyond.replay", "--trace", trace, "--num-requests", "1000", "--rate-scale", "1.5", *extra,
               "--out", str(runs / f"hw-{mode}-x1.5")]
        run_part(name, cmd, runs / f"{name}.log", left() - 8, times)
        save()
    times["total_s"] = round(time.perf_counter() - t0, 1)
    save()
    print(json.dumps(times))
    failed = [name for name, part in times.items() if isinstance(part, dict) and part.get("rc") not in (0, None)]
    if failed:
        print(f"{parser.prog}: parts failed: {', '.join(failed)} (logs in {runs})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
