"""Benchmark: the speed targets of issues 18 and 32, each case a fresh whole process, printing wall and CPU
seconds, iterations per second, peak RSS and the SimPy-floor ratio against its targets. Not a test.

    python bench/bench_targets.py [--only conv|arxiv|splitwise|version] [--runs N]

* **SimPy floor** (issue 32): the same process, after its work, times 1,000,000 bare ``env.timeout(1)`` events
  of a fresh ``simpy.Environment`` (one process yielding them). The ratio is the whole process's wall time
  (interpreter start to exit, as the parent sees it, less the floor's own time) over that floor's wall time,
  and the same for CPU seconds; both scale alike with the machine's speed, so the ratio travels between
  machines better than seconds do. Targets: conversation trace <= 2.0, arXiv Poisson 16 x 4,000 <= 1.0.
* **The process** is ``cli.py simulate`` as a user runs it (imports, trace read, simulation, run directory
  written, summary printed: ``--quiet``, output into a temporary directory).
* **version**: ``cli.py --version`` as a whole process, target <= 0.15 s wall; shown beside ``python -c pass``
  (the interpreter's own start-up on this machine).
* The issue-18 wall targets of the simulation alone (1.5, 0.6, 2.5 s) are printed as before, from the
  simulation's own timer (``simulated in X s wall``).
* kvsim against Vidur on splitwise_conv: ``bench/bench_vidur.py``.

State the machine's load when quoting the figures (the load average is printed first, then how many of the
hot modules run compiled, :mod:`sim.compiled`; ``KVSIM_PURE_PYTHON=1`` times the pure-Python form; each figure is the
median of ``--runs`` runs, min and max beside it): the targets are for an idle 2-core machine of the
project's class.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
CASES = {
    # name: (simulation wall target s, SimPy-floor target or None, description, simulate arguments)
    "conv": (1.5, 2.0, "Azure 2023 conversation trace, Llama-3-8B, H200",
             ["--trace", str(TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv")]),
    "arxiv": (0.6, 1.0, "arXiv summarization lengths, Poisson 16 req/s, first 4,000, Llama-3-8B, H200",
              ["--trace", str(TRACES / "vidur_processed_traces" /
                              "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"),
               "--arrival", "poisson:16", "--seed", "0", "--num-requests", "4000"]),
    "splitwise": (2.5, None, "splitwise_conv, Llama-2-7B, A100, vllm scheduler",
                  ["--trace", str(TRACES / "vidur_processed_traces" / "splitwise_conv.csv"), "--model", "llama-2-7b",
                   "--gpu", "a100", "--scheduler", "vllm"]),
}
VERSION_TARGET_S = 0.15

CHILD = r"""
import json, re, sys, time, contextlib, io
sys.path.insert(0, {root!r})
sys.argv = ["kvsim"] + {args!r}
from cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    status = main(sys.argv[1:])
if status:
    sys.exit(status)
text = out.getvalue()
import simpy
env = simpy.Environment()
def bare(env):
    for _ in range(1_000_000):
        yield env.timeout(1)
env.process(bare(env))
wall, cpu = time.perf_counter(), time.process_time()
env.run()
floor_wall, floor_cpu = time.perf_counter() - wall, time.process_time() - cpu
simulated = re.search(r"simulated in ([0-9.]+) s wall", text)
iterations = re.search(r"^iterations\s+([0-9,]+)", text, re.M)
print(json.dumps({{"floor_wall_s": floor_wall, "floor_cpu_s": floor_cpu,
                  "simulation_wall_s": float(simulated.group(1)) if simulated else None,
                  "iterations": int(iterations.group(1).replace(",", "")) if iterations else None}}))
"""


def _process(command: list[str]) -> tuple[float, float, int, str]:
    """(wall s, CPU s, peak RSS KiB, stdout) of one whole child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (wall_s, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), after.ru_maxrss,
            done.stdout)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted([*CASES, "version"]), default=None)
    parser.add_argument("--runs", type=int, default=3, help="runs per case (median, min, max printed)")
    args = parser.parse_args()
    print("load:", os.getloadavg())
    sys.path.insert(0, str(ROOT))
    from sim.compiled import status       # which form the simulator's hot modules run in (sim/compiled.py)
    print(status())
    if args.only in (None, "version"):
        version = [_process([sys.executable, str(ROOT / "cli.py"), "--version"])[:2] for _ in range(args.runs * 3)]
        bare = [_process([sys.executable, "-c", "pass"])[:2] for _ in range(args.runs * 3)]
        median = statistics.median(w for w, _ in version)
        print(f"version    kvsim --version: wall {_spread([w for w, _ in version])} s, CPU "
              f"{_spread([c for _, c in version])} s; python -c pass: wall {_spread([w for w, _ in bare])} s; "
              f"target <= {VERSION_TARGET_S} s wall: {'met' if median <= VERSION_TARGET_S else 'NOT met'}")
    for name, (target_s, floor_target, description, simulate) in CASES.items():
        if args.only and name != args.only:
            continue
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            for run in range(args.runs):
                code = CHILD.format(root=str(ROOT), args=["simulate", *simulate, "--out", f"{tmp}/run{run}",
                                                          "--force", "--quiet"])
                wall_s, cpu_s, rss_kib, stdout = _process([sys.executable, "-c", code])
                child = json.loads(stdout.strip().splitlines()[-1])
                rows.append((wall_s - child["floor_wall_s"], cpu_s - child["floor_cpu_s"], child, rss_kib))
        walls, cpus = [r[0] for r in rows], [r[1] for r in rows]
        floor_ratio = [r[0] / r[2]["floor_wall_s"] for r in rows]
        floor_cpu_ratio = [r[1] / r[2]["floor_cpu_s"] for r in rows]
        simulated = [r[2]["simulation_wall_s"] for r in rows]
        iterations = rows[0][2]["iterations"] or 0
        line = (f"{name:10s} {description}: process wall {_spread(walls)} s, CPU {_spread(cpus)} s; simulation "
                f"{_spread(simulated)} s wall ({iterations / statistics.median(simulated):,.0f} iterations/s; "
                f"issue-18 target <= {target_s} s: {'met' if statistics.median(simulated) <= target_s else 'NOT met'}); "
                f"SimPy floor {_spread([r[2]['floor_wall_s'] for r in rows])} s; process / floor: wall "
                f"{_spread(floor_ratio)}, CPU {_spread(floor_cpu_ratio)}")
        if floor_target is not None:
            line += (f"; target <= {floor_target}: "
                     f"{'met' if statistics.median(floor_ratio) <= floor_target else 'NOT met'}")
        print(line + f"; peak RSS {max(r[3] for r in rows) / 1024:,.0f} MiB (largest child so far)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
