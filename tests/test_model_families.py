"""Issue 28 items 8 and 9: Hugging Face configs of the common decoder families (transcribed from the published
config.json files into tests/data/hf_configs/ and models/opt-13b.json; tests/data/hf_configs/README.md names the
hub repositories) give hand-computed parameter counts and KV bytes per token, and the vLLM paper's OPT-13B on
A100-40GB KV-cache figure is reproduced with the driver's memory figure.

Notation: N layers, h hidden, Hq / Hkv query / KV heads, D head_dim, f MLP width, V vocabulary; a LayerNorm holds
2h (weight and bias), an RMSNorm h. Nominal counts are the model cards' (tolerances say how they round)."""
import json

import pytest

from sim.setup.catalog import CatalogError, get_gpu, get_model
from sim.setup.config import SimConfig
from sim.units import MIB

HF = "tests/data/hf_configs/{}.json"


def test_opt_13b_ffn_dim_biases_layernorms_and_learned_positions():
    m = get_model("models/opt-13b.json")
    assert (m.ffn_size, m.mlp_gated, m.tie_word_embeddings, m.num_kv_heads) == (20_480, False, True, 40)
    # per layer: Q, K, V, O 4 x 5120^2 = 104,857,600 + 4 biases 20,480; fc1/fc2 2 x 5120 x 20480 = 209,715,200
    # + biases 20,480 + 5,120; 2 LayerNorms 20,480 -> 314,639,360; x 40 = 12,585,574,400; tied embedding
    # 50272 x 5120 = 257,392,640; learned positions (2048 + 2) x 5120 = 10,496,000; final LayerNorm 10,240
    assert m.total_params() == 12_853_473_280                      # the published "13B" (OPT paper Table 1)
    assert m.weight_bytes() == 2 * 12_853_473_280                  # float16
    # KV: 2 x 40 layers x 5120 x 2 B = 819,200 B, the vLLM paper's "800 KB" per token (section 3)
    assert m.kv_bytes_per_token() == 819_200
    # the positions are gathered, not streamed: tied table read as the head, positions unread
    assert m.unread_embedding_bytes() == 10_496_000 * 2


def test_vllm_paper_opt_13b_kv_cache_on_a100_40gb():
    """Kwon et al., SOSP'23, Fig. 1 and section 3: OPT-13B (26 GB of fp16 parameters) on an A100-40GB leaves
    about 12 GB of KV cache, 15.7K tokens at 800 KB each (12 GiB / 800 KiB = 15,729: both figures binary).
    Assumed setting: vLLM's default gpu_memory_utilization 0.9 (kvsim's --memory-util default); vLLM also
    subtracts the profiled activation peak, which kvsim does not reserve, so kvsim's budget is an upper bound.
    Tolerance 4%: the paper gives the cache to two significant figures (12 +- 0.5 GB) and derives 15.7K from it."""
    config = SimConfig(model="models/opt-13b.json", gpu="a100-40gb", max_context_tokens=2048)
    assert get_gpu("a100-40gb").hbm_bytes == 40_960 * MIB        # nvidia-smi 40960MiB, not 40 x 10^9
    # 0.9 x 42,949,672,960 = 38,654,705,664 - 25,706,946,560 of weights = 12,947,759,104 B = 12.06 GiB
    assert config.memory_util_frac == 0.9
    assert config.kv_budget_bytes == 12_947_759_104
    assert config.kv_budget_bytes / 2**30 == pytest.approx(12, rel=0.04)
    assert config.kv_budget_bytes / 819_200 == pytest.approx(15_700, rel=0.04)          # 15,805 tokens
    # page-granular pool: a 2 MiB page holds 2,097,152 // 10,240 = 204 tokens of one layer's K (or V); a page
    # group is 80 pages (160 MiB): 12,947,759,104 // 167,772,160 = 77 groups = 15,708 tokens
    assert config.pool_page_groups == 77
    assert config.pool_page_groups * config.model_spec.tokens_per_page(config.page_size_bytes) == 15_708
    # with the old decimal 40 x 10^9 bytes the budget was 36 x 10^9 - 25.7 x 10^9 = 0.80 of this one
    assert (int(0.9 * 40e9) - 25_706_946_560) / config.kv_budget_bytes == pytest.approx(0.795, abs=0.001)


def test_gpt2_conv1d_biases_and_learned_positions():
    m = get_model(HF.format("gpt2"))
    assert (m.num_layers, m.hidden_size, m.ffn_size, m.max_context_tokens, m.position_embedding_tokens) == (
        12, 768, 3072, 1024, 1024)                                  # n_layer, n_embd, n_inner null = 4h, n_positions
    # per layer: c_attn 768 x 2304 + 2304, c_proj 768^2 + 768, c_fc 768 x 3072 + 3072, c_proj 3072 x 768 + 768,
    # 2 LayerNorms 3,072 -> 7,087,872; x 12 = 85,054,464; wte 50257 x 768 = 38,597,376 (tied); wpe 1024 x 768 =
    # 786,432; ln_f 1,536 -> 124,439,808, the well-known GPT-2 small count exactly
    assert m.total_params() == 124_439_808
    assert m.kv_bytes_per_token() == 2 * 12 * 768 * 2 == 36_864     # no torch_dtype: served in bf16


