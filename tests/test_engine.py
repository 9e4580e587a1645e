"""The serving loop: a golden run derived by hand, determinism, coalescing equivalence, asynchronous vs
synchronous mapping, preemption under a small budget."""
import math

import numpy as np
import pandas as pd
import pytest

from sim.setup.config import SimConfig
from sim.core.engine import Simulator
from sim.timing.latency import VmmLatencyModel
from sim.units import KIB
from tests.helpers import ConstantCompute, constant_vmm, trace


def run(rows, coalesce=True, vmm=None, compute=None, **config):
    cfg = SimConfig(**config)
    out = Simulator(cfg, trace(rows), vmm=vmm or constant_vmm(), compute=compute or ConstantCompute(1000.0),
                    coalesce=coalesce).run()
    return out, out.requests_frame().set_index("request_id"), out.iterations_frame()


def test_golden_two_requests_sync_mapping():
    """Llama-3-8B, 64 KiB pages -> 64 KiB / 2 KiB = 32 tokens per page; a page group is 64 sub-tensor pages,
    each map + set-access = 10 + 40 us -> 3,200 us per page group. Every iteration computes 1,000 us.

    it 0 @ 0:     r0 (prompt 40) prefill 40 -> ceil(40/32) = 2 groups: stall 6,400; ends 7,400 (r0 token 1)
    it 1 @ 7,400: r1 (arrived 2,500) admitted to slot 1, prefill 10 -> 1 group: stall 3,200; r0 decodes;
                  ends 11,600 (r0 token 2, r1 token 1 -> TTFT 9,100)
    it 2 @ 11,600: both decode (42 and 11 tokens: no new page); ends 12,600: r0 token 3 (done), r1 token 2 (done)
    """
    out, req, it = run([(0.0, 40, 3), (0.0025, 10, 2)], page_size_bytes=64 * KIB, sync_mapping=True)
    assert list(it["start_at_us"]) == [0.0, 7400.0, 11600.0]
    assert list(it["sync_stall_us"]) == [6400.0, 3200.0, 0.0]
    assert list(it["sync_map_page_groups"]) == [2, 1, 0]
    assert list(it["prefill_tokens"]) == [40, 10, 0] and list(it["decode_tokens"]) == [0, 1, 2]
    assert req.loc[0, "ttft_us"] == 7400.0 and req.loc[1, "ttft_us"] == 9100.0
    assert req.loc[0, "e2e_us"] == 12600.0 and req.loc[1, "e2e_us"] == 10100.0
    assert req.loc[0, "tpot_us"] == (12600.0 - 7400.0) / 2 and req.loc[1, "tpot_us"] == 1000.0
    assert list(req["slot"]) == [0, 1]
    # deferred reclamation: both slots keep their 3 page groups after finishing
    assert out.counters["sync_map_page_groups"] == 3 and out.counters["sync_unmap_page_groups"] == 0
    # tail waste in it 0: 2 groups * 32 tokens - 40 tokens = 24 tokens * 128 KiB per token (all layers, K+V)
    assert it["tail_waste_bytes"][0] == 24 * 131072


def test_async_mapper_hides_page_crossings_that_sync_pays_for():
    """One long decode crossing 1,024-token pages (2 MiB): with sync mapping each crossing stalls about
    64 x (cuMemMap + cuMemSetAccess); the asynchronous mapper maps 9 steps ahead during 1 ms of compute,
    and a page group takes 3.2 ms, so it is ready ~3 iterations later, well before the crossing."""
    rows = [(0.0, 1000, 3000)]
    _, _, sync_it = run(rows, sync_mapping=True, eager_idle_slots=0)
    _, _, async_it = run(rows, eager_idle_slots=0)
    crossings = sync_it[sync_it["sync_map_page_groups"] > 0]
    # prefill (1 group) + crossings at 1,024, 2,048, 3,072 tokens -> 4 synchronous maps of 3,200 us each
    assert list(crossings["sync_stall_us"]) == [3200.0] * 4
    assert async_it["sync_stall_us"].iloc[1:].sum() == 0.0      # only the very first prefill map stalls
    assert async_it["bg_map_page_groups"].sum() == 3


