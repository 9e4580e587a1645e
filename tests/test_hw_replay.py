"""Hardware replay: the serving loop on CPU (emulated driver, tiny decoder) against the simulator, the
compute-model fit, and (marked ``gpu``) attention over VMM-backed K/V against an ordinary allocation."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from hwbackend.calibration.compute import GridPoint, compute_section, default_grid  # noqa: E402
from hwbackend.replay.model import BatchInputs, SeqWork, attend, reference_attention  # noqa: E402
from hwbackend.replay.cli import TINY_SHAPE, replay  # noqa: E402
from sim.timing.compute import RooflineComputeModel  # noqa: E402
from sim.setup.config import SimConfig  # noqa: E402
from sim.results.records import ITERATION_COLUMNS, REQUEST_COLUMNS  # noqa: E402

ORDER_COLUMNS = ["prefill_tokens", "decode_tokens", "batch_size", "num_running", "num_waiting", "used_page_groups"]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small_trace(n: int = 8, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"request_id": range(n), "arrival_s": np.zeros(n), "prompt_tokens": rng.integers(10, 1500, n),
                         "output_tokens": rng.integers(2, 16, n)})


@pytest.mark.parametrize("sync", [True, False])
def test_replay_schedules_exactly_like_the_simulator(sync):
    pytest.importorskip("simpy")
    from sim.core.runner import run_simulation

    config = SimConfig(max_batch_slots=4, max_context_tokens=4096, token_budget=512, sync_mapping=sync,
                       memory_util_frac=0.2)
    trace = small_trace()
    output, meta = replay(config, trace, "cpu", TINY_SHAPE, sleep=lambda s: None)
    hw, sim = output.iterations_frame(), run_simulation(config, trace)
    assert list(hw.columns) == list(ITERATION_COLUMNS)
    assert list(output.requests_frame().columns) == list(REQUEST_COLUMNS)
    assert meta["attention_backend"] == "reference"
    if sync:  # all arrive at 0 and no mapper thread: every batch and policy decision is the simulator's
        pd.testing.assert_frame_equal(hw[ORDER_COLUMNS], sim.iterations[ORDER_COLUMNS], check_dtype=False)
        for column in ("sync_map_page_groups", "mapped_page_groups", "free_page_groups"):
            assert hw[column].tolist() == sim.iterations[column].tolist()
    else:  # the mapper thread's timing may delay an admission (a slot with maps in flight is not allocatable)
        for column in ("prefill_tokens", "decode_tokens"):
            assert hw[column].sum() == sim.iterations[column].sum()
    assert (output.requests_frame()["status"] == "finished").all()
    assert (hw["duration_us"] >= hw["sync_stall_us"]).all()
    assert np.allclose(hw["compute_us"] + hw["sync_stall_us"], hw["duration_us"])
    assert hw["start_at_us"].is_monotonic_increasing


def test_replay_token_accounting_and_timestamps():
    config = SimConfig(max_batch_slots=4, max_context_tokens=4096, token_budget=256, sync_mapping=True)
    trace = small_trace(6, seed=3).assign(arrival_s=np.linspace(0, 0.05, 6))
    output, _ = replay(config, trace, "cpu", TINY_SHAPE)
    requests, iterations = output.requests_frame(), output.iterations_frame()
    assert iterations["prefill_tokens"].sum() == trace["prompt_tokens"].sum()
    assert iterations["decode_tokens"].sum() == (trace["output_tokens"] - 1).sum()
    assert (requests["first_token_at_us"] >= requests["arrival_at_us"]).all()
    assert np.allclose(requests["ttft_us"], requests["first_token_at_us"] - requests["arrival_at_us"])
    assert output.counters["sync_map_page_groups"] == iterations["sync_map_page_groups"].sum()
    # shapes.parquet (the in-loop fit's input): what each iteration computed, consistent with its record
    shapes = output.shapes_frame()
    assert shapes["iteration"].tolist() == iterations["iteration"].tolist()
    assert (shapes["new_tokens"] == iterations["prefill_tokens"] + iterations["decode_tokens"]).all()
    assert shapes["logit_sequences"].sum() == trace["output_tokens"].sum()  # every output token is sampled once
    batch = iterations["batch_size"]
    assert (shapes["max_context_tokens"] * batch >= shapes["kv_read_tokens"] + shapes["new_tokens"]).all()
    assert (shapes["max_context_tokens"] <= (trace["prompt_tokens"] + trace["output_tokens"] - 1).max()).all()
    # pairs: a t-token chunk after c cached tokens is t * (c + (t + 1) / 2) >= t * (t + 1) / 2 per sequence
    assert (shapes["attention_pairs"] >= shapes["kv_read_tokens"] + shapes["new_tokens"]).all()


def test_causal_chunks_see_their_prior_context_on_cpu():
    """The reference path: a chunk's query j attends keys 0..c+j (checked by a direct softmax)."""
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(2 * 64, 2, 8, generator=gen), torch.randn(2 * 64, 2, 8, generator=gen)
    inputs = BatchInputs([SeqWork(1, 10, 3, True), SeqWork(0, 5, 1, True)], 64, "cpu")
    q = torch.randn(inputs.num_tokens, 4, 8, generator=gen)
    out = reference_attention(q, k, v, inputs)
    # slot 0 comes first (sorted by slot): its one query at position 5 sees keys 0..5
    scores = torch.einsum("hd,thd->ht", q[0], k[0:6].repeat_interleave(2, dim=1)) / np.sqrt(8)
    expected = torch.einsum("ht,thd->hd", scores.softmax(-1), v[0:6].repeat_interleave(2, dim=1))
    assert torch.allclose(out[0], expected, atol=1e-5)


