"""How much a uniform compute-time scale moves the simulated TTFT / TPOT of a held-out run (issue 19 analysis).

    python docs/validation/cross-workload/sensitivity.py [RUN_DIR] [PROFILE]

Simulates the run's requests and configuration (as ``kvsim validate`` does) with every iteration's compute time
multiplied by 0.97 .. 1.03, to show how ill-conditioned TTFT is near saturation (docs/validation/README.md).
"""
import sys
from hwbackend.calibration.run_files import config_from_run
import json, pandas as pd
from sim.runner import load_models
from sim.engine import Simulator
from analysis.results import build_result

run = sys.argv[1] if len(sys.argv) > 1 else "docs/validation/cross-workload/test-arxiv-async"
profile = sys.argv[2] if len(sys.argv) > 2 else "profiles/h200-cross-workload.json"
meta = json.load(open(f"{run}/config.json"))
config = config_from_run(meta)
req = pd.read_parquet(f"{run}/requests.parquet").sort_values("request_id")
trace = pd.DataFrame({"request_id": req.request_id.values, "arrival_s": req.arrival_at_us.values / 1e6,
                      "prompt_tokens": req.prompt_tokens.values, "output_tokens": req.output_tokens.values})
vmm, compute = load_models(config, profile)

class Scaled:
    """``inner``'s iteration and decode-run times times ``k``."""

    def __init__(self, inner, k): self.inner, self.k = inner, k; self.attention_key_us = inner.attention_key_us
    def iteration_us(self, shape): return self.k * self.inner.iteration_us(shape)
    def decode_run_us(self, *a, **kw): return self.k * self.inner.decode_run_us(*a, **kw)

hw = req
print("hw TTFT p50 %.0f ms, busy %.1f s" % (hw.ttft_us.median() / 1e3, pd.read_parquet(f"{run}/iterations.parquet").duration_us.sum() / 1e6))
for k in (0.97, 0.99, 1.0, 1.01, 1.03):
    out = Simulator(config, trace, vmm=vmm, compute=Scaled(compute, k)).run()
    res = build_result(out, config.to_dict())
    r = res.requests
    print(f"compute x{k}: TTFT p50 {r.ttft_us.median()/1e3:.0f} ms p99 {r.ttft_us.quantile(.99)/1e3:.0f} ms, TPOT p50 {r.tpot_us.median()/1e3:.2f} ms, busy {res.iterations.duration_us.sum()/1e6:.1f} s")
