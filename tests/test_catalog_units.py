"""Catalogue sizes against hand-computed values from the public configs (domain.md), and unit parsing."""
import pytest

from sim.setup.catalog import CatalogError, get_gpu, get_model, model_names
from sim.setup.config import ConfigError, SimConfig
from sim.units import MIB, format_bytes, parse_duration_us, parse_size_bytes


def test_llama3_8b_kv_sizes():
    model = get_model("Llama-3-8B")
    # 2 (K and V) * 32 layers * 8 KV heads * 128 dims * 2 bytes = 131,072 B per token.
    assert model.kv_bytes_per_token() == 131_072
    # One K (or V) sub-tensor: 8 * 128 * 2 = 2,048 B per token -> a 2 MiB page holds 1,024 tokens.
    assert model.tokens_per_page(2 * MIB) == 1024
    # TP=2 halves the KV heads: 1,024 B per token per sub-tensor, 2,048 tokens per page.
    assert model.tokens_per_page(2 * MIB, tp=2) == 2048
    assert model.num_sub_tensors() == 64


def test_llama3_8b_weights_match_8b_parameters():
    # 32 layers * (2*4096*4096 + 2*4096*1024 + 3*4096*14336 + 2*4096) + 2*128256*4096 + 4096
    # = 8,030,261,248 parameters (the published 8.03 B), 2 bytes each.
    assert get_model("llama-3-8b").weight_bytes() == 8_030_261_248 * 2


def test_all_seven_models_and_three_gpus():
    assert len(model_names()) == 8   # the 7 of domain.md + llama-3.1-8b (128K context)
    assert get_model("yi-34b").kv_bytes_per_token(tp=2) == 2 * 60 * 4 * 128 * 2
    assert get_gpu("h100").mem_bw_bytes_per_s == pytest.approx(3.35e12)


def test_unknown_names_list_the_known_ones():
    with pytest.raises(CatalogError, match="llama-3-8b"):
        get_model("gpt-5")
    with pytest.raises(CatalogError, match="h200"):
        get_gpu("tpu")


def test_tp_must_divide_kv_heads():
    with pytest.raises(CatalogError, match="does not divide"):
        get_model("yi-6b").kv_heads_per_worker(8)  # 4 KV heads


@pytest.mark.parametrize("text, expected", [("2MiB", 2 * MIB), ("256KiB", 256 * 1024), ("80GB", 80 * 10**9),
                                            ("4096", 4096), ("1.5KiB", 1536)])
def test_parse_size(text, expected):
    assert parse_size_bytes(text) == expected


@pytest.mark.parametrize("text", ["2 parsecs", "-1MiB", "0", "0.3B", ""])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="size"):
        parse_size_bytes(text)


def test_parse_duration_and_format():
    assert parse_duration_us("2s") == 2_000_000
    assert parse_duration_us("100ms") == 100_000
    assert format_bytes(2 * MIB) == "2 MiB"
    with pytest.raises(ValueError):
        parse_duration_us("5 fortnights")


def test_config_derived_pool_size():
    config = SimConfig()  # llama-3-8b on h200, 2 MiB pages
    # 0.9 * 143771 MiB - 16.06 GB of weights = 119.6 GB; one page group = 64 * 2 MiB = 128 MiB -> 891 groups.
    assert config.kv_budget_bytes == int(0.9 * 143771 * MIB) - 8_030_261_248 * 2
    assert config.pool_page_groups == 891
    assert config.max_pages_per_slot == 8  # 8192 tokens / 1024 per page


@pytest.mark.parametrize("kwargs, message", [
    (dict(page_size_bytes=3 * MIB), "power of two"), (dict(page_size_bytes=32 * 1024), "power of two"),
    (dict(scheduler="fifo"), "scheduler"),
    (dict(model="llama-3-70b", gpu="a100"), r"weights alone need more than the GPU.s .*: raise tp"),
    (dict(memory_util_frac=0.05), "raise memory_util_frac or tp"),
    # one unit larger than what the weights leave of the whole memory: the unit is named, not memory_util_frac
    # (125.44 GiB of 140.40 GiB left by 14.96 GiB of weights; a 2 GiB page is a 128 GiB page group of 64 tensors)
    (dict(page_size_bytes=2 * 1024 * MIB), r"^page_size_bytes=2GiB: .*not one page group \(128 GiB\), and one page "
     r"group is more than the 125.44 GiB the weights leave of the whole 140.40 GiB: use a smaller page group"),
    (dict(policy="paged", block_size_tokens=10 ** 8, max_context_tokens=10 ** 8, allow_long_context=True),
     r"^block_size_tokens=100000000: .*use a smaller block"),
    (dict(policy="paged", block_size_tokens=10 ** 11), r"^block_size_tokens=100000000000 \(policy key block=\): must lie in \[1, 8192\]"),
    (dict(policy="static", max_len_tokens=8_000_000, max_context_tokens=8_000_000, allow_long_context=True),
     r"^max_len_tokens=8000000: .*use a smaller reservation"),
    (dict(policy="static", max_context_tokens=8_000_000, allow_long_context=True),      # the slot is the unit
     r"^max_context_tokens=8000000: .*not one reservation"),
    (dict(token_budget=0), r"token_budget=0: must be >= 1"), (dict(memory_util_frac=1.5), r"memory_util_frac=1.5: must lie in \(0, 1\]")])
def test_impossible_configurations(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SimConfig(**kwargs)


def test_dotted_model_names_resolve():
    # qwen2.5-7b: 2 * 28 layers * 4 KV heads * 128 * 2 B = 57,344 B per token
    assert get_model("qwen2.5-7b").kv_bytes_per_token() == 57_344
    assert get_model("llama-3.1-8b").max_context_tokens == 131_072
