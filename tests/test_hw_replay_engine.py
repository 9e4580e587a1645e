"""The replay's engine compute (``hwbackend/replay/engine.py``): index tensors, split-KV decode attention and
the engine forward against the harness decoder on CPU; (marked ``gpu``) the Triton kernels against their torch
equivalents on CUDA."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from hwbackend.replay.cli import TINY_SHAPE, replay  # noqa: E402
from hwbackend.replay.engine import (EngineBatch, EngineDecoderModel, EnginePiecewiseGraphs,  # noqa: E402
                                     _split_kv_decode_torch, add_rms_norm, build_model, decode_splits, silu_mul,
                                     split_kv_decode, store_kv)
from hwbackend.replay.model import BatchInputs, DecoderModel, SeqWork, reference_attention  # noqa: E402
from sim.setup.config import SimConfig  # noqa: E402

SLOT_TOKENS = 2048
WORK = [SeqWork(3, 0, 64, False), SeqWork(0, 1500, 1, True), SeqWork(2, 700, 300, True), SeqWork(1, 90, 1, True)]


def random_cache(rows: int, heads: int = 8, dim: int = 128, seed: int = 3) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, heads, dim, generator=gen), torch.randn(rows, heads, dim, generator=gen)


def test_engine_batch_packs_decodes_first_then_chunks():
    batch = EngineBatch(WORK, SLOT_TOKENS, "cpu", kv_heads=8)
    assert [w.slot for w in batch.work] == [0, 1, 2, 3]  # decodes 0, 1 (slot order), then chunks 2, 3
    assert batch.num_decodes == 2 and batch.num_tokens == 1 + 1 + 300 + 64
    assert batch.dec_starts.tolist() == [0, SLOT_TOKENS] and batch.dec_lens.tolist() == [1501, 91]
    rows = batch.write_rows.tolist()
    assert rows[:2] == [1500, SLOT_TOKENS + 90]
    assert rows[2:302] == list(range(2 * SLOT_TOKENS + 700, 2 * SLOT_TOKENS + 1000))
    assert rows[302:] == list(range(3 * SLOT_TOKENS, 3 * SLOT_TOKENS + 64))
    assert batch.cu_seq_q.tolist() == [0, 300, 364]
    assert batch.cu_seq_k.tolist() == [2 * SLOT_TOKENS, 3 * SLOT_TOKENS, 4 * SLOT_TOKENS]
    assert batch.seqused_k.tolist() == [1000, 64] and (batch.max_q, batch.max_k) == (300, 1000)
    assert batch.logit_rows.tolist() == [0, 1, 301]  # the chunk of slot 3 does not finish its prompt
    assert batch.splits == decode_splits(2, 8)


def test_decode_splits_fill_the_gpu():
    # 4 programs per SM on 132 SMs: 528 programs; 8 KV heads per decode
    assert decode_splits(1, 8) == 64          # ceil(528 / 8) = 66, capped at 64
    assert decode_splits(16, 8) == 5          # ceil(528 / 128)
    assert decode_splits(64, 8) == 2 and decode_splits(66, 8) == 1 and decode_splits(256, 8) == 1


@pytest.mark.parametrize("splits", [1, 3, 64])
def test_split_kv_decode_matches_reference_attention(splits):
    k, v = random_cache(3 * SLOT_TOKENS)
    q = torch.randn(3, 32, 128, generator=torch.Generator().manual_seed(5))
    lens = [1, 700, 2000]
    work = [SeqWork(i, n - 1, 1, True) for i, n in enumerate(lens)]
    batch = EngineBatch(work, SLOT_TOKENS, "cpu")
    got = split_kv_decode(q, k, v, batch.dec_starts, batch.dec_lens, splits, triton_kernels=False)
    want = reference_attention(q, k, v, BatchInputs(work, SLOT_TOKENS, "cpu"))
    assert got.shape == (3, 32, 128)
    assert torch.allclose(got, want, atol=1e-5)


def test_split_kv_decode_rejects_a_split_count_out_of_range():
    k, v = random_cache(SLOT_TOKENS)
    with pytest.raises(ValueError, match="splits 65"):
        split_kv_decode(torch.zeros(1, 32, 128), k, v, torch.zeros(1, dtype=torch.long),
                        torch.ones(1, dtype=torch.int32), 65)


def test_engine_forward_computes_the_harness_logits():
    caches = []
    for _ in range(2):
        k, v = random_cache(4 * SLOT_TOKENS)
        caches.append(([k.clone() for _ in range(TINY_SHAPE.num_layers)], [v.clone() for _ in range(TINY_SHAPE.num_layers)]))
    harness = DecoderModel(TINY_SHAPE, "cpu", 0, "reference")
    engine = EngineDecoderModel(TINY_SHAPE, "cpu", 0, "reference")
    h_batch, e_batch = BatchInputs(WORK, SLOT_TOKENS, "cpu"), engine.batch_inputs(WORK, SLOT_TOKENS, "cpu")
    h_logits = harness.eager_forward(h_batch, *caches[0], return_logits=True)
    e_logits = engine.eager_forward(e_batch, *caches[1], return_logits=True)
    # both order emitting sequences by slot here (harness: slots 0, 1, 2; engine: decodes 0, 1, then chunk 2)
    assert [w.slot for w in h_batch.work if w.emits] == [w.slot for w in e_batch.work if w.emits] == [0, 1, 2]
    assert e_logits.shape == (3, TINY_SHAPE.vocab_size)
    assert torch.allclose(e_logits, h_logits, atol=1e-4)
    for layer in range(TINY_SHAPE.num_layers):  # the same K/V rows written (up to fp32 rounding: the packed
        assert torch.allclose(caches[0][0][layer], caches[1][0][layer], atol=1e-5)  # token order differs)
        assert torch.allclose(caches[0][1][layer], caches[1][1][layer], atol=1e-5)


def test_cpu_replay_runs_with_the_engine_compute():
    config = SimConfig(max_batch_slots=4, max_context_tokens=4096, token_budget=512, sync_mapping=True,
                       memory_util_frac=0.2)
    rng = np.random.default_rng(0)
    trace = pd.DataFrame({"request_id": range(6), "arrival_s": np.zeros(6), "prompt_tokens": rng.integers(10, 1500, 6),
                          "output_tokens": rng.integers(2, 8, 6)})
    runs = {c: replay(config, trace, "cpu", TINY_SHAPE, sleep=lambda s: None, compute=c) for c in ("harness", "engine")}
    engine_out, meta = runs["engine"]
    assert meta["compute"] == "engine"
    assert (engine_out.requests_frame()["status"] == "finished").all()
    columns = ["prefill_tokens", "decode_tokens", "batch_size"]
    pd.testing.assert_frame_equal(engine_out.iterations_frame()[columns], runs["harness"][0].iterations_frame()[columns])


def _tiny_caches(seed: int = 3) -> tuple[list, list]:
    k, v = random_cache(4 * SLOT_TOKENS, seed=seed)
    return [k.clone() for _ in range(TINY_SHAPE.num_layers)], [v.clone() for _ in range(TINY_SHAPE.num_layers)]


@pytest.mark.parametrize("sizes", [(366,), (16, 400, 512)])
def test_piecewise_pieces_compute_the_eager_forward_and_store_no_padding(sizes):
    """The pieces between attention calls (run as plain calls on CPU, the graphs' content) give the eager
    forward's logits, token for token, and write the same cache rows: the batch's 366 tokens padded to 366 (no
    padding) or to 400 (34 padding rows of -1, never stored)."""
    engine = EngineDecoderModel(TINY_SHAPE, "cpu", 0, "reference")
    eager_caches, piece_caches = _tiny_caches(), _tiny_caches()
    batch = engine.batch_inputs(WORK, SLOT_TOKENS, "cpu")
    assert batch.num_tokens == 366
    want = engine.eager_forward(batch, *eager_caches, return_logits=True).argmax(dim=-1)
    graphs = EnginePiecewiseGraphs(engine, *piece_caches, sizes=sizes, capture=False)
    assert graphs.bucket(366) == (366 if sizes == (366,) else 400)
    assert len(graphs.calls[graphs.bucket(366)]) == TINY_SHAPE.num_layers + 1
    engine.piecewise = graphs
    got = engine.forward(batch, *piece_caches)
    assert torch.equal(got, want)
    for layer in range(TINY_SHAPE.num_layers):      # every cache row equal: the padding wrote nothing
        assert torch.equal(piece_caches[0][layer], eager_caches[0][layer])
        assert torch.equal(piece_caches[1][layer], eager_caches[1][layer])


def test_piecewise_graphs_refuse_a_batch_above_their_largest_size_and_forward_runs_it_eagerly():
    engine = EngineDecoderModel(TINY_SHAPE, "cpu", 0, "reference")
    caches = _tiny_caches()
    graphs = EnginePiecewiseGraphs(engine, *caches, sizes=(16, 64), capture=False)
    with pytest.raises(ValueError, match="366 tokens: piecewise graphs hold at most 64"):
        graphs.bucket(366)
    engine.piecewise = graphs
    batch = engine.batch_inputs(WORK, SLOT_TOKENS, "cpu")
    want = engine.eager_forward(batch, *_tiny_caches(), return_logits=True).argmax(dim=-1)
    assert torch.equal(engine.forward(batch, *caches), want)     # 366 > 64: the eager path


def test_store_kv_skips_padding_rows_on_cpu():
    k, v = random_cache(8, heads=2, dim=4)
    before_k, before_v = k.clone(), v.clone()
    qkv = torch.arange(3 * 24, dtype=torch.float32).view(3, 24)   # q 8 columns, k 8, v 8
    store_kv(qkv, torch.tensor([5, -1, 2]), k, v, 8, 8)
    assert torch.equal(k[5].reshape(-1), qkv[0, 8:16]) and torch.equal(v[2].reshape(-1), qkv[2, 16:])
    untouched = [r for r in range(8) if r not in (2, 5)]
    assert torch.equal(k[untouched], before_k[untouched]) and torch.equal(v[untouched], before_v[untouched])


def test_build_model_names_the_modes():
    with pytest.raises(ValueError, match="--compute 'fast': choose one of harness, engine"):
        build_model("fast", TINY_SHAPE, "cpu", 0)


@pytest.mark.gpu
def test_triton_kernels_match_their_torch_equivalents_on_cuda():
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    gen = torch.Generator(device="cuda").manual_seed(0)
    k, v = (torch.randn(3 * SLOT_TOKENS, 8, 128, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(3, 32, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    starts = torch.tensor([0, SLOT_TOKENS, 2 * SLOT_TOKENS], device="cuda")
    lens = torch.tensor([1, 700, 2000], device="cuda", dtype=torch.int32)
    for splits in (1, 5, 64):
        got = split_kv_decode(q, k, v, starts, lens, splits).float()
        want = _split_kv_decode_torch(q.float(), k.float(), v.float(), starts.cpu(), lens.cpu(), splits, 128 ** -0.5)
        assert (got - want.float()).abs().max().item() < 2e-2
    x, delta = (torch.randn(5, 4096, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    weight = torch.rand(4096, generator=gen, device="cuda", dtype=torch.bfloat16)
    want = torch.nn.functional.rms_norm((x.float() + delta.float()), (4096,), weight.float(), 1e-5)
    x_engine = x.clone()
    got = add_rms_norm(x_engine, delta, weight).float()
    assert (got - want).abs().max().item() < 5e-2
    gate_up = torch.randn(7, 2 * 14336, generator=gen, device="cuda", dtype=torch.bfloat16)
    g, u = gate_up.float().chunk(2, dim=-1)
    assert (silu_mul(gate_up).float() - torch.nn.functional.silu(g) * u).abs().max().item() < 5e-2
    qkv = torch.randn(3, 4096 + 2048, generator=gen, device="cuda", dtype=torch.bfloat16)
    rows = torch.tensor([5, SLOT_TOKENS + 3, 2 * SLOT_TOKENS], device="cuda")
    store_kv(qkv, rows, k, v, 4096, 1024)
    assert torch.equal(k[rows].reshape(3, -1), qkv[:, 4096:5120]) and torch.equal(v[rows].reshape(3, -1), qkv[:, 5120:])
    before = k.clone()
    store_kv(qkv, torch.tensor([-1, -1, -1], device="cuda"), k, v, 4096, 1024)   # padding rows: nothing stored
    assert torch.equal(k, before)


@pytest.mark.gpu
def test_piecewise_graphs_replay_the_eager_forward_on_cuda():
    """Captured piecewise graphs (with 34 padding tokens) give the eager forward's tokens on a mixed batch."""
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    engine = EngineDecoderModel(TINY_SHAPE, "cuda:0", 0, "varlen")
    gen = torch.Generator(device="cuda").manual_seed(3)
    k, v = (torch.randn(4 * SLOT_TOKENS, 8, 128, generator=gen, device="cuda", dtype=engine.dtype) for _ in range(2))
    caches = [[t.clone() for _ in range(TINY_SHAPE.num_layers)] for t in (k, v)]
    batch = engine.batch_inputs(WORK, SLOT_TOKENS, "cuda:0")
    want = engine.eager_forward(batch, *[[t.clone() for t in c] for c in caches], return_logits=True).float()
    engine.piecewise = EnginePiecewiseGraphs(engine, *caches, sizes=(16, 400))
    got_tokens = engine.forward(batch, *caches)
    assert torch.equal(got_tokens, want.argmax(dim=-1))


def _base_pages_accessible(kv) -> bool:
    cache = kv.executor.cache
    return all(kv.driver.is_accessible(base, cache.layout.page_size_bytes) for base in cache.bases)


@pytest.mark.parametrize("pinned", [False, True])
def test_the_tensors_first_page_stays_mapped_when_pinned(pinned):
    """Triton checks every tensor argument's base pointer (``pin_base_pages``): without the anchor, slot 0's pages
    go when the policy reclaims slot 0 (the H200 failure of 2026-12-02); with it, the base stays mapped while
    requests come and go and idle slots are reclaimed."""
    from hwbackend.replay.kv import open_kv, pin_base_pages

    config = SimConfig(model="llama-3-8b", max_batch_slots=4, max_context_tokens=8192)
    kv = open_kv(config, TINY_SHAPE, "cpu")
    try:
        if pinned:
            assert pin_base_pages(kv) == 0
        executor = kv.executor
        slots = [executor.alloc_slot(3000) for _ in range(2)]
        assert executor.step({s: 3000 for s in slots})
        assert (0 in slots) is not pinned
        for s in slots:
            executor.iteration_launched(0)
            executor.free_slot(s, 0)
        executor.reclaim_idle()                  # every idle slot's deferred pages unmapped
        assert _base_pages_accessible(kv) is pinned
    finally:
        kv.close()


def test_pinning_refuses_a_cache_whose_slot_0_is_taken():
    from hwbackend.replay.kv import open_kv, pin_base_pages

    kv = open_kv(SimConfig(model="llama-3-8b", max_batch_slots=4, max_context_tokens=8192), TINY_SHAPE, "cpu")
    try:
        assert kv.executor.alloc_slot(1) == 0
        with pytest.raises(RuntimeError, match="slot 1, not 0"):
            pin_base_pages(kv)
    finally:
        kv.close()
