"""Two-GPU checks of the tensor-parallel replay (marked ``gpu``; skipped without two NVIDIA GPUs with VMM
support, torch with CUDA and NCCL, or cuda-python): rank 1 in its own process on GPU 1, as the replay runs it.

* after a seeded random workload of admissions, growths, map-aheads and frees, both ranks hold the policy's
  page table (same (slot, page) pairs, same free page groups), checked after every action;
* the sharded decoder (NCCL all-reduces, bf16) gives the logits of the one-GPU decoder of the same weights;
* a short replay through ``python -m hwbackend.replay.tp.cli`` writes its run with decode CUDA graphs on both ranks.

Run: ``python -m pytest -m gpu tests/test_tp_replay_gpu.py`` (docs/tp2/device-replay.sh, call 1)."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.bindings.driver")

from hwbackend.replay.tp.equivalence import BATCHES, reference_logits, sharded_logits, small_shape  # noqa: E402
from hwbackend.replay.tp.remote import RemoteTPExecutor  # noqa: E402
from hwbackend.replay.tp.session import Peers, PeerSpec, make_cache  # noqa: E402
from hwbackend.vmm.executor import policy_config_for  # noqa: E402
from hwbackend.vmm.kvcache import KVCacheLayout  # noqa: E402
from hwbackend.vmm.tp_worker import TPWorker  # noqa: E402
from sim.setup.catalog import get_model  # noqa: E402
from sim.memory.vattention import VAttentionPolicy  # noqa: E402

MIB = 1 << 20
TOKENS_PER_PAGE = 2048  # 2 MiB / (4 KV heads * 128 * 2 B): Llama-3-8B at tp 2


@pytest.fixture(autouse=True)
def two_gpus():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, torch sees {torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        pytest.skip("torch without NCCL")


def test_both_ranks_hold_identical_page_tables_after_a_random_workload():
    layout = KVCacheLayout(num_sub_tensors=64, num_slots=8, max_pages_per_slot=4, page_size_bytes=2 * MIB,
                           num_kv_heads=4)
    spec = PeerSpec(tp=2, devices=("cuda:0", "cuda:1"), layout=layout, pool_page_groups=12, runner="recording")
    peers = Peers(spec, "process")
    local = make_cache(spec, 0)
    try:
        workers = [TPWorker(0, local)] + peers.remote_workers(layout, spec.pool_page_groups)
        policy = VAttentionPolicy(policy_config_for(local, deferred_reclaim=True))
        rng = random.Random(20)
        lengths: dict[int, int] = {}
        with RemoteTPExecutor(policy, workers, background=True) as ex:
            for iteration in range(120):
                kind = rng.choice(["admit", "grow", "grow", "ahead", "free"])
                active = sorted(lengths)
                if kind == "admit":
                    slot = ex.alloc_slot(rng.randint(1, 2 * TOKENS_PER_PAGE))
                    if slot is not None and ex.step({slot: 1}):
                        lengths[slot] = 1
                elif kind == "grow" and active:
                    slot = rng.choice(active)
                    target = min(lengths[slot] + rng.randint(1, 3 * TOKENS_PER_PAGE), 4 * TOKENS_PER_PAGE)
                    if ex.step({slot: target}):
                        lengths[slot] = target
                elif kind == "ahead" and active:
                    ex.map_ahead({s: min(n + TOKENS_PER_PAGE, 4 * TOKENS_PER_PAGE) for s, n in lengths.items()})
                elif kind == "free" and active:
                    slot = rng.choice(active)
                    ex.free_slot(slot, last_read_iteration=iteration - 1)
                    del lengths[slot]
                ex.iteration_launched(iteration)
                ex.check_consistent()  # both ranks map the policy's (slot, page) pairs, same free page groups
            mappings = ex.group.worker_mappings()
            assert mappings[0] == mappings[1] and mappings[0]
            report = ex.timing_report(None)
            assert report["num_plans"] > 0 and all(w["total_us"] > 0 for w in report["per_worker"])
    finally:
        codes = peers.stop()
        local.driver.close()
    assert codes == [0]


def test_tp_2_logits_match_tp_1_on_the_same_weights_within_bf16_tolerance():
    shape = small_shape(get_model("llama-3-8b"), num_layers=4)
    ranks = sharded_logits(shape, 2, ("cuda:0", "cuda:1"), "nccl", seed=0)
    reference = reference_logits(shape, "cuda:0", seed=0)
    torch.cuda.empty_cache()
    for rank0, rank1, ref, work in zip(ranks[0], ranks[1], reference, BATCHES):
        assert rank0.shape == ref.shape == (len(work), shape.vocab_size)
        scale = np.abs(ref).max()
        assert np.abs(rank0 - rank1).max() <= 1e-3 * scale  # every rank holds the same all-reduced sums
        assert np.abs(rank0 - ref).max() <= 0.05 * scale, (np.abs(rank0 - ref).max(), scale)
        assert np.abs(rank0 - ref).mean() <= 0.01 * np.abs(ref).mean()
        top2 = np.sort(ref, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 2 * np.abs(rank0 - ref).max()
        assert (rank0.argmax(axis=1) == ref.argmax(axis=1))[clear].all()  # same token wherever it is not a tie


def test_short_tp_2_replay_on_two_gpus_writes_its_run_with_decode_graphs_on_both(tmp_path):
    from hwbackend.calibration.run_files import load_hw_run
    from hwbackend.replay.tp.cli import main

    trace = tmp_path / "trace.csv"
    rows = [f"{0.01 * i:.2f},{200 + 97 * i},{4 + i % 7}" for i in range(24)]
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")
    out = tmp_path / "run"
    assert main(["--tp", "2", "--devices", "cuda:0,cuda:1", "--trace", str(trace), "--max-batch", "16",
                 "--memory-util", "0.3", "--warmup-s", "0", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["tp"] == 2 and config["dist_backend"] == "nccl" and config["cuda_graphs"] is True
    assert config["tp_page_tables"] == "identical" and config["peer_exit_codes"] == [0]
    assert len({r["gpu_uuid"] for r in config["ranks"]}) == 2 and config["ranks"][1]["nccl_nvls_enable"] == "0"
    hw, rebuilt = load_hw_run(out)
    assert rebuilt.tp == 2 and (hw.requests["status"] == "finished").all()
