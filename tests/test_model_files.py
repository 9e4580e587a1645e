"""Issue 21: models from Hugging Face configs (models/*.json, transcribed public configs), MoE and MLA shapes, the
GPU catalogue and user GPU files. Every expected value is computed by hand in the comments from the config
fields (h = hidden_size, N = layers, Hq / Hkv = query / KV heads, D = head_dim, V = vocab)."""
import json
from pathlib import Path

import pytest

from sim.setup.catalog import CatalogError, get_gpu, get_model, gpu_names
from sim.setup.config import SimConfig
from sim.units import MIB

MODELS = "models/{}.json"


def test_llama_3_1_70b_from_its_config():
    m = get_model(MODELS.format("llama-3.1-70b"))
    # KV per token: 2 (K, V) x 80 layers x 8 KV heads x 128 x 2 B = 327,680 B; per layer 4,096 B.
    assert m.kv_bytes_per_token() == 327_680
    assert m.kv_bytes_per_token_per_layer() == 4_096
    assert m.kv_bytes_per_token(tp=4) == 81_920            # 2 KV heads per worker
    # per layer: Q,O 2 x 8192 x 8192 = 134,217,728; K,V 2 x 8192 x 1024 = 16,777,216; MLP 3 x 8192 x 28672 =
    # 704,643,072; norms 2 x 8192 -> 855,654,400; x 80 = 68,452,352,000; embed + head 2 x 128256 x 8192 =
    # 2,101,346,304; final norm 8,192 -> 70,553,706,496 parameters (the published 70.6 B), 2 B each.
    assert m.total_params() == 70_553_706_496
    assert m.weight_bytes() == 141_107_412_992
    assert (m.max_context_tokens, m.mlp_gated, m.tie_word_embeddings, m.uses_moe, m.uses_mla) == (
        131_072, True, False, False, False)


def test_qwen2_5_72b_bias_and_unused_sliding_window():
    m = get_model(MODELS.format("qwen2.5-72b"))
    # use_sliding_window false: the 131,072-token window is not used.
    assert (m.sliding_window_tokens, m.sliding_window_layers, m.attention_bias) == (0, 0, True)
    # per layer: attention 150,994,944 + QKV biases 8192 + 1024 + 1024 = 10,240; MLP 3 x 8192 x 29568 =
    # 726,663,168; norms 16,384 -> 877,684,736; x 80 = 70,214,778,880; embed + head 2 x 152064 x 8192 =
    # 2,491,416,576; final norm 8,192 -> 72,706,203,648 (the published 72.7 B).
    assert m.total_params() == 72_706_203_648
    assert m.kv_bytes_per_token() == 327_680


def test_mixtral_all_experts_resident_top2_computed():
    m = get_model(MODELS.format("mixtral-8x7b"))
    # per layer: attention 2 x 4096 x 4096 + 2 x 4096 x 1024 = 41,943,040; router 4096 x 8 = 32,768;
    # 8 experts x 3 x 4096 x 14336 = 1,409,286,144; norms 8,192 -> 1,451,270,144; x 32 = 46,440,644,608;
    # embed + head 2 x 32000 x 4096 = 262,144,000; final norm 4,096 -> 46,702,792,704 (the published 46.7 B).
    assert m.total_params() == 46_702_792_704
    assert m.weight_bytes() == 2 * 46_702_792_704
    # active: attention + router + 2 experts (352,321,536) = 394,297,344 x 32 = 12,617,515,008; + norms
    # 266,240 + embed and head 262,144,000 = 12,879,925,248 (the published 12.9 B)
    assert m.active_params() == 12_879_925_248
    assert m.active_linear_params() == 12_617_515_008
    assert m.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 131_072


