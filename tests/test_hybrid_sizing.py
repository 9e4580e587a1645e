"""Per-group sizes of hybrid models, computed by hand from their published configs (models/*.json)."""
import pytest

from sim.setup.config import ConfigError, SimConfig
from sim.memory.layer_groups import LayerGroup, kv_bytes_for_tokens, layer_groups
from sim.setup.model_files import load_model_file, model_from_hf_config
from sim.frontend.policy_spec import parse_policy


def _kinds(spec, tp=1):
    return {g.kind: g for g in layer_groups(spec, tp)}


def test_gpt_oss_20b_groups_weights_and_sinks():
    spec = load_model_file("models/gpt-oss-20b.json")
    groups = _kinds(spec)
    # layer_types alternates sliding_attention / full_attention over 24 layers; window 128
    assert (groups["full"].num_layers, groups["sliding"].num_layers, groups["sliding"].window_tokens) == (12, 12, 128)
    # K and V: 2 x 8 KV heads x 64 x 2 bytes = 2,048 B per token and layer
    assert groups["full"].kv_bytes_per_token == groups["sliding"].kv_bytes_per_token == 12 * 2048
    # MXFP4 experts: 24 layers x 32 experts x 3 x 2880 x 2880 matrix weights at 4 + 8/32 = 4.25 bits
    experts = 24 * 32 * 3 * 2880 * 2880
    assert spec.quantised_expert_params() == experts == 19_110_297_600
    assert spec._quantised_saving_bytes(experts) == experts * 2 - experts * 17 // 32
    assert spec.attention_sinks
    # published total: 20.91B parameters (gpt-oss model card, table 1)
    assert spec.total_params() == pytest.approx(20.91e9, rel=1e-3)
    # checkpoint ~12.8 GiB: bf16 attention/embeddings + 10.15 GB of MXFP4 experts
    assert spec.weight_bytes() == pytest.approx(12.82 * 2**30, rel=2e-3)


def test_gemma_3_12b_five_to_one():
    spec = load_model_file("models/gemma-3-12b.json")
    groups = _kinds(spec)
    # 48 layers, every 6th global (sliding_window_pattern 6): 8 full, 40 sliding of 1,024 tokens
    assert (groups["full"].num_layers, groups["sliding"].num_layers, groups["sliding"].window_tokens) == (8, 40, 1024)
    per_layer = 2 * 8 * 256 * 2          # 8 KV heads x head_dim 256, K and V, bf16 = 8,192 B
    assert groups["full"].kv_bytes_per_token_per_layer == per_layer
    tokens = 32_768
    assert kv_bytes_for_tokens(layer_groups(spec), tokens) == 8 * per_layer * tokens + 40 * per_layer * 1024
    assert spec.kv_bytes_per_token() * tokens == 48 * per_layer * tokens          # what a window-blind count says


def test_mistral_7b_all_sliding():
    groups = layer_groups(load_model_file("models/mistral-7b.json"))
    assert [(g.kind, g.num_layers, g.window_tokens, g.kv_bytes_per_token_per_layer) for g in groups] == [
        ("sliding", 32, 4096, 2 * 8 * 128 * 2)]


def test_jamba_mamba_state_and_params():
    spec = load_model_file("models/jamba-v0.1.json")
    groups = _kinds(spec)
    # attention when i % 8 == 4: layers 4, 12, 20, 28; the other 28 are Mamba
    assert (groups["full"].num_layers, groups["linear"].num_layers) == (4, 28)
    d_inner = 2 * 4096
    # vLLM mamba1 state: conv (d_conv - 1) x d_inner + ssm d_inner x d_state, bf16
    assert groups["linear"].state_bytes_per_request_per_layer == ((4 - 1) * d_inner + d_inner * 16) * 2 == 311_296
    assert _kinds(spec, tp=2)["linear"].state_bytes_per_request_per_layer == 311_296 // 2
    assert spec.num_moe_layers == 16                        # expert_layer_period 2, offset 1
    assert spec.total_params() == pytest.approx(51.57e9, rel=2e-3)   # model card: 52B total, 12B active
    assert spec.active_params() == pytest.approx(12.1e9, rel=1e-2)


