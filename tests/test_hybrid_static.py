"""Static reservation with layer groups (``static:max_len=N,window=reserve``, docs/hybrid.md): one reservation per
layer group at admission, hand-computed bytes per group, the pool's capacity with and without it, a short run."""
import json

import pytest

from cli import main
from sim.frontend.policy_spec import parse_policy
from sim.memory.hybrid_sizing import static_reserved_tokens
from sim.memory.layer_groups import LayerGroup
from sim.setup.config import ConfigError, SimConfig

GPT_OSS = "models/gpt-oss-20b.json"     # 12 full + 12 sliding (W = 128) layers, 2,048 KV B per token and layer
GEMMA = "models/gemma-3-12b.json"       # 8 full + 40 sliding (W = 1,024) layers, 8,192 KV B per token and layer


def _static(model: str, max_len: int, window: bool) -> SimConfig:
    spec = f"static:max_len={max_len}" + (",window=reserve" if window else "")
    return SimConfig(model=model, **parse_policy(spec), allow_long_context=True)


@pytest.mark.parametrize("model, max_len, full_bytes, sliding_bytes", [
    # full 12 x 2,048 x L; sliding 12 x 2,048 x (ceil(128 / 16) + 1) x 16 = 12 x 2,048 x 144
    (GPT_OSS, 8192, 12 * 2048 * 8192, 12 * 2048 * 144),
    (GPT_OSS, 32768, 12 * 2048 * 32768, 12 * 2048 * 144),
    # full 8 x 8,192 x L; sliding 40 x 8,192 x (64 + 1) x 16 = 40 x 8,192 x 1,040
    (GEMMA, 8192, 8 * 8192 * 8192, 40 * 8192 * 1040),
    (GEMMA, 32768, 8 * 8192 * 32768, 40 * 8192 * 1040)])
def test_reservation_bytes_per_group(model, max_len, full_bytes, sliding_bytes):
    config = _static(model, max_len, window=True)
    figures = config.hybrid.figures()
    assert figures["static_reserved_bytes"] == [full_bytes, sliding_bytes]
    assert config.page_group_bytes == full_bytes + sliding_bytes and config.max_pages_per_slot == 1
    assert config.tokens_per_page == max_len
    # the budget is the same; the pool holds budget // one request's reservation
    assert config.pool_page_groups == config.kv_budget_bytes // (full_bytes + sliding_bytes)


def test_capacity_with_and_without_the_per_group_reservation():
    """Requests the pool holds (one reservation each): every layer full reserves 24 x 2,048 x L bytes (gpt-oss),
    48 x 8,192 x L (Gemma 3); per group as above. Budgets: the configs' own ``kv_budget_bytes``."""
    for model, max_len, per_token_all_layers in ((GPT_OSS, 8192, 24 * 2048), (GPT_OSS, 32768, 24 * 2048),
                                                 (GEMMA, 8192, 48 * 8192), (GEMMA, 32768, 48 * 8192)):
        off, on = _static(model, max_len, window=False), _static(model, max_len, window=True)
        assert off.kv_budget_bytes == on.kv_budget_bytes
        assert off.pool_page_groups == off.kv_budget_bytes // (max_len * per_token_all_layers)
        assert on.pool_page_groups > off.pool_page_groups
    # gpt-oss at 8,192: 121,918,074,854 B // 402,653,184 = 302 against // 204,865,536 = 595
    assert (_static(GPT_OSS, 8192, False).pool_page_groups, _static(GPT_OSS, 8192, True).pool_page_groups) == (302, 595)


def test_group_rule_caps_and_linear_state():
    full, sliding = LayerGroup("full", 2, 0, 100), LayerGroup("sliding", 2, 128, 100)
    chunked, linear = LayerGroup("chunked", 2, 8192, 100), LayerGroup("linear", 3, 0, 0, 1000)
    assert static_reserved_tokens(full, 4096, 16) == 4096
    assert static_reserved_tokens(sliding, 4096, 16) == 144
    assert static_reserved_tokens(sliding, 100, 16) == 100          # capped at max_len
    assert static_reserved_tokens(LayerGroup("sliding", 1, 130, 100), 4096, 16) == 160   # ceil(130 / 16) + 1 blocks
    assert static_reserved_tokens(chunked, 32768, 16) == 8192 + 16
    assert static_reserved_tokens(chunked, 4096, 16) == 4096
    assert static_reserved_tokens(linear, 4096, 16) == 0
    jamba = SimConfig(model="models/jamba-v0.1.json", **parse_policy("static:max_len=4096,window=reserve"))
    figures = jamba.hybrid.figures()
    # 4 attention layers x 4,096 B per token x 4,096 tokens; 28 Mamba layers x 311,296 B of state (test_hybrid_sizing)
    assert figures["static_reserved_bytes"] == [4 * 4096 * 4096, 28 * 311_296]
    with pytest.raises(ValueError):
        static_reserved_tokens(full, 0, 16)


def test_mode_names():
    with pytest.raises(ConfigError, match="window='unmap' is not a static mode"):
        SimConfig(model=GEMMA, policy="static", window_alloc="unmap")
    assert not SimConfig(policy="static", window_alloc="reserve").hybrid_alloc     # llama-3-8b: one full group


def test_short_run_finishes_every_request_that_fits(tmp_path):
    """12 requests of at most 890 + 40 tokens finish; the 9,010-token one exceeds max_len (rejected, "slot");
    peak mapped bytes = 12 reservations of 204,865,536 B."""
    trace = tmp_path / "t.csv"
    rows = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    rows += [f"{i * 0.01},{300 + 50 * i},40" for i in range(12)] + ["0.2,9000,10"]
    trace.write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    assert main(["simulate", "--model", GPT_OSS, "--trace", str(trace), "--policy", "static:max_len=8192,window=reserve",
                 "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 12 and summary["rejected_by_reason"] == {"slot": 1}
    assert summary["peak_mapped_bytes"] == 12 * 204_865_536
    assert summary["kv_groups"]["static_reserved_tokens"] == [8192, 144]
