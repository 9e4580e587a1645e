"""The step-at-a-time form of a decode run (:meth:`RooflineComputeModel.decode_run_iter`, what the serving loop
uses to stop a fast-forwarded run at the next arrival) gives :meth:`decode_run_us`'s floats bit for bit."""
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sim.setup.config import SimConfig
from sim.timing.model_for import compute_model_for
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
    # the eager floor without a wave term (the memory-bound loop's floor branch, sim.timing.decode_run_times)
    models.append(("floor", models[0][1].with_overrides({"launch_floor_us": 9000.0})))
    # attention compute-bound (the plain-float form then evaluates both sides of the roofline's max), and at
    # the crossing: memory and compute times per token within rounding of each other
    models.append(("compute-bound", replace(models[0][1], attention_flops_efficiency=1e-4)))
    base = models[0][1]
    compute_per_pair = 4 * base.model.num_q_heads * base.model.head_dim * base.model.num_layers / base._flops_per_us
    memory_per_key = base._kv_bytes_per_token / base._bytes_per_us
    models.append(("crossing", replace(base, attention_flops_efficiency=compute_per_pair / memory_per_key)))
    return models


def test_the_plain_float_form_covers_both_sides_of_the_max():
    """The models above include memory-bound attention (its compute time skipped) and compute-bound or
    crossing attention (both evaluated), so the bit-for-bit tests cover both loops."""
    bound = {label: model._decode_run_terms[-1] for label, model in _models() if hasattr(model, "_decode_run_terms")}
    assert bound["{}"] and not bound["compute-bound"] and not bound["crossing"]
    floor = dict(_models())["floor"]
    assert floor.decode_run_us(1, 100, 101.0, 1, 101)[0] == floor._eager_floor_us    # the floor binds there


@pytest.mark.parametrize("label, model", _models())
def test_decode_run_iter_equals_decode_run_us(label, model):
    for size, kv_read, longest, steps in RUNS:
        array = model.decode_run_us(size, kv_read, float(kv_read + size), steps, longest)
        steps_one_by_one = list(model.decode_run_iter(size, kv_read, float(kv_read + size), steps, longest))
        assert np.array_equal(array, np.array(steps_one_by_one)), (label, size, kv_read, steps)


@pytest.mark.parametrize("label, model", _models())
def test_decode_run_until_is_the_array_run_cut_at_the_stop(label, model):
    """The serving loop's plain-float run (:meth:`decode_run_until`) gives the steps that the array form cut at
    the stop gives (``Simulator._run_steps``'s long path: cumulative ends, steps starting before the stop),
    bit for bit; with ``long_steps`` it declines exactly the runs whose first step puts the stop farther."""
    for size, kv_read, longest, steps in RUNS:
        durations_us = model.decode_run_us(size, kv_read, float(kv_read + size), steps, longest)
        start_us, block_table_us = 1234.5, 0.75
        ends_us = np.cumsum(np.concatenate(([start_us], durations_us + block_table_us)))
        for stop_us in (start_us, ends_us[1], ends_us[min(3, steps)] - 1e-3, ends_us[-2] + 1.0, float("inf")):
            k = int(np.searchsorted(ends_us[:-1], stop_us, side="left"))
            run = model.decode_run_until(size, kv_read, float(kv_read + size), steps, longest, start_us,
                                         block_table_us, stop_us)
            assert np.array_equal(np.array(run[0]), ends_us[:k + 1]), (label, size, stop_us)
            assert np.array_equal(np.array(run[1]), durations_us[:k])
            assert np.array_equal(np.array(run[2]), np.diff(ends_us[:k + 1]))
            long_steps = 4
            declined = steps > long_steps and stop_us - start_us > long_steps * (durations_us[0] + block_table_us)
            bounded = model.decode_run_until(size, kv_read, float(kv_read + size), steps, longest, start_us,
                                             block_table_us, stop_us, long_steps)
            assert (bounded is None) == declined and (declined or bounded == run)
