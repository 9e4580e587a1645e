"""Per-phase table of the piecewise CUDA graphs (run from the repo root:
``python docs/validation/engine-piecewise/make_table.py``): for each point of ``points.csv.gz`` timed both eagerly
(``engine``) and as piecewise graphs (``engine-piecewise``), the two times, the datasheet roofline's
(``RooflineComputeModel`` of llama-3-8b on h200, built-in defaults) and the default H200 profile's
(``profiles/h200-engine.json``, fitted on eager replays), in ms; writes ``table.csv`` and prints markdown."""
from pathlib import Path

import pandas as pd

from sim.core.runner import load_models
from sim.setup.config import SimConfig
from sim.timing.compute import BatchShape, RooflineComputeModel

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
FIELDS = ["new_tokens", "attention_pairs", "kv_read_tokens", "logit_sequences", "max_context_tokens",
          "attention_blocks", "block_keys"]
config = SimConfig(model="llama-3-8b", gpu="h200", max_context_tokens=33792, allow_long_context=True)
roofline = RooflineComputeModel(config.model_spec, config.gpu_spec, 1)
_, profile = load_models(config, str(ROOT / "profiles" / "h200-engine.json"))
points = pd.read_csv(HERE / "points.csv.gz")
shapes = [BatchShape(**{f: row[f].item() for f in FIELDS}) for _, row in points[FIELDS].iterrows()]
points["roofline_us"] = [roofline.iteration_us(s) for s in shapes]
points["profile_us"] = [profile.iteration_us(s) for s in shapes]   # no decode-only row here: eager terms
keys = ["family", "decodes", "chunk_tokens", "chunk_context", "max_context_tokens", "new_tokens"]
eager = points[points.compute == "engine"].set_index(keys)
piece = points[points.compute == "engine-piecewise"].set_index(keys)
table = pd.DataFrame({"eager_ms": eager.measured_us.loc[piece.index] / 1e3, "piecewise_ms": piece.measured_us / 1e3,
                      "roofline_ms": piece.roofline_us / 1e3, "profile_ms": piece.profile_us / 1e3}).reset_index()
table["speedup"] = table.eager_ms / table.piecewise_ms
table["eager/roof"] = table.eager_ms / table.roofline_ms
table["piecewise/roof"] = table.piecewise_ms / table.roofline_ms
table["profile/piecewise"] = table.profile_ms / table.piecewise_ms
table = table.sort_values(["family", "new_tokens", "decodes"]).reset_index(drop=True)
table.round(4).to_csv(HERE / "table.csv", index=False)
print("| phase | decodes | chunk (tokens @ context) | tokens | eager ms | piecewise ms | roofline ms | speed-up | eager / roofline | piecewise / roofline | profile ms | profile / piecewise |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for _, r in table.iterrows():
    print(f"| {r.family} | {r.decodes} | {r.chunk_tokens} @ {r.chunk_context} | {r.new_tokens} | {r.eager_ms:.2f} | "
          f"{r.piecewise_ms:.2f} | {r.roofline_ms:.2f} | {r.speedup:.2f}x | {r['eager/roof']:.2f} | {r['piecewise/roof']:.2f} | "
          f"{r.profile_ms:.2f} | {r['profile/piecewise']:.2f} |")