def test_deepseek_v3_mla_moe_fp8():
    m = get_model(MODELS.format("deepseek-v3"))
    assert (m.uses_mla, m.uses_moe, m.dtype_bytes, m.kv_element_bytes) == (True, True, 1, 2)
    # MLA caches one latent of kv_lora_rank + qk_rope_head_dim = 512 + 64 = 576 elements per token and layer:
    # 576 x 2 B x 61 layers = 70,272 B per token, the same on every tensor-parallel worker (replicated).
    assert m.kv_bytes_per_token() == m.kv_bytes_per_token(tp=8) == 70_272
    assert m.num_sub_tensors() == 61
    assert m.tokens_per_page(2 * MIB) == 2_097_152 // 1_152 == 1_820
    # attention per layer: q_a 7168 x 1536 + norm 1536, q_b 1536 x 128 x 192, kv_a 7168 x 576 + norm 512,
    # kv_b 512 x 128 x 256, o 128 x 128 x 7168 = 187,107,328; dense MLP 3 x 7168 x 18432 = 396,361,728;
    # MoE: (256 routed + 1 shared) x 3 x 7168 x 2048 = 11,318,329,344 + router 7168 x 256 = 1,835,008.
    # 3 dense layers x 583,469,056 + 58 MoE layers x 11,507,271,680 + norms 881,664 + embed and head
    # 2 x 129280 x 7168 = 1,853,358,080 -> 671,026,404,352 (the published 671 B, without the MTP module).
    assert m.total_params() == 671_026_404_352
    # fp8 linear layers (669,172,164,608 B) + bf16 norms, embedding and head ((881,664 + 1,853,358,080) x 2)
    assert m.weight_bytes() == 669_172_164_608 + 3_708_479_488
    # active per token: attention + router + 8 routed + 1 shared experts in MoE layers (published: 37 B)
    assert m.active_params() == 37_552_282_624


def test_transcribed_configs_match_the_builtin_catalogue():
    # mistral-7b and yi-34b are in both: the config.json gives the catalogue's weights and KV sizes
    for name in ("mistral-7b", "yi-34b"):
        builtin, hf = get_model(name), get_model(MODELS.format(name))
        assert hf.weight_bytes() == builtin.weight_bytes()
        assert hf.kv_bytes_per_token() == builtin.kv_bytes_per_token()
    # Yi-34B: 60 x (117,440,512 + 440,401,920 + 14,336) + 2 x 64000 x 7168 + 7168 = 34,388,917,248 parameters
    assert get_model(MODELS.format("yi-34b")).total_params() == 34_388_917_248


def test_mistral_sliding_window_caps_kv_per_request():
    m = get_model(MODELS.format("mistral-7b"))
    assert (m.sliding_window_tokens, m.sliding_window_layers) == (4096, 32)
    # 8,192 tokens hold 4,096 tokens' KV in every (sliding) layer: 4096 x 131,072 B
    assert m.kv_bytes_for_tokens(8192) == 4096 * 131_072
    assert m.kv_bytes_for_tokens(1000) == 1000 * 131_072
    note = SimConfig(model=MODELS.format("mistral-7b"), max_context_tokens=8192).notes
    assert any("sliding window" in line for line in note)


def test_tied_embeddings_and_plain_mlp_counted_once(tmp_path):
    config = {"model_type": "gpt_neox", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
              "intermediate_size": 256, "vocab_size": 1000, "max_position_embeddings": 2048,
              "tie_word_embeddings": True, "torch_dtype": "float16"}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(config))
    m = get_model(str(path))
    assert (m.mlp_gated, m.tie_word_embeddings, m.head_dim, m.num_kv_heads) == (False, True, 16, 4)
    # GPT-NeoX layers carry biases and LayerNorms (issue 28): per layer attention 4 x 64 x 64 = 16,384 + QKV
    # biases 192 + output bias 64; plain MLP 2 x 64 x 256 = 32,768 + biases 256 + 64; two LayerNorms 2 x 128
    # -> 49,984; x 2 = 99,968; one tied table 1000 x 64 = 64,000; final LayerNorm 128 -> 164,096 parameters, 2 B each
    assert m.total_params() == 164_096
    assert m.weight_bytes() == 328_192
    # the tied table is read as the LM head every iteration: nothing is left unread
    assert m.unread_embedding_bytes() == 0


