"""Issue 21: pipeline parallelism: vLLM's layer partition, stage memory (the pool per worker grows), and the
round time with its bubble (sim.timing.pipeline), on examples computed by hand."""
import numpy as np
import pytest

from sim.setup.catalog import CatalogError, get_model
from sim.timing.compute import RooflineComputeModel, decode_batch
from sim.setup.config import SimConfig
from sim.timing.model_for import compute_model_for
from sim.timing.pipeline import PipelineComputeModel
from sim.setup.specs import GPUSpec, ModelSpec
from sim.units import MIB

LLAMA_70B = "models/llama-3.1-70b.json"


def test_layer_partition_follows_vllm():
    # vllm/distributed/utils.py get_pp_indices: N // pp each, the remainder to stages -2, -3, ...
    deepseek = get_model("models/deepseek-v3.json")
    assert deepseek.pipeline_layers(4) == [15, 15, 16, 15]
    assert deepseek.pipeline_layers(8) == [7, 7, 8, 8, 8, 8, 8, 7]
    assert get_model(LLAMA_70B).pipeline_layers(3) == [27, 27, 26]
    stages = deepseek.pipeline_stages(4)
    assert [s.first_dense_layers for s in stages] == [3, 0, 0, 0]       # the 3 dense layers are in stage 0
    assert [(s.has_embedding, s.has_lm_head) for s in stages] == [(True, False), (False, False), (False, False),
                                                                  (False, True)]
    with pytest.raises(CatalogError, match="pp=62: "):
        deepseek.pipeline_layers(62)


def test_stage_weights_and_pool_per_worker():
    # Llama-3.1-70B on A100-SXM 80GB, tp=4: a layer's linear weights per worker (150,994,944 + 704,643,072) / 4
    # = 213,909,504 parameters, 2 B each; norms 16,384 per layer; embedding or head 128256 x 8192 / 4 = 262,668,288.
    pp1 = SimConfig(model=LLAMA_70B, gpu="a100", tp=4)
    pp2 = SimConfig(model=LLAMA_70B, gpu="a100", tp=4, pp=2)
    first, last = pp2.stage_specs
    assert (first.num_layers, last.num_layers) == (40, 40)
    # stage 0: 40 x 213,909,504 x 2 + (40 x 16,384 + 262,668,288) x 2 = 17,112,760,320 + 526,647,296
    assert first.weight_bytes(4) == 17_639_407_616
    # stage 1 adds the final norm (8,192) instead of the embedding: 17,112,760,320 + 526,663,680
    assert last.weight_bytes(4) == 17_639_424_000
    # whole model per worker: 34,225,520,640 + (80 x 16,384 + 8,192 + 2 x 262,668,288) x 2 = 35,278,831,616
    assert pp1.model_spec.weight_bytes(4) == 35_278_831_616
    budget = int(0.9 * 85_899_345_920)                                 # 77,309,411,328 B usable per GPU
    # pp=1: (77,309,411,328 - 35,278,831,616) / (160 sub-tensors x 2 MiB) = 125.3 -> 125 page groups
    assert pp1.pool_page_groups == (budget - 35_278_831_616) // (160 * 2 * MIB) == 125
    # pp=2: each stage maps 80 sub-tensors; the tighter stage: (budget - 17,639,424,000) / (80 x 2 MiB) = 355.7
    assert pp2.pool_page_groups == (budget - 17_639_424_000) // (80 * 2 * MIB) == 355
    assert pp2.model_spec.num_layers == 40 and pp2.kv_budget_bytes == budget - 17_639_407_616
    # a page group holds 2 MiB / (2 KV heads x 128 x 2 B) = 4,096 tokens either way: pp=2 holds 2.8x the tokens
    assert pp1.tokens_per_page == pp2.tokens_per_page == 4096
    assert pp2.to_dict()["model_derived"]["pipeline_stages"][1]["weight_bytes_per_worker"] == 17_639_424_000
    assert pp2.gpus_per_replica == 8


TOY = ModelSpec(name="toy", num_layers=4, hidden_size=1024, num_q_heads=8, num_kv_heads=8, head_dim=128,
                ffn_size=4096, vocab_size=1024, max_context_tokens=4096)