def test_roofline_fit_recovers_known_parameters():
    config = SimConfig()
    base = RooflineComputeModel(config.model_spec, config.gpu_spec)
    truth = base.with_overrides({"flops_efficiency": 0.6, "bw_efficiency": 0.8, "attention_flops_efficiency": 0.3,
                                 "overhead_us": 1800.0})
    grid = default_grid()
    measured = [truth.iteration_us(p.shape()) for p in grid]
    section = compute_section(base, grid, measured, {})
    assert section["roofline"]["overhead_us"] == pytest.approx(1800, rel=0.02)
    assert section["roofline"]["bw_efficiency"] == pytest.approx(0.8, rel=0.02)
    assert section["fit_error"]["max"] < 0.01
    # the tiled model contains the plain roofline (tile_rows = 0, a floor below every point): it fits too
    assert section["tiled_roofline"]["fit_error"]["max"] < 0.02
    assert section["grid"][0]["measured_us"] == pytest.approx(measured[0], abs=0.1)
    assert GridPoint(2, 100, ((5, 7),)).shape().attention_pairs == 2 * 101 + 5 * (7 + 3)


# ---- GPU: attention over VMM-backed K/V equals the same computation on an ordinary allocation -------------
@pytest.mark.gpu
def test_attention_over_vmm_equals_reference_across_pages_and_after_reuse():
    pytest.importorskip("cuda.bindings.driver")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from hwbackend.vmm.driver import CudaVmmDriver
    from hwbackend.vmm.executor import Executor, policy_config_for
    from hwbackend.vmm.kvcache import KVCache, KVCacheLayout
    from hwbackend.vmm.tensors import kv_tensors
    from sim.memory.vattention import VAttentionPolicy

    layout = KVCacheLayout(num_sub_tensors=2, num_slots=3, max_pages_per_slot=3, page_size_bytes=2 << 20,
                           num_kv_heads=8, head_dim=128, dtype_bytes=2)
    gen = torch.Generator(device="cuda").manual_seed(0)
    with CudaVmmDriver(0) as driver:
        cache = KVCache(driver, layout, 9)
        with Executor(VAttentionPolicy(policy_config_for(cache)), cache, background=False,
                      stream_handle=torch.cuda.current_stream().cuda_stream) as ex:
            k_vmm, v_vmm = (t.view(-1, 8, 128) for t in kv_tensors(cache, torch.bfloat16))
            k_ref, v_ref = torch.zeros_like(k_vmm, device="cuda"), torch.zeros_like(v_vmm, device="cuda")

            def fill_and_compare(lengths_new: list[tuple[int, int]], iteration: int) -> list[int]:
                slots = [ex.alloc_slot(c + t) for c, t in lengths_new]
                assert None not in slots and ex.step({s: c + t for s, (c, t) in zip(slots, lengths_new)})
                work = [SeqWork(s, c, t, True) for s, (c, t) in zip(slots, lengths_new)]
                inputs = BatchInputs(work, layout.max_tokens_per_slot, "cuda")
                for s, (c, t) in zip(slots, lengths_new):
                    rows = slice(s * layout.max_tokens_per_slot, s * layout.max_tokens_per_slot + c + t)
                    for vmm, ref in ((k_vmm, k_ref), (v_vmm, v_ref)):
                        data = torch.randn(c + t, 8, 128, generator=gen, device="cuda").to(torch.bfloat16)
                        vmm[rows], ref[rows] = data, data
                q = torch.randn(inputs.num_tokens, 32, 128, generator=gen, device="cuda").to(torch.bfloat16)
                expected = reference_attention(q, k_ref, v_ref, inputs).float()
                for backend in ("varlen", "gather"):
                    got = attend(backend, q, k_vmm, v_vmm, inputs).float()
                    assert torch.allclose(got, expected, atol=2e-2, rtol=2e-2), backend
                ex.iteration_launched(iteration)
                torch.cuda.synchronize()
                ex.poll_completed()
                return slots

            # decodes and a chunk crossing the 1024-token page boundary, one sequence over two boundaries
            slots = fill_and_compare([(1030, 1), (1000, 40), (2100, 1)], 0)
            for slot in slots[:2]:
                ex.free_slot(slot, 0)
            # reuse: new requests take the freed slots (deferred pages) with different lengths and data
            fill_and_compare([(3000, 1), (500, 600)], 1)