def test_builtin_catalogue_figures_unchanged():
    # the catalogue's models are untied with gated MLPs: their figures are those of the catalogue before issue 21
    assert get_model("llama-3-8b").weight_bytes() == 8_030_261_248 * 2
    assert get_model("qwen2.5-7b").tie_word_embeddings is False
    assert SimConfig().pool_page_groups == 891


@pytest.mark.parametrize("change, field", [
    ({"num_hidden_layers": None}, "num_hidden_layers is missing"),
    ({"num_key_value_heads": 3}, "num_key_value_heads (3) must divide num_attention_heads"),
    ({"hidden_size": "4096"}, "hidden_size must be a whole number"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok (9) exceeds the 8 experts"),
    ({"n_routed_experts": 16}, "n_routed_experts (16) contradicts num_local_experts (8)"),
    ({"torch_dtype": "int3"}, "torch_dtype must be one of"),
    ({"quantization_config": {"quant_method": "awq", "bits": 4}}, "quantization_config.quant_method \"awq\""),
    ({"qk_rope_head_dim": 64}, "kv_lora_rank is missing while qk_rope_head_dim is set"),
])
def test_bad_config_is_one_line_naming_file_and_field(tmp_path, change, field):
    data = json.loads(open(MODELS.format("mixtral-8x7b")).read())
    for key, value in change.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CatalogError) as info:
        get_model(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}: field ") and field in message and "\n" not in message


def test_unreadable_files(tmp_path):
    with pytest.raises(CatalogError, match="no such file"):
        get_model(str(tmp_path / "absent.json"))
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(CatalogError, match=r"x.json: not valid JSON"):
        get_model(str(tmp_path / "x.json"))


