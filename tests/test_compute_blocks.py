"""The block forms of the compute model (issue 19, docs/validation/cross-workload/PLAN.md): FlashAttention-2's
split heuristic, the thread-block attention terms, and the fit's per-source weights."""
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from sim.setup.config import SimConfig
from sim.timing.compute import BatchShape, RooflineComputeModel, attention_block_terms, decode_batch, fa2_num_splits


def test_split_heuristic_by_hand():
    # enough blocks to fill 80% of the 264 slots: no split
    assert fa2_num_splits(256, 264, 512) == 1 and fa2_num_splits(212, 264, 512) == 1
    # 8 decodes x 8 KV heads = 64 blocks: 4 splits make 256 of 264 slots busy (efficiency 0.97, the first >= 85%)
    assert fa2_num_splits(64, 264, 512) == 4
    # 16 blocks: 14 splits = 224 / 264 = 0.848, within 85% of the best eligible efficiency (< 1: 33 splits
    # would give 16 key tiles each, as 32 do, so 33 is not eligible)
    assert fa2_num_splits(16, 264, 512) == 14
    # never more splits than key tiles
    assert fa2_num_splits(1, 264, 4) <= 4


def _model(**fields):
    config = SimConfig(model="llama-3-8b", gpu="h200")
    base = RooflineComputeModel(config.model_spec, config.gpu_spec, 1, decode_graphs=1.0,
                                decode_overhead_us=2000.0)
    return replace(base, **fields)


def test_graphed_decodes_plateau_past_the_split_chunk():
    """4 decodes, 64K slots: 7 splits of ceil(512 / 7) = 74 key tiles (9,472 keys); with many block slots the
    longest split bounds the time, so 16K and 32K contexts take the same time and 4K less."""
    model = _model(attention_key_us=0.02, attention_slots=1e9, split_kv_slot_tokens=65536)
    times = [model.iteration_us(decode_batch(4, c)) for c in (4096, 16384, 32768)]
    assert times[1] == pytest.approx(times[2])
    chunk_keys = math.ceil(512 / 7) * 128
    assert times[1] - times[0] == pytest.approx(32 * 0.02 * (chunk_keys - 4097))
    # no split without the slot length: the longest sequence bounds it
    plain = replace(model, split_kv_slot_tokens=0.0)
    assert plain.iteration_us(decode_batch(4, 32768)) - plain.iteration_us(decode_batch(4, 16384)) == pytest.approx(
        32 * 0.02 * 16384)


def test_form_d_tail_keys_set_the_longest_blocks_time():
    """Form D: the longest block's time per key is its own field (decode-only and mixed); 0 keeps form C."""
    plain = _model(attention_key_us=0.02, attention_prefill_key_us=0.03, attention_slots=1e9, split_kv_slot_tokens=8192)
    tail = replace(plain, attention_tail_key_us=0.05, attention_prefill_tail_key_us=0.07)
    # 32 decodes fill the GPU (no split) and the slots are unlimited: the longest block bounds attention
    decodes = decode_batch(32, 4000)
    assert tail.iteration_us(decodes) - plain.iteration_us(decodes) == pytest.approx(32 * (0.05 - 0.02) * 4001)
    blocks, keys = attention_block_terms(512, 3000)
    mixed = BatchShape(512, 512 * (3000 + 513 / 2), 3000, 1, 3512, blocks, keys)
    assert tail.iteration_us(mixed) - plain.iteration_us(mixed) == pytest.approx(32 * (0.07 - 0.03) * 3512)
    assert replace(tail, attention_tail_key_us=0.0, attention_prefill_tail_key_us=0.0) == plain


def test_form_e_serial_tail_adds_part_of_the_shorter_term():
    """Form E: attention = max(throughput, tail) + s * min(throughput, tail) per layer; s = 0 is form D."""
    d = _model(attention_key_us=0.02, attention_block_us=3.0, attention_slots=100.0, split_kv_slot_tokens=8192,
               attention_tail_key_us=0.05)
    e = replace(d, attention_tail_serial=0.5)
    shape = decode_batch(32, 1000)   # 32 x 8 blocks fill the GPU: no split
    throughput = 8 * (3.0 * 32 + 0.02 * (32 * 1000 + 32)) / 100.0
    tail = 3.0 + 0.05 * 1001
    assert e.iteration_us(shape) - d.iteration_us(shape) == pytest.approx(32 * 0.5 * min(throughput, tail))
    from sim.timing.compute import ComputeFieldError
    with pytest.raises(ComputeFieldError, match="attention_tail_serial must be a finite number 0 to 1, got 1.5"):
        d.with_overrides({"attention_tail_serial": 1.5})