@pytest.mark.parametrize("policy", ["vattention", "paged", "static"])
def test_coalesced_runs_equal_step_by_step(policy):
    rng = np.random.default_rng(7)
    rows = [(float(t), int(p), int(o)) for t, p, o in zip(np.cumsum(rng.exponential(0.05, 60)),
                                                          rng.integers(1, 3000, 60), rng.integers(1, 400, 60))]
    a = run(rows, coalesce=True, vmm=VmmLatencyModel.h200_defaults(), compute=_roofline(), policy=policy)
    b = run(rows, coalesce=False, vmm=VmmLatencyModel.h200_defaults(), compute=_roofline(), policy=policy)
    assert a[0].decode_runs > 0
    it = a[2]
    assert (it["tail_waste_bytes"] >= 0).all() and (it["used_page_groups"] <= it["mapped_page_groups"]).all()
    np.testing.assert_allclose(a[2].to_numpy(float), b[2].to_numpy(float), rtol=1e-12, atol=1e-6)
    cols = ["ttft_us", "tpot_us", "e2e_us"]
    np.testing.assert_allclose(a[1][cols].to_numpy(float), b[1][cols].to_numpy(float), rtol=1e-12, atol=1e-6)


@pytest.mark.parametrize("policy", ["vattention", "paged"])
def test_decode_runs_as_arrays_equal_plain_steps(policy, monkeypatch):
    """A decode run's steps past sim.core.decode_runs.PLAIN_RUN_STEPS are computed as arrays: the same records, bit for
    bit, as computing every step in plain floats (long outputs, sparse arrivals: runs of hundreds of steps)."""
    import sim.core.decode_runs

    rng = np.random.default_rng(3)
    rows = [(float(t), int(p), int(o)) for t, p, o in zip(np.cumsum(rng.exponential(2.0, 25)),
                                                          rng.integers(1, 3000, 25), rng.integers(1, 1500, 25))]
    outputs = []
    for plain_steps in (0, 5, 10**9):
        monkeypatch.setattr(sim.core.decode_runs, "PLAIN_RUN_STEPS", plain_steps)
        out, requests, iterations = run(rows, vmm=VmmLatencyModel.h200_defaults(), compute=_roofline(), policy=policy)
        outputs.append((requests, iterations, {k: v for k, v in out.counters.items() if k != "tbt_samples"}))
    assert (outputs[0][1]["batch_size"] > 0).all() and len(outputs[0][1]) > 5 * out.decode_runs
    for requests, iterations, counters in outputs[1:]:
        pd.testing.assert_frame_equal(requests, outputs[0][0], check_exact=True)
        pd.testing.assert_frame_equal(iterations, outputs[0][1], check_exact=True)
        assert counters == outputs[0][2]


def _roofline():
    from sim.setup.catalog import get_gpu, get_model
    from sim.timing.compute import RooflineComputeModel
    return RooflineComputeModel(get_model("llama-3-8b"), get_gpu("h200"))


def test_same_seed_same_records_other_seed_other_latencies():
    rows = [(i * 0.01, 500 + 37 * i, 60) for i in range(40)]
    kwargs = dict(vmm=VmmLatencyModel.h200_defaults(), compute=_roofline(), sync_mapping=True)
    first = run(rows, seed=3, **kwargs)
    second = run(rows, seed=3, vmm=VmmLatencyModel.h200_defaults(), compute=_roofline(), sync_mapping=True)
    assert first[2].equals(second[2]) and first[1].equals(second[1])
    third = run(rows, seed=4, vmm=VmmLatencyModel.h200_defaults(), compute=_roofline(), sync_mapping=True)
    assert not np.array_equal(first[2]["sync_stall_us"], third[2]["sync_stall_us"])


def _util_for_page_groups(groups: int, page_bytes: int = 2 * 1024 * 1024) -> float:
    cfg = SimConfig()
    needed = cfg.model_spec.weight_bytes() + groups * 64 * page_bytes + 1
    return needed / cfg.gpu_spec.hbm_bytes


def test_small_budget_preempts_and_finishes():
    """A pool of 4 page groups (4,096 tokens at 2 MiB pages) and four requests that each grow to 2,047
    tokens (1,024 prompt + 1,024 output - 1 -> 2 groups): admitted together (1 group each for the prompt),
    they cannot all grow into their second page, so the most recently admitted are preempted (recompute)
    and re-run later. Everything finishes; nothing hangs. (Synchronous mapping: with the asynchronous
    mapper the look-ahead maps take the free pages first and admission simply waits. A 4,096-token budget
    admits all four prompts in the first iteration; with 2,048 only two are admitted, and the running decodes
    get their second page before the other two can be admitted, so nothing is preempted.)"""
    rows = [(0.0, 1024, 1024)] * 4
    util = _util_for_page_groups(4)
    out, req, it = run(rows, memory_util_frac=util, admission_watermark_frac=0.0, sync_mapping=True,
                       token_budget=4096)
    assert SimConfig(memory_util_frac=util).pool_page_groups == 4
    assert (req["status"] == "finished").all()
    assert req["preemptions"].sum() >= 1
    assert it["mapped_page_groups"].max() <= 4