# ---- GPU: a decode iteration replayed as a CUDA graph computes what the eager forward computes ------------
@pytest.mark.gpu
def test_decode_cuda_graph_equals_eager_forward_over_vmm():
    pytest.importorskip("cuda.bindings.driver")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from hwbackend.replay.model import DecoderModel, capture_decode_graphs
    from hwbackend.replay.kv import open_kv

    config = SimConfig(sync_mapping=True, max_batch_slots=16)
    model = DecoderModel(TINY_SHAPE, device="cuda:0", seed=3)
    kv = open_kv(config, TINY_SHAPE, "cuda:0")
    try:
        assert capture_decode_graphs(model, kv, 8) > 0 and model.graphs.sizes == frozenset(range(1, 9))
        gen = torch.Generator(device="cuda").manual_seed(1)
        contexts = [1030, 5, 2047, 700, 1]  # 1023/1024-token page boundaries crossed and not
        slots = [kv.executor.alloc_slot(c + 1) for c in contexts]
        assert None not in slots and kv.executor.step({s: c + 1 for s, c in zip(slots, contexts)})
        for s, c in zip(slots, contexts):
            rows = slice(s * kv.slot_tokens, s * kv.slot_tokens + c)
            for layer in range(TINY_SHAPE.num_layers):
                for cache in (kv.k, kv.v):
                    cache[layer][rows] = torch.randn(c, 8, 128, generator=gen, device="cuda").to(torch.bfloat16)
        inputs = BatchInputs([SeqWork(s, c, 1, True) for s, c in zip(slots, contexts)], kv.slot_tokens, "cuda")
        new_rows = inputs.write_rows
        eager = model.eager_forward(inputs, kv.k, kv.v).clone()
        written = [cache[layer][new_rows].float().clone() for cache in (kv.k, kv.v)
                   for layer in range(TINY_SHAPE.num_layers)]
        for cache in (kv.k, kv.v):
            for layer in range(TINY_SHAPE.num_layers):  # poison: the graph must write every new row again
                cache[layer][new_rows] = torch.full_like(cache[layer][new_rows], float("nan"))
        graphed = model.forward(inputs, kv.k, kv.v)
        torch.cuda.synchronize()
        again = [cache[layer][new_rows].float() for cache in (kv.k, kv.v) for layer in range(TINY_SHAPE.num_layers)]
        # layer 0's K/V depend on the embedding only; the last layer's on every attention before it. The
        # graph's attention runs with max_k = L_max (its kernel may split the keys differently): bf16 tolerance
        for before, after in zip(written, again):
            assert torch.isfinite(after).all() and torch.allclose(after, before, atol=2e-2, rtol=2e-2)
        # argmax over random-weight logits may flip on a near tie after a rounding difference, rarely
        assert graphed.shape == eager.shape and (graphed == eager).float().mean().item() >= 0.8
        kv.executor.iteration_launched(0)
        torch.cuda.synchronize()
        kv.executor.poll_completed()
    finally:
        model.graphs = None
        kv.close()