def test_gpt_j_parallel_block_mlp_biases_and_head_bias():
    m = get_model(HF.format("gpt-j-6b"))
    assert (m.norms_per_layer, m.attention_bias, m.mlp_bias, m.lm_head_bias, m.tie_word_embeddings) == (
        1, False, True, True, False)
    # per layer: q, k, v, out 4 x 4096^2 = 67,108,864 (no bias); fc_in/fc_out 2 x 4096 x 16384 + 16384 + 4096;
    # one LayerNorm 8,192 -> 201,355,264; x 28 = 5,637,947,392; wte + lm_head 2 x 50400 x 4096 = 412,876,800;
    # lm_head bias 50,400; ln_f 8,192 -> 6,050,882,784
    assert m.total_params() == 6_050_882_784
    assert m.total_params() == pytest.approx(6_053_381_344, rel=5e-4)   # model card's n_parameters (0.04% apart)
    assert m.kv_bytes_per_token() == 2 * 28 * 16 * 256 * 2 == 458_752


def test_gpt_neox_20b_biases_and_untied_head():
    m = get_model(HF.format("gpt-neox-20b"))
    assert (m.tie_word_embeddings, m.attention_out_bias, m.norm_bias) == (False, True, True)
    # per layer: query_key_value 6144 x 18432 + 18432, dense 6144^2 + 6144, MLP 2 x 6144 x 24576 + 24576 + 6144,
    # 2 LayerNorms 24,576 -> 453,064,704; x 44 = 19,934,846,976; embed_in + embed_out 2 x 50432 x 6144 =
    # 619,708,416; final LayerNorm 12,288 -> 20,554,567,680 (GPT-NeoX-20B paper: 20.55 B)
    assert m.total_params() == 20_554_567_680
    assert m.kv_bytes_per_token() == 2 * 44 * 6144 * 2 == 1_081_344


def test_falcon_7b_multi_query_parallel_attention_default_context():
    m = get_model(HF.format("falcon-7b"))
    # multi_query: one KV head of 4544 / 71 = 64; no max_position_embeddings: FalconConfig's 2048
    assert (m.num_kv_heads, m.head_dim, m.ffn_size, m.max_context_tokens, m.norms_per_layer) == (1, 64, 18_176, 2048, 1)
    # per layer: fused QKV 4544 x (4544 + 2 x 64) = 21,229,568, dense 4544^2 = 20,647,936 (bias false),
    # MLP 2 x 4544 x 18176 = 165,183,488, one LayerNorm 9,088 -> 207,070,080; x 32 = 6,626,242,560;
    # tied embedding 65024 x 4544 = 295,469,056; ln_f 9,088 -> 6,921,720,704
    assert m.total_params() == 6_921_720_704
    assert m.total_params() == pytest.approx(7e9, rel=0.02)         # model card "7B"
    assert m.kv_bytes_per_token() == 2 * 32 * 1 * 64 * 2 == 8_192


def test_phi_2_and_phi_3():
    phi2 = get_model(HF.format("phi-2"))
    # per layer: q, k, v, dense 4 x 2560^2 + 4 x 2560; fc1/fc2 2 x 2560 x 10240 + 10240 + 2560; one LayerNorm
    # 5,120 -> 78,671,360; x 32 = 2,517,483,520; embed + lm_head 2 x 51200 x 2560 = 262,144,000 + head bias 51,200;
    # final LayerNorm 5,120 -> 2,779,683,840 (model card: 2.7 B)
    assert phi2.total_params() == 2_779_683_840
    assert phi2.kv_bytes_per_token() == 2 * 32 * 32 * 80 * 2 == 327_680
    phi3 = get_model(HF.format("phi-3-mini-4k-instruct"))
    assert (phi3.mlp_gated, phi3.norm_bias, phi3.attention_bias) == (True, False, False)
    # per layer: 4 x 3072^2 + 3 x 3072 x 8192 + 2 x 3072 = 113,252,352; x 32 = 3,624,075,264; 2 x 32064 x 3072 =
    # 197,001,216; final 3,072 -> 3,821,079,552 (model card: 3.8 B)
    assert phi3.total_params() == 3_821_079_552
    assert phi3.total_params() == pytest.approx(3.8e9, rel=0.01)


