"""Held-out table of the engine profile (PLAN.md): per workload and metric, the error ``sim / hw - 1`` (mean of
the two same-start repeats' errors, each from ``validation/RUN/errors.csv`` of ``kvsim validate``), the repeat
spread ``|hw_a / hw_b - 1|`` of the hardware figure, and whether the target holds (|error| <= 5% at p50, <= 10%
at p99, or <= the spread where larger). ``python docs/validation/engine-profile/make_report.py [--round 2|3|4]`` writes
``heldout.csv`` (round 1: runs ``test-W-a|b``), ``heldout2.csv`` (round 2: ``test2-W-a|b``), ``heldout3.csv``
(round 3: ``test3-W-a|b``) or ``heldout4.csv`` (round 4: ``test4-W-a|b``, piecewise-graph replays) and prints a
markdown table."""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
WORKLOADS = ("conv-async", "code-sync", "sharegpt-async", "mooncake-sync", "arxiv-async")
METRICS = (("iteration latency", "p50"), ("iteration latency", "p99"), ("TTFT", "p50"), ("TTFT", "p99"),
           ("TPOT", "p50"), ("TPOT", "p99"), ("TBT", "p99"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--round", type=int, choices=(1, 2, 3, 4), default=1)
    parser.add_argument("--validation", default=str(HERE / "validation"),
                        help="folder of the validations (default: validation/ beside this file)")
    parser.add_argument("--csv", help="table written (default: heldout.csv, round N > 1 heldoutN.csv, beside this file)")
    args = parser.parse_args()
    prefix, csv_name = ("test", "heldout.csv") if args.round == 1 else (f"test{args.round}", f"heldout{args.round}.csv")
    csv_path = Path(args.csv) if args.csv else HERE / csv_name
    rows = []
    for w in WORKLOADS:
        tables = [pd.read_csv(Path(args.validation) / f"{prefix}-{w}-{r}" / "errors.csv") for r in "ab"]
        for metric, stat in METRICS:
            got = [t[(t.metric == metric) & (t.stat == stat)] for t in tables]
            if any(g.empty for g in got):
                continue
            hw = [float(g.hw.iloc[0]) for g in got]
            err = sum(float(g.error.iloc[0]) for g in got) / 2
            spread = abs(hw[0] / hw[1] - 1)
            limit = max(0.05 if stat == "p50" else 0.10, spread)
            rows.append({"workload": w, "metric": f"{metric} {stat}", "error": err, "error_a": float(got[0].error.iloc[0]),
                         "error_b": float(got[1].error.iloc[0]), "spread": spread, "met": abs(err) <= limit})
    frame = pd.DataFrame(rows)
    frame.to_csv(csv_path, index=False, float_format="%.4f")
    pivot = frame.assign(cell=[f"{'' if m else '**'}{e:+.1%}{'' if m else '**'} ({s:.1%})"
                               for e, s, m in zip(frame.error, frame.spread, frame.met)])
    table = pivot.pivot(index="workload", columns="metric", values="cell").reindex(WORKLOADS)
    table = table[[f"{m} {s}" for m, s in METRICS if f"{m} {s}" in table.columns]]
    print("| workload | " + " | ".join(table.columns) + " |")
    print("|---|" + "---|" * len(table.columns))
    for name, row in table.iterrows():
        print(f"| {name} | " + " | ".join(str(v) for v in row) + " |")
    met = frame.groupby("workload")["met"].agg(["sum", "size"])
    print(f"\nfigures met: {int(frame.met.sum())} of {len(frame)}; per workload: "
          + ", ".join(f"{w} {int(met.loc[w, 'sum'])}/{int(met.loc[w, 'size'])}" for w in WORKLOADS if w in met.index))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
