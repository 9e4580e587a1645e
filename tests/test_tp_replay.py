"""The tensor-parallel replay with torch on CPU (gloo, tiny decoder, emulated VMM): TP=2 computes what TP=1
computes on the same weights, and a short replay through ``python -m hwbackend.replay.tp.cli`` writes a run
directory that ``kvsim validate`` reads at tp 2."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from hwbackend.replay.cli import TINY_SHAPE  # noqa: E402
from hwbackend.replay.model import DecoderModel  # noqa: E402
from hwbackend.replay.tp.equivalence import BATCHES, logits_of, reference_logits, sharded_logits, small_shape  # noqa: E402
from hwbackend.replay.tp.shard import ShardedDecoderModel, shard_layer  # noqa: E402

if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch without the gloo backend", allow_module_level=True)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_shards_are_slices_of_the_one_gpu_weights_and_tp_1_is_the_one_gpu_model():
    full = DecoderModel(TINY_SHAPE, device="cpu", seed=3, attention="reference")
    shards = [[shard_layer(w, TINY_SHAPE, 2, r) for w in full.layers] for r in range(2)]
    d, q, kv, f = 128, 4 * 128, 4 * 128, TINY_SHAPE.ffn_size // 2
    for layer, w in enumerate(full.layers):
        a, b = shards[0][layer], shards[1][layer]
        assert torch.equal(torch.cat([a["o"], b["o"]], dim=1), w["o"])
        assert torch.equal(torch.cat([a["down"], b["down"]], dim=1), w["down"])
        assert torch.equal(torch.cat([a["qkv"][:q], b["qkv"][:q]]), w["qkv"][:2 * q])  # query heads 0-3 | 4-7
        assert torch.equal(torch.cat([a["qkv"][q:q + kv], b["qkv"][q:q + kv]]), w["qkv"][2 * q:2 * q + 2 * kv])
        assert torch.equal(torch.cat([a["gate_up"][:f], b["gate_up"][:f]]), w["gate_up"][:2 * f])
        assert d * TINY_SHAPE.num_q_heads == 2 * q
    one = ShardedDecoderModel(TINY_SHAPE, 1, 0, "cpu", seed=3, attention="reference")
    for x, y in zip(logits_of(one, TINY_SHAPE, slice(None)), logits_of(full, TINY_SHAPE, slice(None))):
        assert np.array_equal(x, y)


GQA_SHAPE = small_shape(TINY_SHAPE, num_q_heads=16, num_kv_heads=4, head_dim=64)  # 4 query heads per KV head


@pytest.mark.parametrize("shape", [TINY_SHAPE, GQA_SHAPE], ids=["tiny", "gqa"])
def test_tp_2_over_gloo_gives_the_logits_and_tokens_of_tp_1_on_the_same_weights(shape):
    ranks = sharded_logits(shape, 2, ("cpu", "cpu"), "gloo", seed=0)
    reference = reference_logits(shape, "cpu", seed=0)
    assert len(ranks[0]) == len(BATCHES)
    for rank0, rank1, ref, work in zip(ranks[0], ranks[1], reference, BATCHES):
        assert rank0.shape == ref.shape == (sum(w.emits for w in work), shape.vocab_size)
        assert np.array_equal(rank0, rank1)  # the all-reduce gives every rank the same sums
        assert np.allclose(rank0, ref, rtol=1e-4, atol=1e-5), np.abs(rank0 - ref).max()
        assert (rank0.argmax(axis=1) == ref.argmax(axis=1)).all()


def test_cpu_replay_at_tp_2_writes_a_run_that_validate_simulates_at_tp_2(tmp_path):
    pytest.importorskip("simpy")
    from hwbackend.calibration.run_files import load_hw_run
    from hwbackend.replay.tp.cli import main
    from sim.core.runner import run_simulation

    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     "0.0,40,5\n0.0,300,4\n0.0,90,6\n0.0,700,3\n0.0,20,8\n")
    out = tmp_path / "run"
    assert main(["--tp", "2", "--device", "cpu", "--trace", str(trace), "--max-batch", "4", "--max-context", "4096",
                 "--memory-util", "0.2", "--token-budget", "256", "--sync-mapping", "--out", str(out)]) == 0
    config_json = json.loads((out / "config.json").read_text())
    assert config_json["tp"] == 2 and config_json["dist_backend"] == "gloo" and config_json["devices"] == ["cpu", "cpu"]
    assert [r["rank"] for r in config_json["ranks"]] == [0, 1]
    assert config_json["ranks"][0]["pid"] != config_json["ranks"][1]["pid"]
    assert config_json["tp_page_tables"] == "identical" and config_json["peer_exit_codes"] == [0]
    assert config_json["transformer_shape"]["num_kv_heads"] == 4  # each rank's share of the tiny decoder's 8
    hw, config = load_hw_run(out)
    assert config.tp == 2 and (hw.requests["status"] == "finished").all()
    shapes = pd.read_parquet(out / "shapes.parquet")
    assert shapes["iteration"].tolist() == hw.iterations["iteration"].tolist()
    launches = pd.read_parquet(out / "tp_launches.parquet")  # every rank launched every iteration
    assert sorted(launches["rank"].unique()) == [0, 1] and len(launches) == 2 * len(hw.iterations)
    assert (launches["launched_us"] >= launches["start_us"]).all() and set(config_json["tp_launch"]["start_lag_us"]) == {"1"}
    # every arrival at 0 and synchronous mapping: the schedule is the simulator's at tp 2, batch by batch
    sim = run_simulation(config, pd.DataFrame({"request_id": range(5), "arrival_s": 0.0,
                                               "prompt_tokens": [40, 300, 90, 700, 20], "output_tokens": [5, 4, 6, 3, 8]}))
    columns = ["prefill_tokens", "decode_tokens", "batch_size", "sync_map_page_groups", "mapped_page_groups"]
    pd.testing.assert_frame_equal(hw.iterations[columns], sim.iterations[columns], check_dtype=False)


def test_all_reduce_measurement_runs_on_gloo_and_reports_per_layer_time():
    from hwbackend.replay.tp.allreduce import measure

    result = measure(["cpu", "cpu"], "gloo", tokens=(1, 8), hidden=64, num_layers=2, warmup=1, iters=3,
                     graph_replays=0)
    assert result["tp"] == 2 and [r["rank"] for r in result["ranks"]] == [0, 1]
    assert [row["tokens"] for row in result["rows"]] == [1, 8]
    assert result["rows"][1]["bytes"] == 8 * 64 * 4  # fp32 on CPU
    assert all(row["eager"]["p50_us"] > 0 and "graph" not in row for row in result["rows"])
    assert result["per_layer_us_p50"][8] == round(2 * result["rows"][1]["eager"]["p50_us"], 2)