def test_model_toml_uses_catalogue_keys(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("num_layers = 2\nhidden_size = 64\nnum_q_heads = 4\nnum_kv_heads = 2\nhead_dim = 16\n"
                    "ffn_size = 128\nvocab_size = 100\nmax_context_tokens = 4096\nkv_dtype_bytes = 1\n")
    m = get_model(str(path))
    assert m.kv_bytes_per_token() == 2 * 2 * 2 * 16 * 1          # fp8 KV: 128 B per token
    huge = tmp_path / "huge.toml"         # a width no model comes near: refused, not overflowed later
    huge.write_text(path.read_text().replace("hidden_size = 64", "hidden_size = 1e15"))
    with pytest.raises(CatalogError, match=r"huge.toml: field hidden_size must be <= 1,099,511,627,776"):
        get_model(str(huge))
    path.write_text(path.read_text() + "colour = 3\n")
    with pytest.raises(CatalogError, match="field colour is not a model field"):
        get_model(str(path))


def test_gpu_catalogue_datasheet_figures():
    assert len(gpu_names()) == 11
    b200, mi300x, h20 = get_gpu("b200"), get_gpu("mi300x"), get_gpu("h20")
    assert (b200.bf16_flops, b200.fp8_flops, b200.mem_bw_bytes_per_s) == (2.25e15, 4.5e15, 8.0e12)
    assert (mi300x.hbm_bytes, mi300x.bf16_flops) == (196_592 * MIB, 1307.4e12)     # rocminfo, not 192 x 10^9
    assert h20.usd_per_gpu_hour is None and "no public" in h20.price_source
    assert get_gpu("h200").vmm_borrowed_from is None and get_gpu("l40s").vmm_borrowed_from == "h200"
    for name in gpu_names():
        assert get_gpu(name).source, name          # every entry cites its datasheet


def test_gpu_toml_and_its_errors(tmp_path):
    path = tmp_path / "rtx.toml"
    path.write_text('full_name = "My GPU"\nhbm_bytes = 24000000000\nbf16_flops = 165e12\n'
                    'mem_bw_bytes_per_s = 1.0e12\nnvlink_bytes_per_s = 32e9\npcie_bytes_per_s = 32e9\n'
                    'usd_per_gpu_hour = 0.5\n')
    gpu = get_gpu(str(path))
    assert (gpu.name, gpu.usd_per_gpu_hour, gpu.vmm_borrowed_from) == ("rtx", 0.5, "h200")
    path.write_text(path.read_text() + "fp8_flops = 165e9\n")            # TFLOP/s taken for GFLOP/s, say
    with pytest.raises(CatalogError, match=r"rtx.toml: field fp8_flops 1.65e\+11 FLOP/s is below bf16_flops"):
        get_gpu(str(path))
    path.write_text(path.read_text().replace("fp8_flops = 165e9\n", "fp8_flops = 330e12\n"))
    assert get_gpu(str(path)).fp8_flops == 330e12
    path.write_text(path.read_text().replace("bf16_flops = 165e12\n", "bf16_flops = -1\n"))
    with pytest.raises(CatalogError, match=r"rtx.toml: field bf16_flops must be > 0, got -1"):
        get_gpu(str(path))
    # a memory beyond 256 TiB (2e30 once ended in an OverflowError deep in the records) is refused by name
    path.write_text(path.read_text().replace("bf16_flops = -1\n", "bf16_flops = 165e12\n")
                    .replace("hbm_bytes = 24000000000", "hbm_bytes = 2e30"))
    with pytest.raises(CatalogError, match=r"rtx.toml: field hbm_bytes must be <= 281,474,976,710,656 .*got 2e\+30"):
        get_gpu(str(path))


def test_dtype_overrides_and_derived_figures_in_config():
    config = SimConfig(model=MODELS.format("llama-3.1-70b"), gpu="h100", tp=4, weight_dtype="fp8", kv_dtype="fp8")
    derived = config.to_dict()["model_derived"]
    # fp8 KV: 2 x 80 x 2 KV heads x 128 x 1 B = 40,960 B per token per worker
    assert derived["kv_bytes_per_token_per_worker"] == 40_960
    # fp8 weights: linear 80 x 855,638,016 / 4 = 17,112,760,320 B; bf16 norms 1,318,912 and embed + head
    # 2 x 128256 x 8192 / 4 = 525,336,576 parameters -> (1,318,912 + 525,336,576) x 2 = 1,053,310,976 B
    assert derived["weight_bytes_per_worker"] == 17_112_760_320 + 1_053_310_976
    assert config.to_dict()["vmm_profile_borrowed_from"] == "h200"


def test_unknown_activation_and_tiny_context_are_refused(tmp_path):
    """An unknown model_type with an unknown hidden_act cannot tell the MLP kind (refused, naming the field,
    rather than guessed plain); a context under 2 tokens holds no request."""
    from pathlib import Path

    base = json.loads((Path(__file__).resolve().parents[1] / "models" / "mistral-7b.json").read_text())
    weird = tmp_path / "weird.json"
    weird.write_text(json.dumps({**base, "model_type": "foo", "hidden_act": "weird"}))
    with pytest.raises(CatalogError, match="hidden_act .weird.*cannot tell whether the MLP is gated"):
        get_model(str(weird))
    tiny = tmp_path / "tiny.json"
    tiny.write_text(json.dumps({**base, "max_position_embeddings": 1}))
    with pytest.raises(CatalogError, match="max_position_embeddings must be >= 2"):
        get_model(str(tiny))


@pytest.mark.parametrize("key, source, entry", [("layer_types", "gpt-oss-20b.json", "sliding_attnetion"),
                                                ("layers_block_type", "jamba-v0.1.json", "mambo")])
def test_a_misspelt_layer_type_is_refused_by_entry(tmp_path, key, source, entry):
    """A misspelt entry was counted as a full-attention layer (gpt-oss became 13 full / 11 sliding), silently."""
    data = json.loads((Path(__file__).resolve().parents[1] / "models" / source).read_text())
    if key not in data:         # Jamba's file gives attn_layer_period / _offset: write the list out
        data[key] = ["mamba"] * data["num_hidden_layers"]
    data[key][0] = entry
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"m.json: field {key}\[0\] \"{entry}\" is not a layer type kvsim knows"):
        get_model(str(path))