def test_request_larger_than_the_pool_is_rejected_not_livelocked():
    rows = [(0.0, 100, 10), (0.0, 6000, 100)]      # second needs 6 groups, pool has 4
    out, req, _ = run(rows, memory_util_frac=_util_for_page_groups(4), admission_watermark_frac=0.0)
    assert list(req["status"]) == ["finished", "rejected"]


def test_chunked_prefill_respects_token_budget():
    _, req, it = run([(0.0, 5000, 2)], token_budget=2048, sync_mapping=True)
    assert list(it["prefill_tokens"][:3]) == [2048, 2048, 904]
    # ceil(2048/1024) = 2 groups, then 4, then 5: chunk targets, not one more token
    assert list(it["sync_map_page_groups"][:3]) == [2, 2, 1]


def test_vllm_scheduler_runs_prefills_first():
    _, req, it = run([(0.0, 100, 5), (0.0005, 100, 5)], scheduler="vllm", sync_mapping=True)
    # it 0: r0 prefill; it 1: r1 prefill alone (prefill-first, no mixing); then decodes of both
    assert list(it["prefill_tokens"][:2]) == [100, 100] and list(it["decode_tokens"][:2]) == [0, 0]
    assert it["decode_tokens"].iloc[2] == 2


def test_one_token_last_prefill_chunk_sets_the_first_token_time():
    """Token budget 100 and a 101-token prompt: the prefill ends with a 1-token chunk, which looks like a
    decode but emits the first token (regression: the coalesced decode path skipped its timestamp)."""
    _, req, it = run([(0.0, 101, 50)], token_budget=100, sync_mapping=True)
    assert np.isfinite(req.loc[0, "first_token_at_us"])
    assert req.loc[0, "ttft_us"] == 2 * 1000.0 + 3200.0 * 1     # two iterations, one page-group map (2 MiB page)
    assert it["prefill_tokens"].sum() == 101 and it["decode_tokens"].sum() == 49


def test_a_pass_that_changes_nothing_is_an_internal_error_not_a_hang():
    """Liveness invariant: with admission made impossible and the unblocking step disabled, the loop would
    spin at t = 0; the second pass that changes nothing raises, naming the state."""
    cfg = SimConfig()
    sim = Simulator(cfg, trace([(0.0, 100, 10)]), vmm=constant_vmm(), compute=ConstantCompute(1000.0))
    sim.policy.alloc_slot = lambda *args: None

    def no_unblock():
        return
        yield

    sim._unblock_admission = no_unblock
    with pytest.raises(RuntimeError, match=r"no progress in the scheduling phase at t=0.0 us .* 1 waiting"):
        sim.run()


@pytest.mark.parametrize("streamed", [False, True])
def test_iteration_records_in_chunks_equal_one_table(tmp_path, streamed):
    """Records cut into chunks of 7 iterations (in memory, or row groups streamed to Parquet) give the very
    table a single chunk gives: chunk boundaries fall between iterations, each chunk sorted by iteration."""
    rng = np.random.default_rng(3)
    rows = [(float(t), int(p), int(o)) for t, p, o in zip(np.cumsum(rng.exponential(0.05, 40)),
                                                          rng.integers(1, 3000, 40), rng.integers(1, 300, 40))]
    whole = run(rows, vmm=VmmLatencyModel.h200_defaults(), compute=_roofline())[2]
    sim = Simulator(SimConfig(), trace(rows), vmm=VmmLatencyModel.h200_defaults(), compute=_roofline(),
                    records_path=str(tmp_path / "it.parquet") if streamed else None)
    sim.recorder.chunk_iterations = 7
    out = sim.run()
    chunked = out.iterations_frame()
    assert len(whole) > 7 * 5 and chunked.equals(whole)
    if streamed:
        import pyarrow.parquet as pq
        assert pq.ParquetFile(tmp_path / "it.parquet").num_row_groups > 5