def test_qwen3_next_gated_deltanet_state():
    config = {"model_type": "qwen3_next", "num_hidden_layers": 8, "hidden_size": 2048, "num_attention_heads": 16,
              "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 5120, "vocab_size": 1000,
              "max_position_embeddings": 4096, "hidden_act": "silu",
              "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
              "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
              "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}
    groups = _kinds(model_from_hf_config(config, "qwen3-next.json"))
    assert (groups["full"].num_layers, groups["linear"].num_layers) == (2, 6)
    conv_dim = 2 * 16 * 128 + 32 * 128
    assert groups["linear"].state_bytes_per_request_per_layer == (3 * conv_dim + 32 * 128 * 128) * 2 == 1_097_728


def test_llama4_chunked_layers():
    config = {"model_type": "llama4_text", "num_hidden_layers": 48, "hidden_size": 5120, "num_attention_heads": 40,
              "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "vocab_size": 1000,
              "max_position_embeddings": 8192, "hidden_act": "silu", "attention_chunk_size": 8192}
    groups = _kinds(model_from_hf_config(config, "llama4.json"))
    assert (groups["chunked"].num_layers, groups["chunked"].window_tokens, groups["full"].num_layers) == (36, 8192, 12)


@pytest.mark.parametrize("kind, window, tokens, held", [
    ("sliding", 4096, 100, 100), ("sliding", 4096, 10_000, 4096), ("chunked", 8192, 8192, 8192),
    ("chunked", 8192, 8193, 1), ("full", 0, 10_000, 10_000)])
def test_held_and_skipped_tokens(kind, window, tokens, held):
    group = LayerGroup(kind, 1, window, 2)
    assert group.held_tokens(tokens) == held
    # vLLM get_num_skipped_tokens: sliding C - W + 1, chunked floor(C / W) * W
    expected_skip = {"sliding": max(0, tokens - window + 1), "chunked": tokens // window * window if window else 0,
                     "full": 0}[kind]
    assert group.skipped_tokens(tokens) == expected_skip


def test_pool_units_per_policy():
    gemma = "models/gemma-3-12b.json"
    va = SimConfig(model=gemma, **parse_policy("vattention:window=unmap"))
    assert va.page_group_bytes == 2 * 2 * 2**20 and va.group_units == (8, 40)
    paged = SimConfig(model=gemma, **parse_policy("paged:window=free"))
    # vLLM: group_size = 8 layers (the fewest), page = 8 x 16 tokens x 8,192 B; 1 full + 5 sliding KV-cache groups
    assert paged.page_group_bytes == 8 * 16 * 8192 and paged.group_units == (1, 5)
    jamba = SimConfig(model="models/jamba-v0.1.json", **parse_policy("paged:window=free"))
    # Mamba page of 4 layers (1,245,184 B) fits a block of ceil(1,245,184 / 16,384) = 76 -> 80 tokens
    assert (jamba.tokens_per_page, jamba.page_group_bytes, jamba.group_units) == (80, 4 * 80 * 4096, (1, 7))
    jamba_va = SimConfig(model="models/jamba-v0.1.json", **parse_policy("vattention:window=unmap"))
    assert jamba_va.hybrid.state_reserved_bytes == 256 * 28 * 311_296
    assert jamba_va.to_dict()["layer_groups"]["groups"][1]["state_bytes_per_request_per_worker"] == 28 * 311_296


def test_window_alloc_refusals():
    with pytest.raises(ConfigError, match="window='free' is not a vattention mode"):
        SimConfig(model="models/gemma-3-12b.json", policy="vattention", window_alloc="free")
    with pytest.raises(ConfigError, match="prefix caching"):
        SimConfig(model="models/gemma-3-12b.json", **parse_policy("vattention:window=unmap,prefix=on"))
    assert not SimConfig(window_alloc="unmap").hybrid_alloc       # llama-3-8b: one full group, nothing changes
