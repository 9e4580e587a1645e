"""The calibration grid of issue 19 (``hwbackend.calibration.grid``) and the attention block terms it logs."""
import pytest

from hwbackend.calibration.grid import GRID_COLUMNS, grid_points, shape_row
from sim.timing.compute import ATTENTION_TILE_ROWS, attention_block_terms


def test_block_terms_by_hand():
    assert ATTENTION_TILE_ROWS == 128
    assert attention_block_terms(1, 1000) == (1, 1001)            # a decode: one block over every key
    # 300 new tokens after 100 cached: blocks of rows 0-127, 128-255, 256-299 read 228, 356, 400 keys
    assert attention_block_terms(300, 100) == (3, 228 + 356 + 400)
    assert attention_block_terms(128, 0) == (1, 128)
    assert attention_block_terms(129, 0) == (2, 128 + 129)


def test_grid_points_fit_the_pool_and_the_slot():
    pool_tokens, per_group = 600_000, 1024
    points = grid_points(32768, pool_tokens, per_group, max_batch=256)
    assert {p["family"] for p in points} == {"decode", "decode-skew", "decode-spread", "prefill", "mixed"}
    for p in points:
        seqs = p["seqs"]
        assert 1 <= len(seqs) <= 256
        assert sum(-(-(c + t) // per_group) for t, c in seqs) * per_group <= pool_tokens
        assert max(c + t for t, c in seqs) <= 32768
    decodes = {(len(p["seqs"]), p["seqs"][0][1]) for p in points if p["family"] == "decode"}
    assert (256, 1024) in decodes and (1, 16384) in decodes and (1, 32768) not in decodes and (256, 4096) not in decodes   # 256 x 5 groups > pool


def test_shape_row_matches_the_simulator_shape():
    row = shape_row([(1, 1023), (1, 511), (300, 100)])
    assert row == {"new_tokens": 302, "attention_pairs": 1024 + 512 + 300 * (100 + 301 / 2), "kv_read_tokens": 1634,
                   "logit_sequences": 3, "max_context_tokens": 1024, "attention_blocks": 5,
                   "block_keys": 1024 + 512 + 984}


def test_measure_points_on_cpu_writes_one_row_per_point():
    pytest.importorskip("torch")
    from hwbackend.calibration.grid import measure_points
    from hwbackend.replay.cli import TINY_SHAPE
    from hwbackend.replay.kv import open_kv
    from hwbackend.replay.model import DecoderModel
    from sim.setup.config import SimConfig

    config = SimConfig(model="llama-3-8b", sync_mapping=True, max_batch_slots=8, max_context_tokens=4096)
    model = DecoderModel(TINY_SHAPE, device="cpu", attention="reference")
    kv = open_kv(config, TINY_SHAPE, "cpu")
    try:
        points = [{"family": "decode", "seqs": [(1, 100)] * 3}, {"family": "mixed", "seqs": [(1, 50), (64, 0)]}]
        rows = measure_points(model, kv, points, warmup=1, repeats=2)
    finally:
        kv.close()
    assert [r["family"] for r in rows] == ["decode", "mixed"]
    assert all(set(r) == set(GRID_COLUMNS) for r in rows)
    assert rows[0]["decodes"] == 3 and rows[0]["chunk_tokens"] == -1 and rows[1]["chunk_tokens"] == 64
    assert rows[1]["attention_blocks"] == 2 and rows[1]["block_keys"] == 51 + 64
    assert all(r["p10_us"] <= r["measured_us"] <= r["p90_us"] and r["measured_us"] > 0 for r in rows)
    assert not any(r["graphed"] for r in rows)


def test_long_points_cover_long_batches_within_the_slot_and_pool():
    pool_tokens, per_group = 891 * 1024 * 95 // 100, 1024
    points = grid_points(131072, pool_tokens, per_group, max_batch=256, point_set="long")
    for p in points:
        assert sum(-(-(c + t) // per_group) for t, c in p["seqs"]) * per_group <= pool_tokens
        assert max(c + t for t, c in p["seqs"]) <= 131072
    decodes = {(len(p["seqs"]), p["seqs"][0][1]) for p in points if p["family"] == "decode"}
    # 24 x 32K = 786K tokens fit the 866K-token pool, 32 x 32K do not; one decode at the slot length less one
    assert (24, 32768) in decodes and (32, 32768) not in decodes and (1, 131071) in decodes
    assert min(c for _, c in decodes) == 16384
    with pytest.raises(ValueError, match="point set 'huge'"):
        grid_points(131072, pool_tokens, per_group, point_set="huge")


@pytest.mark.parametrize("max_context, point_set", [(65536, "base"), (131072, "long")])
def test_every_h200_grid_point_maps_under_the_vattention_policy(max_context, point_set):
    """The grid's sequence of points on the policy the H200 run uses (Llama-3.1-8B, 64K or 128K slots, 891 page
    groups): each point maps, reclaiming idle slots' deferred pages when a point finds them held (the first
    H200 attempt stopped at point 54: the slots best fit picked kept pages the next point needed)."""
    from sim.setup.config import SimConfig
    from sim.memory import build_policy

    config = SimConfig(model="llama-3.1-8b", sync_mapping=True, max_context_tokens=max_context, allow_long_context=True)
    policy = build_policy(config)
    points = grid_points(max_context, int(config.pool_page_groups * config.tokens_per_page * 0.95),
                         config.tokens_per_page, point_set=point_set)
    iteration, reclaims = 0, 0

    def map_point(seqs):
        slots = []
        for t, c in seqs:
            slot = policy.alloc_slot(c + t)
            if slot is None:
                break
            slots.append(slot)
        if len(slots) == len(seqs) and policy.step({s: c + t for s, (t, c) in zip(slots, seqs)}) is not None:
            return slots
        for slot in slots:
            policy.free_slot(slot, iteration - 1)
        return None

    for point in points:
        slots = map_point(point["seqs"])
        if slots is None:
            unmapped = sum(op.num_pages for op in policy.reclaim_idle().unmaps)
            assert unmapped > 0
            reclaims += 1
            slots = map_point(point["seqs"])
        assert slots is not None, point["family"]
        assert all(policy.mapped[s] * config.tokens_per_page >= c + t for s, (t, c) in zip(slots, point["seqs"]))
        iteration += 9
        for slot in slots:
            policy.free_slot(slot, iteration - 1)
        policy.iteration_completed(iteration)
        iteration += 1
        assert policy.conservation_error() == 0
    assert 0 < reclaims < len(points)


def test_a_grid_without_its_slot_length_is_refused(tmp_path):
    """Forms C-E split a graphed decode's keys by the grid's slot length (grid.json max_context_tokens): a grid
    without it is refused, naming the file (it used to fit silently with slot 0)."""
    import json
    import shutil
    from pathlib import Path

    from hwbackend.calibration.inloop import InLoopError, load_grid_rows

    source = Path(__file__).resolve().parents[1] / "docs" / "validation" / "cross-workload" / "grid"
    shutil.copy(source / "grid.parquet", tmp_path / "grid.parquet")
    with pytest.raises(InLoopError, match=r"grid\.json: missing or without a positive max_context_tokens"):
        load_grid_rows(tmp_path)
    (tmp_path / "grid.json").write_text(json.dumps({"model": "llama-3.1-8b"}))
    with pytest.raises(InLoopError, match="max_context_tokens"):
        load_grid_rows(tmp_path)
    (tmp_path / "grid.json").write_text(json.dumps({"max_context_tokens": 65536}))
    assert (load_grid_rows(tmp_path)["slot_tokens"] == 65536).all()