GPU = GPUSpec(name="toy-gpu", full_name="toy", hbm_bytes=10**11, bf16_flops=1e15, mem_bw_bytes_per_s=1e12,
              nvlink_bytes_per_s=1e11, pcie_bytes_per_s=1e10)
UNIT = dict(flops_efficiency=1.0, bw_efficiency=1.0, attention_flops_efficiency=1.0, overhead_us=0.0)


def _stage_times_us(batch: int) -> tuple[float, float]:
    """Hand-computed stage times (us) of a micro-batch of ``batch`` decodes at context 0 on the toy model:
    F = 1e9 FLOP/us, B = 1e6 B/us. A layer: 4 x 1024^2 (Q,K,V,O) + 3 x 1024 x 4096 = 2^24 parameters."""
    linear_params = 2 * 2**24                                           # 2 layers per stage
    weights0 = 2 * 2**24 * 2 + (2 * 2048 + 2**20) * 2                   # + embedding (2^20)
    streamed0 = weights0 - 2**20 * 2                                    # the embedding is gathered, not streamed
    streamed1 = 2 * 2**24 * 2 + (2 * 2048 + 1024 + 2**20) * 2           # + final norm and LM head
    kv_us = batch * 2 * 2 * 8 * 128 * 2 / 1e6                           # the new tokens' K and V of 2 layers
    linear0 = max(2 * batch * linear_params / 1e9, streamed0 / 1e6)
    linear1 = max(2 * batch * linear_params / 1e9, streamed1 / 1e6)
    logits_us = 2 * batch * 1024 * 1024 / 1e9                           # LM head, last stage only
    attention = max(4 * batch * 8 * 128 * 2 / 1e9, kv_us)               # 1 (query, key) pair per decode
    return linear0 + attention, linear1 + attention + logits_us


def test_pipeline_bubble_on_a_small_example():
    model = PipelineComputeModel(TOY, GPU, 1, pp=2, **UNIT)
    t0, t1 = _stage_times_us(1)
    assert (t0, t1) == pytest.approx((67.125248, 69.226545152))
    p2p_us = 2 * 1 * 1024 * 2 / 1e5                                    # hidden + residual of one token: 0.04096
    # one sequence: one micro-batch; the round is the chain t0 + p2p + t1 and each stage idles the rest: the bubble
    one = model.round_parts_us(np.array([1.0]), np.array([1.0]), np.array([0.0]), np.array([1.0]))
    assert one["micro_batches"][0] == 1
    assert one["chain_us"][0] == pytest.approx(t0 + t1 + p2p_us)
    assert model.iteration_us(decode_batch(1, 0)) == pytest.approx(136.392753152)
    # two sequences: two micro-batches of one; the last stage serves both back to back (2 x t1 > chain): steady
    # state, one micro-batch per max-stage time
    assert model.iteration_us(decode_batch(2, 0)) == pytest.approx(2 * t1) == pytest.approx(138.453090304)
    # bubble of the one-sequence round: stage 0 busy t0 out of the chain
    assert 1 - t0 / (t0 + t1 + p2p_us) == pytest.approx(0.50785, abs=1e-5)


def test_pipeline_of_one_stage_is_the_roofline():
    whole = RooflineComputeModel(TOY, GPU, 1, **UNIT)
    one_stage = PipelineComputeModel(TOY, GPU, 1, pp=1, **UNIT)
    for batch in (1, 7, 64):
        assert one_stage.iteration_us(decode_batch(batch, 500)) == pytest.approx(whole.iteration_us(decode_batch(batch, 500)))
    # and a decode run is the same rounds stepped one by one
    run = PipelineComputeModel(TOY, GPU, 1, pp=2, **UNIT).decode_run_us(3, 30, 3 * 11.0, 4)
    stepped = [PipelineComputeModel(TOY, GPU, 1, pp=2, **UNIT).iteration_us(decode_batch(3, 10 + k)) for k in range(4)]
    assert run == pytest.approx(stepped)


def test_compute_model_for_config():
    assert type(compute_model_for(SimConfig())) is RooflineComputeModel
    model = compute_model_for(SimConfig(model=LLAMA_70B, gpu="a100", tp=4, pp=2))
    assert isinstance(model, PipelineComputeModel) and model.pp == 2 and model.model.num_layers == 80