def test_gemma_2_9b_four_norms_alternating_window_float32_served_in_bf16():
    m = get_model(HF.format("gemma-2-9b"))
    assert (m.head_dim, m.norms_per_layer, m.tie_word_embeddings, m.dtype_bytes) == (256, 4, True, 2)
    # Gemma 2 slides every other layer (Gemma2Config layer_types): 21 of 42 with a 4,096-token window
    assert (m.sliding_window_tokens, m.sliding_window_layers) == (4096, 21)
    # per layer: q 3584 x 4096, k, v 2 x 3584 x 2048, o 4096 x 3584 = 44,040,192; MLP 3 x 3584 x 14336 =
    # 154,140,672; 4 RMSNorms 14,336 -> 198,195,200; x 42 = 8,324,198,400; tied 256000 x 3584 = 917,504,000;
    # final 3,584 -> 9,241,705,984 (model card: 9 B; 9.24 B)
    assert m.total_params() == 9_241_705_984
    assert m.kv_bytes_per_token() == 2 * 42 * 8 * 256 * 2 == 344_064


def test_qwen2_5_7b_qkv_bias_and_qwen3_qk_norm():
    q25 = get_model(HF.format("qwen2.5-7b"))
    # per layer: 3584^2 x 2 + 2 x 3584 x 512 + QKV biases 4,608 + 3 x 3584 x 18944 + 7,168 = 233,057,792; x 28 =
    # 6,525,618,176; 2 x 152064 x 3584 = 1,089,994,752; final 3,584 -> 7,615,616,512 (card: 7.61 B, 6.53 B without
    # embeddings)
    assert q25.total_params() == 7_615_616_512
    assert q25.total_params() - 1_089_994_752 == pytest.approx(6.53e9, rel=1e-3)
    assert q25.kv_bytes_per_token() == 57_344 == get_model("qwen2.5-7b").kv_bytes_per_token()
    q3 = get_model(HF.format("qwen3-8b"))
    assert (q3.qk_norm, q3.attention_bias) == (True, False)
    # per layer: 2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 12288 + 2 x 4096 + q/k norms 2 x 128 = 192,946,432;
    # x 36 = 6,946,071,552; 2 x 151936 x 4096 = 1,244,659,712; final 4,096 -> 8,190,735,360 (card: 8.2 B)
    assert q3.total_params() == 8_190_735_360
    assert q3.kv_bytes_per_token() == 2 * 36 * 8 * 128 * 2 == 147_456


def test_mistral_and_mixtral_shipped_configs():
    mistral, mixtral = get_model("models/mistral-7b.json"), get_model("models/mixtral-8x7b.json")
    # Mistral-7B: 32 x (2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336 + 8,192) + 2 x 32000 x 4096 + 4096
    assert mistral.total_params() == 7_241_732_096                  # card: 7.24 B
    assert mixtral.total_params() == 46_702_792_704 and mixtral.experts_per_token == 2     # 46.7 B, top-2 of 8
    assert mistral.kv_bytes_per_token() == mixtral.kv_bytes_per_token() == 131_072


def test_deepseek_v2_lite_mla_sized():
    m = get_model(HF.format("deepseek-v2-lite"))
    assert (m.uses_mla, m.q_lora_rank, m.num_experts, m.num_shared_experts, m.first_dense_layers) == (True, 0, 64, 2, 1)
    # MLA caches kv_lora_rank + qk_rope_head_dim = 576 elements per token and layer: 27 x 576 x 2 B
    assert m.kv_bytes_per_token() == 31_104
    # attention (no q_lora): q 2048 x 16 x 192, kv_a 2048 x 576 + norm 512, kv_b 512 x 16 x 256, o 16 x 128 x 2048
    # = 13,763,072; dense layer + MLP 3 x 2048 x 10944 + norms 4,096 = 81,007,104; 26 MoE layers x (attention +
    # 66 x 3 x 2048 x 1408 + router 131,072 + 4,096) = 15,206,044,672; embed + head 419,430,400; final 2,048
    assert m.total_params() == 15_706_484_224                       # card: 15.7 B
    # active: MoE layers with 6 routed + 2 shared experts; the card's 2.4 B excludes the input embedding
    assert m.active_params() == 2_661_150_208
    assert m.active_params() - 102_400 * 2048 == pytest.approx(2.4e9, rel=0.03)


def test_opt_projected_embeddings_refused_naming_the_field(tmp_path):
    data = json.loads(open("models/opt-13b.json").read()) | {"word_embed_proj_dim": 512}
    path = tmp_path / "opt-350m.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CatalogError, match=r"opt-350m.json: field word_embed_proj_dim \(512\) differs from hidden_size"):
        get_model(str(path))
    data = json.loads(open(HF.format("gpt2")).read()) | {"n_embd": "768"}
    path.write_text(json.dumps(data))
    with pytest.raises(CatalogError, match=r"field n_embd must be a whole number"):     # named as the file names it
        get_model(str(path))