def test_block_sum_term_by_hand():
    """32 decodes fill the GPU (no split): attention per layer = H' (tau0 b + kappa (kv + b)) / P."""
    tau0, kappa, slots = 3.0, 0.01, 100.0
    model = _model(attention_key_us=kappa, attention_block_us=tau0, attention_slots=slots, split_kv_slot_tokens=8192)
    no_attention = _model(attention_key_us=1e-12, attention_slots=1e12, split_kv_slot_tokens=8192)
    shape = decode_batch(32, 1000)
    expected = 32 * 8 * (tau0 * 32 + kappa * (32 * 1000 + 32)) / slots
    assert model.iteration_us(shape) - no_attention.iteration_us(shape) == pytest.approx(expected, rel=1e-6)


def test_mixed_batches_use_the_logged_blocks():
    model = _model(attention_key_us=0.01, attention_prefill_key_us=0.03, attention_block_us=1.0, attention_slots=50.0,
                   overhead_us=5000.0)
    blocks, keys = attention_block_terms(2048, 0)
    shape = BatchShape(2048 + 8, 2048 * (2049 / 2) + 8 * 501, 8 * 500, 9, 2048, blocks + 8, keys + 8 * 501)
    low = replace(model, attention_prefill_key_us=1e-9, attention_block_us=0.0)
    expected = 32 * max(32 * (1.0 * (blocks + 8) + 0.03 * (keys + 8 * 501)) / 50.0, 1.0 + 0.03 * 2048)
    lower = 32 * max(32 * (1e-9 * (keys + 8 * 501)) / 50.0, 1e-9 * 2048)
    assert model.iteration_us(shape) - low.iteration_us(shape) == pytest.approx(expected - lower, rel=1e-6)


def test_decode_run_matches_iteration_by_iteration():
    model = _model(attention_key_us=0.02, attention_block_us=2.0, attention_slots=200.0, split_kv_slot_tokens=8192,
                   decode_batch_knots=(1.0, 64.0), decode_batch_correction_us=(-100.0, 300.0))
    run = model.decode_run_us(6, 6 * 3000, 0.0, 5, max_context_tokens=3001)
    single = [model.iteration_us(replace(decode_batch(6, 3000 + k), attention_blocks=6,
                                         block_keys=6 * (3001 + k))) for k in range(5)]
    assert np.allclose(run, single)


def test_row_weights_give_each_source_the_same_total():
    from hwbackend.calibration.inloop import row_weights, weighted_median

    rows = pd.DataFrame({"source": ["grid"] * 10 + ["a"] * 90})
    weights = row_weights(rows)
    assert weights[:10].sum() == pytest.approx(weights[10:].sum()) and weights.mean() == pytest.approx(1.0)
    assert weighted_median(np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, 10.0])) == 3.0


def test_in_loop_fit_applies_to_every_model_it_was_fitted_on():
    from sim.core.runner import resolve_compute_model

    profile = {"compute_in_loop": {"model": "llama-3-8b", "models": ["llama-3-8b", "llama-3.1-8b"], "gpu": "h200",
                                   "tp": 1, "params": {"overhead_us": 1.0}}}
    assert resolve_compute_model(profile, "auto", SimConfig(model="llama-3.1-8b", gpu="h200")) == "in-loop"
    assert resolve_compute_model(profile, "auto", SimConfig(model="llama-2-7b", gpu="h200")) == "roofline"


def test_fit_rows_carry_the_block_terms():
    """The fit and ``kvsim validate`` evaluate the model on the logged block terms, as the simulator's engine
    passes them (the first cross-workload fit dropped them: its rows fell back to one block per 128 new tokens
    over ``kv_read + new`` keys, under-counting a long chunk's keys 16-fold)."""
    from hwbackend.calibration.inloop import shape_columns

    rows = pd.DataFrame({"new_tokens": [2048], "attention_pairs": [2048 * 1024.5], "kv_read_tokens": [63488],
                         "logit_sequences": [1], "max_context_tokens": [65536], "attention_blocks": [16],
                         "block_keys": [attention_block_terms(2048, 63488)[1]]})
    columns = shape_columns(rows)
    assert len(columns) == 7 and columns[5][0] == 16 and columns[6][0] == 1_033_216
    assert [c[0] for c in shape_columns(rows.drop(columns=["attention_blocks", "block_keys"]))][5:] == [0.0, 0.0]


