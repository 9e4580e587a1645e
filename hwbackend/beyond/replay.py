"""``python -m hwbackend.beyond.replay``: the hardware replay (:mod:`hwbackend.replay.cli`, same options, same
records) with each iteration split into phases, written to ``phases.parquet`` in the run directory.

The loop is :class:`hwbackend.replay.loop.ReplayLoop` unchanged (its records are bit-for-bit those of
``replay_cli``); :class:`PhaseTimedLoop` only takes host timestamps around calls the loop already makes
(``model.forward``, ``executor.map_ahead``, ``executor.poll_completed``) and records two CUDA events around
the forward. Per iteration (microseconds)::

    start ─ sched ─┬─ stall (executor.step) ─┬─ pre (pool snapshot, BatchInputs) ─ launch (model.forward,
                   │                         │  host) ─ after_launch (iteration_launched, map_ahead) ─ wait
                   │                         │  (tokens.cpu(): GPU still busy) ─ post (poll, first-token and
                   │                         │  completion bookkeeping, frees) ─ end
    forward_wall = launch + after_launch + wait   (what the calibration grid times, minus step and inputs)
    gpu_forward  = CUDA events before / after the forward's kernels (GPU span of the forward)
    loop_overhead = duration - stall - forward_wall = sched + pre + post

``loop_overhead`` is what a serving loop costs around the forward pass itself (scheduler, records, slot
frees, input construction), on top of which the mapper thread competes for the interpreter lock while the
host launches kernels (``launch`` > ``gpu_forward`` means the GPU waited for the host).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from hwbackend.replay.loop import ReplayLoop

PHASE_COLUMNS = ("iteration", "start_at_us", "duration_us", "sched_us", "stall_us", "pre_us", "launch_us",
                 "after_launch_us", "wait_us", "post_us", "forward_wall_us", "gpu_forward_us", "loop_overhead_us",
                 "batch_size", "prefill_tokens", "decode_tokens")


class PhaseTimedLoop(ReplayLoop):
    """:class:`ReplayLoop` recording :data:`PHASE_COLUMNS` per iteration in ``phases`` (list of dicts)."""

    last: "PhaseTimedLoop | None" = None

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.phases: list[dict] = []
        self._marks: dict[str, float] = {}
        self._events: tuple | None = None
        self._after_map_ahead = False
        forward, map_ahead, poll = self.model.forward, self.executor.map_ahead, self.executor.poll_completed
        cuda = getattr(self.model.device, "type", "cpu") == "cuda"

        def timed_forward(*a: Any, **k: Any) -> Any:
            self._marks["forward_start"] = self.now_us()
            if cuda:
                import torch
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
            out = forward(*a, **k)
            if cuda:
                end.record()
                self._events = (begin, end)
            self._marks["forward_end"] = self.now_us()
            return out

        def timed_map_ahead(*a: Any, **k: Any) -> Any:
            out = map_ahead(*a, **k)
            self._marks["map_ahead_end"] = self.now_us()
            self._after_map_ahead = True
            return out

        def timed_poll(*a: Any, **k: Any) -> Any:
            if self._after_map_ahead:  # the loop's poll right after tokens.cpu()
                self._marks["done"] = self.now_us()
                self._after_map_ahead = False
            return poll(*a, **k)

        self.model.forward = timed_forward
        self.executor.map_ahead = timed_map_ahead
        self.executor.poll_completed = timed_poll
        PhaseTimedLoop.last = self

    def _iterate(self, batch: list, iteration: int, start_us: float, stall_us: float, sync_maps: int) -> None:
        self._marks["enter"] = self.now_us()
        # the stall (the memory steps) ends where _iterate begins: it began stall_us earlier
        self._marks["step_start"] = self._marks["enter"] - stall_us
        self._events = None
        super()._iterate(batch, iteration, start_us, stall_us, sync_maps)
        m, record = self._marks, dict(zip(_ITERATION_COLUMNS, self.iteration_records[-1]))
        end = start_us + record["duration_us"]
        gpu_us = float("nan")
        if self._events is not None:
            gpu_us = self._events[0].elapsed_time(self._events[1]) * 1e3  # both done: tokens.cpu() synchronised
        forward_wall = m["done"] - m["forward_start"]
        self.phases.append({
            "iteration": iteration, "start_at_us": start_us, "duration_us": record["duration_us"],
            "sched_us": m["step_start"] - start_us, "stall_us": stall_us, "pre_us": m["forward_start"] - m["enter"],
            "launch_us": m["forward_end"] - m["forward_start"], "after_launch_us": m["map_ahead_end"] - m["forward_end"],
            "wait_us": m["done"] - m["map_ahead_end"], "post_us": end - m["done"], "forward_wall_us": forward_wall,
            "gpu_forward_us": gpu_us, "loop_overhead_us": record["duration_us"] - stall_us - forward_wall,
            "batch_size": record["batch_size"], "prefill_tokens": record["prefill_tokens"],
            "decode_tokens": record["decode_tokens"]})


def _iteration_columns() -> tuple:
    from sim.results.records import ITERATION_COLUMNS
    return ITERATION_COLUMNS


_ITERATION_COLUMNS = _iteration_columns()


def phases_frame(loop: PhaseTimedLoop) -> pd.DataFrame:
    return pd.DataFrame.from_records(loop.phases, columns=list(PHASE_COLUMNS))


def summarize_phases(phases: pd.DataFrame, decode_batch: tuple[int, int] = (14, 18)) -> dict[str, Any]:
    """Medians of every phase over all iterations and over decode-only iterations with a batch in
    ``decode_batch`` (inclusive), in microseconds."""
    cols = [c for c in PHASE_COLUMNS if c.endswith("_us") and c != "start_at_us"]
    decode = phases[(phases.prefill_tokens == 0) & phases.batch_size.between(*decode_batch)]
    return {"iterations": len(phases), "median_all_us": {c: round(float(phases[c].median()), 1) for c in cols},
            "decode_only_batch": list(decode_batch), "decode_only_iterations": len(decode),
            "median_decode_only_us": {c: round(float(decode[c].median()), 1) for c in cols} if len(decode) else {}}


def main(argv: list[str] | None = None) -> int:
    """Run ``replay_cli.main`` with :class:`PhaseTimedLoop`; then write ``phases.parquet`` and
    ``phases_summary.json`` into ``--out``."""
    import json

    import hwbackend.replay.cli as replay_cli

    argv = list(sys.argv[1:] if argv is None else argv)
    replay_cli.ReplayLoop = PhaseTimedLoop
    PhaseTimedLoop.last = None
    started = time.perf_counter()
    # parses and checks every option, the device and --out before the replay, with one message each
    status = replay_cli.main(argv, prog="python -m hwbackend.beyond.replay",
                             description="the hardware replay with each iteration split into phases (phases.parquet)")
    loop = PhaseTimedLoop.last
    if loop is not None and status == 0:
        out = Path(next(a.split("=", 1)[1] if a.startswith("--out=") else argv[i + 1]
                        for i, a in enumerate(argv) if a == "--out" or a.startswith("--out=")))
        frame = phases_frame(loop)
        frame.to_parquet(out / "phases.parquet", index=False)
        summary = summarize_phases(frame)
        summary["command_wall_s"] = round(time.perf_counter() - started, 1)
        (out / "phases_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        print("phases (median us, all / decode-only b14-18):")
        for col, value in summary["median_all_us"].items():
            print(f"  {col:<18} {value:>10.1f}  {summary['median_decode_only_us'].get(col, float('nan')):>10.1f}")
    return status


if __name__ == "__main__":
    sys.exit(main())
