"""Window unmapping on the (emulated) driver: the executor performs the policy's drops with real VMM calls on a
cache per layer group over one handle pool; the window benchmark runs end to end on CPU."""
import json
import math

from hwbackend.beyond import window_bench
from hwbackend.vmm.emulated import EmulatedVmmDriver
from hwbackend.vmm.executor import Executor
from hwbackend.vmm.grouped import GroupedKVCache
from sim.memory import build_policy


def test_executor_unmaps_pages_below_the_window():
    config = window_bench.bench_config("models/mistral-7b.json", "unmap", slots=2, context_tokens=16384,
                                       memory_util=0.12)
    per_page = config.tokens_per_page                          # 1,024 tokens at 2 MiB (4 KiB per token and tensor)
    with GroupedKVCache.for_config(EmulatedVmmDriver(capacity_bytes=1 << 40), config) as cache:
        executor = Executor(build_policy(config), cache, background=False)
        policy = executor.policy
        slot = executor.alloc_slot(100)
        policy.computed[slot] = 0
        assert executor.step({slot: 100})
        for tokens in range(101, 12_001):
            if tokens > policy.mapped[slot] * per_page:
                policy.computed[slot] = tokens - 1
                assert executor.step({slot: tokens})
        # window 4,096 tokens: pages ceil((12,000 - 4,096) / 1,024) - 1 = 7 .. 11 stay mapped, at most 4 + 1
        pages = cache.mapped_pages(0, slot)
        assert pages == list(range((12_000 - 4096) // per_page, math.ceil(12_000 / per_page)))
        assert len(pages) <= math.ceil(4096 / per_page) + 1
        assert cache.num_free_handles == 2 * policy.free_page_groups   # a unit is a K and a V page
        assert policy.conservation_error() == 0


def test_window_bench_runs_on_the_emulated_driver(tmp_path):
    out = tmp_path / "window.json"
    assert window_bench.main(["--out", str(out), "--emulated", "--model", "models/gemma-3-12b.json", "--slots", "2",
                              "--prompt", "100", "--steps", "3000", "--context", "4096",
                              "--memory-util", "0.18"]) == 0
    variants = {v["window"]: v for v in json.loads(out.read_text())["variants"]}
    assert variants["off"]["window_crossings"] == 0
    # gemma-3-12b: 512 tokens per 2 MiB page, window 1,024: from token 1,536 on every page crossing drops one
    assert variants["unmap"]["window_crossings"] == variants["recycle"]["window_crossings"] > 0
    assert variants["unmap"]["modelled_us_per_decode_step"] > 0