def test_calibrate_grid_needs_a_run(capsys):
    from cli import main

    assert main(["calibrate", "--grid", "docs/validation/cross-workload/grid", "--out", "x.json"]) == 2
    assert "--grid-dir and --form fit with --from-run" in capsys.readouterr().err


def test_simulator_passes_the_block_terms_of_each_iteration():
    """With the cross-workload profile (form C) the engine counts thread blocks: a 300-token prompt's first
    iteration costs the model's time for 3 blocks over 128 + 256 + 300 keys (attention_block_terms), and a
    roofline run counts none (the default path stays as it was)."""
    from sim.core.runner import load_models, run_simulation

    trace = pd.DataFrame({"request_id": [0], "arrival_s": [0.0], "prompt_tokens": [300], "output_tokens": [3]})
    config = SimConfig(model="llama-3-8b", gpu="h200", sync_mapping=True)
    profile = "profiles/h200-cross-workload.json"
    result = run_simulation(config, trace, profile)
    _, compute = load_models(config, profile)
    assert compute.attention_key_us > 0 and compute.split_kv_slot_tokens == config.slot_max_tokens
    blocks, keys = attention_block_terms(300, 0)
    first = BatchShape(300, 300 * (0 + 301 / 2), 0, 1, 300, blocks, keys)
    assert result.iterations["compute_us"].iloc[0] == pytest.approx(compute.iteration_us(first))
    second = decode_batch(1, 300)
    assert result.iterations["compute_us"].iloc[1] == pytest.approx(
        compute.iteration_us(replace(second, attention_blocks=1, block_keys=301)))


def test_block_attention_carries_the_paged_factor():
    """The paged baseline's attention slowdown (``paged_attention_factor``) scales the block-form attention as it
    scales the roofline's, so vAttention vs PagedAttention comparisons keep it under a block-form profile."""
    model = _model(attention_key_us=0.02, attention_block_us=1.0, attention_slots=100.0, split_kv_slot_tokens=8192)
    free = _model(attention_key_us=1e-12, attention_slots=1e12, split_kv_slot_tokens=8192)
    shape = decode_batch(48, 2000)
    attention = model.iteration_us(shape) - free.iteration_us(shape)
    paged = replace(model, paged_attention_factor=1.5)
    assert paged.iteration_us(shape) - free.iteration_us(shape) == pytest.approx(1.5 * attention, rel=1e-6)


def test_one_iteration_and_the_array_form_agree():
    """The simulator's scalar path (one iteration) and the fit's array path give the same times."""
    rng = np.random.default_rng(3)
    model = _model(attention_key_us=0.02, attention_prefill_key_us=0.03, attention_block_us=0.5, attention_slots=90.0,
                   split_kv_slot_tokens=8192, overhead_us=5000.0, launch_floor_us=8000.0,
                   attention_tail_key_us=0.025, attention_prefill_tail_key_us=0.045, attention_tail_serial=0.4,
                   decode_batch_knots=(1.0, 64.0), decode_batch_correction_us=(-100.0, 300.0))
    shapes = []
    for _ in range(200):
        b = int(rng.integers(1, 200))
        contexts = rng.integers(0, 8000, b)
        chunk = int(rng.integers(2, 2048)) if rng.random() < 0.4 else 0
        seqs = [(1, int(c)) for c in contexts] + ([(chunk, int(rng.integers(0, 4000)))] if chunk else [])
        terms = [attention_block_terms(t, c) for t, c in seqs]
        shapes.append(BatchShape(sum(t for t, _ in seqs), sum(t * (c + (t + 1) / 2) for t, c in seqs),
                                 sum(c for _, c in seqs), b + (1 if chunk else 0), max(t + c for t, c in seqs),
                                 sum(n for n, _ in terms), sum(k for _, k in terms)))
    scalar = np.array([model.iteration_us(s) for s in shapes])
    columns = [np.array([getattr(s, f) for s in shapes], dtype=float) for f in
               ("new_tokens", "attention_pairs", "kv_read_tokens", "logit_sequences", "max_context_tokens",
                "attention_blocks", "block_keys")]
    assert np.allclose(scalar, model.iteration_us_array(*columns), rtol=1e-9)
