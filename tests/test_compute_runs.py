"""The step-at-a-time form of a decode run (:meth:`RooflineComputeModel.decode_run_iter`, what the serving loop
uses to stop a fast-forwarded run at the next arrival) gives :meth:`decode_run_us`'s floats bit for bit."""
from pathlib import Path

import numpy as np
import pytest

from sim.setup.config import SimConfig
from sim.timing.pipeline import compute_model_for
from sim.core.runner import load_models

ROOT = Path(__file__).resolve().parents[1]
PROFILE = str(ROOT / "profiles" / "h200.json")
RUNS = [(1, 100, 101, 5), (7, 7 * 900, 1200, 40), (64, 64 * 3000, 5000, 300), (200, 200 * 8000, 8100, 17)]


def _models():
    """(label, compute model): the roofline per model shape (dense, MoE, MLA, tp, pp), and the profile's fits."""
    models = []
    for fields in ({}, {"model": "llama-2-7b", "gpu": "a100"}, {"tp": 2}, {"pp": 2},
                   {"model": str(ROOT / "models" / "mixtral-8x7b.json"), "tp": 2},
                   {"model": str(ROOT / "models" / "deepseek-v3.json"), "tp": 8}):
        models.append((str(fields), compute_model_for(SimConfig(**fields))))
    for compute_model in ("in-loop", "tiled", "roofline"):
        models.append((compute_model, load_models(SimConfig(), PROFILE, compute_model)[1]))
    models.append(("blocks", load_models(SimConfig(), PROFILE, "in-loop")[1].with_overrides(
        {"attention_key_us": 0.02, "attention_block_us": 3.0, "split_kv_sms": 132})))
    models.append(("wave", models[0][1].with_overrides({"wave_us_per_token": 0.4, "launch_floor_us": 9000.0})))
    return models


@pytest.mark.parametrize("label, model", _models())
def test_decode_run_iter_equals_decode_run_us(label, model):
    for size, kv_read, longest, steps in RUNS:
        array = model.decode_run_us(size, kv_read, float(kv_read + size), steps, longest)
        steps_one_by_one = list(model.decode_run_iter(size, kv_read, float(kv_read + size), steps, longest))
        assert np.array_equal(array, np.array(steps_one_by_one)), (label, size, kv_read, steps)
