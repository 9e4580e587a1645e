"""Rebuild table.csv from points.csv.gz with the roofline (run from the repo root:
``python docs/validation/engine-replay/make_table.py``)."""
from pathlib import Path

import pandas as pd

from sim.compute import BatchShape, RooflineComputeModel
from sim.config import SimConfig

HERE = Path(__file__).parent
FIELDS = ["new_tokens", "attention_pairs", "kv_read_tokens", "logit_sequences", "max_context_tokens",
          "attention_blocks", "block_keys"]
config = SimConfig(model="llama-3-8b", gpu="h200")
roofline = RooflineComputeModel(config.model_spec, config.gpu_spec, 1)
points = pd.read_csv(HERE / "points.csv.gz")
points["roofline_us"] = [roofline.iteration_us(BatchShape(**{f: row[f].item() for f in FIELDS}))
                         for _, row in points[FIELDS].iterrows()]
h, e = (points[points.compute == c].reset_index(drop=True) for c in ("harness", "engine"))
table = pd.DataFrame({"family": h.family, "decodes": h.decodes, "chunk": h.chunk_tokens, "chunk_ctx": h.chunk_context,
                      "max_ctx": h.max_context_tokens, "harness_ms": h.measured_us / 1e3,
                      "engine_ms": e.measured_us / 1e3, "roofline_ms": h.roofline_us / 1e3})
table["harness/roof"] = table.harness_ms / table.roofline_ms
table["engine/roof"] = table.engine_ms / table.roofline_ms
table["speedup"] = table.harness_ms / table.engine_ms
table.round(4).to_csv(HERE / "table.csv", index=False)
print(table.round(3).to_string())
