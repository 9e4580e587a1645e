"""KV tiers below HBM (sim.memory.tiers), their engine charges (sim.core.tier_charges) and the prefix eviction
policies (sim.memory.eviction). Expected values are hand-computed from the page sizes in each test."""
import pytest
from hypothesis import given, settings, strategies as st

from sim.setup.config import ConfigError, SimConfig
from sim.core.engine import Simulator
from sim.memory import PrefixCachingPolicy, VAttentionConfig
from sim.memory.eviction import VICTIMS
from sim.memory.tiers import TierSpec, TierStore, parse_kv_tier, tier_keys, with_host_copy_profile
from tests.helpers import ConstantCompute, constant_vmm, trace

GB = 1e9


def _policy(pool: int, evict: str = "lru", tiers=(), write: str = "write-back", region: int = 1) -> PrefixCachingPolicy:
    """512-token pages = the trace's 512-token hash blocks; no watermarks, no deferred reclamation."""
    config = VAttentionConfig(num_slots=3, max_pages_per_slot=8, pool_page_groups=pool, tokens_per_page=512,
                              admission_watermark_frac=0.0, low_watermark_frac=0.0, eager_page_groups=0,
                              deferred_reclaim=False)
    p = PrefixCachingPolicy(config, block_tokens=512, cow_partial=False)
    p.victims, p.pages_per_region = VICTIMS[evict], region
    if tiers:
        p.tier_store = TierStore(tiers, page_bytes=1000, tokens_per_page=512, write_policy=write)
    return p


def _cache_prompt(p: PrefixCachingPolicy, ids: list[int], prompt: int) -> None:
    """Admit, compute, donate a whole prompt, then free the slot (its pages become evictable entries)."""
    slot = p.alloc_slot(prompt)
    p.admit_prefix(slot, ids, prompt)
    assert p.step({slot: prompt}) is not None
    p.donate(slot, ids, prompt, prompt)
    p.free_slot(slot, 0)
    p.iteration_completed(0)


def _tier(kind="dram", pages=2, read=1000.0, write=500.0, latency=10.0) -> TierSpec:
    """A tier of ``pages`` 1,000-byte pages; rates in bytes/s chosen so that one page reads in 1 s."""
    return TierSpec(kind, pages * 1000, read, write, latency)


# ---- three-request cases, per tier and write policy -------------------------------------------------------
@pytest.mark.parametrize("write, pages", [("write-back", 3), ("write-through", 6)])
def test_three_requests_dram_tier_serves_what_hbm_evicted(write, pages):
    """Pool 3 pages. Request A caches [1, 2, 3] (3 pages); request B = [7, 8, 9] evicts A's three pages (LRU)
    before caching its own. Write-back stores A's pages on that eviction (DRAM of 3); write-through stored each
    page when donated (DRAM of 6 holds all six). Request C = [1, 2, 3, 4] (2,048 tokens): HBM holds none of it,
    DRAM holds pages 0-2 = 1,536 tokens (cap prompt - 1 = 2,047 tokens: 3 whole pages). Load: 3 pages x 1,000 B
    at 1,000 B/s = 3 s + 10 us latency."""
    p = _policy(pool=3, tiers=(_tier(pages=pages),), write=write)
    _cache_prompt(p, [1, 2, 3], 1536)
    _cache_prompt(p, [7, 8, 9], 1536)
    store = p.tier_store
    assert store.conservation_error() == 0
    keys = tier_keys(p, [1, 2, 3, 4], 2048, 0)
    found = store.find(keys)
    assert len(found) == 3 and all(tier == 0 for _, tier in found)
    assert store.commit_load(found, len(keys)) == pytest.approx(3e6 + 10.0)
    assert store.stats[0]["hit_tokens"] == 1536 and store.stats[0]["miss_tokens"] == 0
    if write == "write-back":     # 3 stores owed by the next iteration: 1,000 B at 500 B/s = 2 s + 10 us each
        assert store.take_critical_us() == pytest.approx(3 * (2e6 + 10.0))
        assert store.stats[0]["inserted"] == 3
    else:                         # 6 asynchronous stores, nothing owed
        assert store.take_critical_us() == 0.0
        assert store.stats[0]["inserted"] == 6 and store.stats[0]["dropped"] == 0


def test_write_through_drops_the_oldest_and_keeps_the_newest():
    """Write-through stores each donated page: DRAM of 3 pages holds B's [7, 8, 9] after A and B; C = [1, 2, 3, 4]
    finds nothing in DRAM (A's pages were dropped from the single tier)."""
    p = _policy(pool=3, tiers=(_tier(pages=3),), write="write-through")
    _cache_prompt(p, [1, 2, 3], 1536)
    _cache_prompt(p, [7, 8, 9], 1536)
    assert p.tier_store.find(tier_keys(p, [1, 2, 3, 4], 2048, 0)) == []


def test_three_requests_ssd_tier_takes_what_dram_demotes():
    """DRAM 1 page, SSD 4 pages, write-back. A = [1, 2, 3] cached, evicted by B = [7, 8, 9]: HBM evicts A's
    pages 2, 1, 0 (tail first); DRAM keeps the last one stored (page 0) and demotes pages 2 and 1 to SSD.
    C = [1, 2, 3, 4] loads page 0 from DRAM and pages 1, 2 from SSD: 512 DRAM tokens, 1,024 SSD tokens."""
    p = _policy(pool=3, tiers=(_tier(pages=1), _tier("ssd", pages=4, read=500.0, write=250.0, latency=100.0)))
    _cache_prompt(p, [1, 2, 3], 1536)
    _cache_prompt(p, [7, 8, 9], 1536)
    store = p.tier_store
    keys = tier_keys(p, [1, 2, 3, 4], 2048, 0)
    found = store.find(keys)
    assert [tier for _, tier in found] == [0, 1, 1]
    # DRAM: 1 page at 1,000 B/s = 1 s + 10 us; SSD: 2 pages at 500 B/s = 4 s + 100 us
    assert store.commit_load(found, len(keys)) == pytest.approx(1e6 + 10 + 4e6 + 100)
    assert store.stats[0]["hit_tokens"] == 512 and store.stats[1]["hit_tokens"] == 1024
    assert store.stats[0]["demotions"] == 2 and store.conservation_error() == 0


# ---- eviction policies -------------------------------------------------------------------------------------
def _branching(evict: str) -> PrefixCachingPolicy:
    """Pool 4. [1, 2, 5] cached (pages 0-2, page 2 under page 1 under page 0), released tail first; then page 1
    is made the least recently used entry (an access order in which the interior page is older than its child,
    as when its last use came first: tail-first release alone keeps children ahead of their parents)."""
    p = _policy(pool=4, evict=evict, region=4)
    _cache_prompt(p, [1, 2, 5], 1536)
    page1 = next(key for key in p.cache if key[0] == 1)
    p._unmapped.move_to_end(page1, last=False)
    return p


@pytest.mark.parametrize("evict, left", [
    ("lru", [0, 2]),          # vLLM: the LRU entry, page 1, although page 2 hangs under it (then unreachable)
    ("radix-leaf", [0, 1]),   # SGLang: only leaves: page 2, the one leaf
    ("page", [2]),            # page-aware: page 1 and its unmapped ancestor page 0 in the same 2 MiB region
])
def test_one_eviction_per_policy(evict, left):
    p = _branching(evict)
    assert sorted(k[0] for k in p.cache) == [0, 1, 2]
    p._evict(1)
    assert sorted(k[0] for k in p.cache) == left
    assert p.conservation_error() == 0


def test_radix_leaf_keeps_the_chain_reachable():
    """After one radix-leaf eviction, [1, 2, 5] still hits pages 0-1 (1,024 tokens); after an LRU eviction its
    hit is page 0 only (512 tokens): page 2 is cached but unreachable."""
    for evict, expected in (("radix-leaf", 1024), ("lru", 512)):
        p = _branching(evict)
        p._evict(1)
        assert p.admission_credit([1, 2, 5], 1536)[0] == expected


# ---- conservation (Hypothesis) -----------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(prompts=st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=4), min_size=1, max_size=12),
       evict=st.sampled_from(["lru", "radix-leaf", "page"]), write=st.sampled_from(["write-back", "write-through"]),
       dram=st.integers(0, 3), ssd=st.integers(0, 3))
def test_blocks_are_conserved_across_tiers(prompts, evict, write, dram, ssd):
    """Any sequence of cached prompts: HBM pages are conserved (free + mapped + cached == pool), each tier
    holds at most its capacity, inserted - removed == resident, and no key sits in two tiers below HBM."""
    tiers = tuple(t for t in (_tier(pages=dram), _tier("ssd", pages=ssd)) if t.capacity_bytes) or (_tier(pages=1),)
    p = _policy(pool=4, evict=evict, tiers=tiers, write=write, region=2)
    for ids in prompts:
        _cache_prompt(p, ids, 512 * len(ids))
        assert p.conservation_error() == 0
        assert p.tier_store.conservation_error() == 0
    assert len(p.tier_store.where) == sum(len(c) for c in p.tier_store.contents)


# ---- parsing, configuration, defaults ------------------------------------------------------------------------
def test_parse_kv_tier_defaults_and_keys():
    dram = parse_kv_tier("dram:64GiB")
    assert (dram.capacity_bytes, dram.read_bytes_per_s, dram.write_bytes_per_s) == (64 * 2**30, 55e9, 55e9)
    ssd = parse_kv_tier("ssd:2TB,read_bw=7GB/s,latency=80us")
    assert (ssd.read_bytes_per_s, ssd.write_bytes_per_s, ssd.latency_us) == (7e9, 6.6e9, 80.0)
    for bad in ("hbm:1GiB", "dram:lots", "dram:1GiB,speed=3", "ssd:1TB,bw=fast"):
        with pytest.raises(ValueError, match=f"^tier '{bad}': "):   # the core names the spec; the CLI its flag
            parse_kv_tier(bad)


def test_a_bad_kv_tier_names_the_flag_on_the_command_line(capsys):
    import cli
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["simulate", "--policy", "paged:prefix=on", "--kv-tier", "hbm:1GiB"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--kv-tier" in err and "unknown tier 'hbm'" in err


def test_profile_host_copy_replaces_only_default_dram_rates():
    tiers = (parse_kv_tier("dram:1GiB"), parse_kv_tier("ssd:1TB"))
    profile = {"host_copy": {"h2d_bytes_per_s": 52e9, "d2h_bytes_per_s": 50e9, "latency_us": 8.0}}
    dram, ssd = with_host_copy_profile(tiers, profile)
    assert (dram.read_bytes_per_s, dram.write_bytes_per_s, dram.latency_us) == (52e9, 50e9, 8.0)
    assert ssd == tiers[1]
    assert with_host_copy_profile((parse_kv_tier("dram:1GiB,bw=10GB/s"),), profile)[0].read_bytes_per_s == 10e9


def test_config_refuses_tiers_without_prefix_cache_and_misordered_tiers():
    with pytest.raises(ConfigError, match="prefix"):
        SimConfig(kv_tiers=(parse_kv_tier("dram:1GiB"),))
    with pytest.raises(ConfigError, match="dram before ssd"):
        SimConfig(prefix_caching=True, kv_tiers=(parse_kv_tier("ssd:1TB"), parse_kv_tier("dram:1GiB")))
    with pytest.raises(ConfigError, match="evict"):
        SimConfig(prefix_caching=True, prefix_evict="fifo")


# ---- the engine: a DRAM hit is loaded, charged and recorded ---------------------------------------------------
def _engine_run(load: str, util_pages: int = 3):
    """Llama-3-8B, 1,024-token pages (128 MiB of KV each), a vAttention pool of 3 page groups, DRAM 1 GiB at
    1 GB/s each way, write-through (asynchronous stores: only loads are charged). Request 0 = 2,048 prompt tokens
    [1..4] caches 2 pages (stored in DRAM); request 1 = 2,048 other tokens needs 3 pages and evicts them from
    HBM; request 2 repeats request 0's prompt."""
    cfg = SimConfig()
    util = (cfg.model_spec.weight_bytes() + util_pages * 64 * 2 * 1024 * 1024 + 1) / cfg.gpu_spec.hbm_bytes
    frame = trace([(0.0, 2048, 2), (1.0, 2048, 2), (2.0, 2048, 2)])
    frame["hash_ids"] = [[1, 2, 3, 4], [11, 12, 13, 14], [1, 2, 3, 4]]
    config = SimConfig(prefix_caching=True, memory_util_frac=util, admission_watermark_frac=0.0,
                       low_watermark_frac=0.0, eager_page_groups=0, sync_mapping=True, deferred_reclaim=False,
                       kv_tiers=(parse_kv_tier("dram:1GiB,bw=1GB/s,latency=0us"),), tier_load_policy=load,
                       tier_write_policy="write-through")
    sim = Simulator(config, frame, vmm=constant_vmm(), compute=ConstantCompute(1000.0))
    return sim, sim.run()


def test_engine_loads_a_dram_hit_and_records_it_per_request():
    """Request 2's prompt: HBM evicted both of request 0's pages into DRAM; page 0 (1,024 tokens) is loaded (the
    cap of 2,047 tokens allows one whole 1,024-token page: page 1 ends at the prompt's last token)."""
    sim, out = _engine_run("sync")
    req = out.requests_frame().set_index("request_id")
    assert req.loc[2, "dram_hit_tokens"] == 1024 and req.loc[2, "prefix_hit_tokens"] == 0
    assert out.counters["tier_dram_promotions"] == 1
    page_bytes = 1024 * sim.config.model_spec.kv_bytes_per_token()
    assert out.counters["tier_dram_bytes_read"] == page_bytes
    # the load is charged to the iteration that admits request 2: 128 MiB at 1 GB/s = 134,217.728 us
    assert out.iterations_frame()["swap_us"].max() == pytest.approx(page_bytes / 1e9 * 1e6)


def test_layerwise_load_hides_behind_compute_except_one_layer():
    """Layer-wise, the 134 ms load longer than the 1,000 us compute: 32 layers of l = load / 32 and c = 1000 / 32 us
    in a pipeline take l + c + 31 l = load + c, so the iteration adds load - 1,000 + 1,000 / 32 after its compute
    (less than the sync load: a layer-wise load is never slower than loading first)."""
    sim, out = _engine_run("layerwise")
    load_us = 1024 * sim.config.model_spec.kv_bytes_per_token() / 1e9 * 1e6
    exposed = out.iterations_frame()["swap_us"].max()
    assert exposed == pytest.approx(load_us - 1000.0 + 1000.0 / 32) and exposed < load_us


@pytest.mark.parametrize("load_us, compute_us", [(100.0, 3200.0), (3200.0, 100.0), (640.0, 640.0)])
def test_layerwise_exposed_time_is_a_pipeline_of_equal_layers(load_us, compute_us):
    """``take_exposed_us`` against the pipeline's makespan l + c + (L - 1) max(l, c), stepped layer by layer."""
    from sim.core.tier_charges import TierCharges
    layers = 32
    charges = TierCharges.__new__(TierCharges)
    charges.num_layers, charges.overlap_pending_us = layers, load_us
    loaded = done = 0.0
    for _ in range(layers):                 # layer i: its load after layer i - 1's, its compute after both
        loaded += load_us / layers
        done = max(done, loaded) + compute_us / layers
    assert charges.take_exposed_us(compute_us) == pytest.approx(done - compute_us)
    assert done - compute_us <= load_us


def test_auto_recomputes_when_the_link_is_slower():
    """With a 1 GB/s link the 134 ms load is slower than ConstantCompute's 1 ms iteration: auto recomputes."""
    _, out = _engine_run("auto")
    assert out.requests_frame().set_index("request_id").loc[2, "dram_hit_tokens"] == 0
    assert out.counters["tier_recomputed_tokens"] == 1024


# ---- occupancy over time (TierCharges.sample -> tiers.parquet) ----------------------------------------------
def _check_occupancy(sim, out) -> None:
    """The invariants of the occupancy table: time order, capacities, and the last row equal to the counters."""
    table = out.tier_occupancy
    times = table["time_us"]
    assert times and all(a <= b for a, b in zip(times, times[1:]))
    assert times[-1] <= sim.env.now
    assert max(table["hbm_pages"]) <= sim.config.pool_page_groups
    for tier, capacity in zip(sim.tiers.store.tiers, sim.tiers.store.capacity_pages):
        pages = table[f"{tier.kind}_pages"]
        assert max(pages) <= capacity
        assert pages[-1] == out.counters[f"tier_{tier.kind}_resident_pages"]
        assert table[f"{tier.kind}_bytes"] == [n * sim.tiers.store.page_bytes for n in pages]
    assert table["hbm_pages"][-1] == len(sim.policy.cache)
    rows = list(zip(*(table[c] for c in table if c != "time_us")))
    assert all(a != b for a, b in zip(rows, rows[1:]))          # a row only where something changed


def test_occupancy_follows_the_dram_tier_of_the_three_request_case():
    """Write-through (_engine_run): request 0's two computed pages reach DRAM when its prefill iteration ends,
    request 1's two more when its own does; DRAM (8 pages of 128 MiB in 1 GiB) never drops one."""
    sim, out = _engine_run("sync")
    _check_occupancy(sim, out)
    it = out.iterations_frame()
    table = out.tier_occupancy
    assert table["time_us"][0] == it["start_at_us"][0] + it["duration_us"][0]
    assert table["dram_pages"] == [2] + [4] * (len(table["dram_pages"]) - 1)
    assert table["dram_bytes"][0] == 2 * 1024 * sim.config.model_spec.kv_bytes_per_token()


@settings(max_examples=15, deadline=None)
@given(prompts=st.lists(st.tuples(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.integers(1, 3)),
                        min_size=1, max_size=5),
       write=st.sampled_from(["write-back", "write-through"]), load=st.sampled_from(["sync", "layerwise"]),
       dram_pages=st.integers(1, 3), ssd_pages=st.integers(0, 3))
def test_occupancy_is_ordered_bounded_and_ends_at_the_counters(prompts, write, load, dram_pages, ssd_pages):
    """Small traces of 1,024-token pages (Llama-3-8B, 128 MiB of KV each) over a pool of 3 page groups, with
    DRAM and SSD tiers of a few pages: every sample within the tiers' capacities, times non-decreasing, the
    last sample equal to the summary's resident pages."""
    page_bytes = 1024 * SimConfig().model_spec.kv_bytes_per_token()
    tiers = [parse_kv_tier(f"dram:{dram_pages * page_bytes}B,bw=10GB/s,latency=0us")]
    if ssd_pages:
        tiers.append(parse_kv_tier(f"ssd:{ssd_pages * page_bytes}B,bw=5GB/s,latency=0us"))
    cfg = SimConfig()
    util = (cfg.model_spec.weight_bytes() + 3 * 64 * 2 * 1024 * 1024 + 1) / cfg.gpu_spec.hbm_bytes
    frame = trace([(0.5 * i, 512 * len(ids), 2) for i, (ids, _) in enumerate(prompts)])
    frame["hash_ids"] = [[block * 10 + first for block in ids] for ids, first in prompts]
    config = SimConfig(prefix_caching=True, memory_util_frac=util, admission_watermark_frac=0.0,
                       low_watermark_frac=0.0, eager_page_groups=0, sync_mapping=True, deferred_reclaim=False,
                       kv_tiers=tuple(tiers), tier_load_policy=load, tier_write_policy=write)
    sim = Simulator(config, frame, vmm=constant_vmm(), compute=ConstantCompute(1000.0))
    out = sim.run()
    _check_occupancy(sim, out)


def test_the_h200_dram_tier_defaults_to_its_measured_host_copies():
    """Without a profile, an H200 run's DRAM tier at its defaults takes the host copies measured on the H200
    (profiles/h200.json ``host_copy``, catalogue ``host_copy_profile``); other GPUs keep the built-in PCIe Gen5
    figures, and a rate the user gave is kept."""
    import json

    from sim.core.runner import profile_config_overrides
    from sim.memory.tiers import parse_kv_tier
    from tests.conftest import REPO_ROOT
    measured = json.loads((REPO_ROOT / "profiles" / "h200.json").read_text())["host_copy"]
    h200 = profile_config_overrides(SimConfig(prefix_caching=True, kv_tiers=(parse_kv_tier("dram:8GiB"),)), None)
    dram = h200.kv_tiers[0]
    assert (dram.read_bytes_per_s, dram.write_bytes_per_s, dram.latency_us) == \
        (measured["h2d_bytes_per_s"], measured["d2h_bytes_per_s"], measured["latency_us"])
    a100 = profile_config_overrides(SimConfig(gpu="a100", prefix_caching=True,
                                              kv_tiers=(parse_kv_tier("dram:8GiB"),)), None)
    assert a100.kv_tiers[0].read_bytes_per_s == 55e9
    given = profile_config_overrides(SimConfig(prefix_caching=True, kv_tiers=(parse_kv_tier("dram:8GiB,bw=20GB/s"),)),
                                     None)
    assert given.kv_tiers[0].read_bytes_per_s == 20e9


def test_direction_rates_win_over_bw_whatever_the_order_and_extreme_rates_are_refused():
    from sim.memory.tiers import parse_kv_tier
    first, second = parse_kv_tier("dram:16GiB,read_bw=1GB/s,bw=5GB/s"), parse_kv_tier("dram:16GiB,bw=5GB/s,read_bw=1GB/s")
    assert (first.read_bytes_per_s, first.write_bytes_per_s) == (second.read_bytes_per_s, second.write_bytes_per_s) \
        == (1e9, 5e9)
    for spec, needle in (("dram:64GiB,bw=1e-300GB/s", "bw=1e-300GB/s: below 1 MB/s"),
                         ("dram:64GiB,bw=1B/s", "bw=1B/s: below 1 MB/s"),
                         ("dram:64GiB,latency=1e300s", "latency=1e300s: above 1 s")):
        with pytest.raises(ValueError, match="^tier '" + spec.replace("+", r"\+") + "': ") as error:
            parse_kv_tier(spec)
        assert needle in str(error.value)


def test_a_profile_fills_only_the_figures_a_tier_spec_leaves_out():
    """``dram:64GiB,latency=50us`` keeps the measured host-copy rates (it had switched them to the 55 GB/s default)."""
    from sim.memory.tiers import parse_kv_tier, with_host_copy_profile
    profile = {"host_copy": {"h2d_bytes_per_s": 54.79e9, "d2h_bytes_per_s": 54.48e9, "latency_us": 19.3}}
    (latency_only,) = with_host_copy_profile([parse_kv_tier("dram:64GiB,latency=50us")], profile)
    assert (latency_only.read_bytes_per_s, latency_only.write_bytes_per_s, latency_only.latency_us) == (54.79e9, 54.48e9, 50.0)
    assert "user-given latency" in latency_only.source and "from the profile host_copy" in latency_only.source
    (read_only,) = with_host_copy_profile([parse_kv_tier("dram:64GiB,read_bw=10GB/s")], profile)
    assert (read_only.read_bytes_per_s, read_only.write_bytes_per_s, read_only.latency_us) == (10e9, 54.48e9, 19.3)
    (untouched,) = with_host_copy_profile([parse_kv_tier("dram:64GiB,bw=10GB/s,latency=5us")], profile)
    assert (untouched.read_bytes_per_s, untouched.write_bytes_per_s, untouched.latency_us, untouched.source) == \
        (10e9, 10e9, 5.0, "user-given")
    (default,) = with_host_copy_profile([parse_kv_tier("dram:64GiB")], profile)
    assert (default.read_bytes_per_s, default.latency_us) == (54.79e9, 19.3) and default.source.startswith("profile")


def test_the_comparison_table_shows_the_tiers_figures_only_when_a_run_has_tiers():
    from analysis.comparison import comparison_table
    tiered = {"finished": 3, "tier_dram_hit_ratio": 0.25, "tier_dram_bytes_read": 2 * 2**30,
              "tier_dram_bytes_written": 2**30, "tier_dram_read_ms": 4.5, "tier_recomputed_tokens": 7}
    table = comparison_table({"a": tiered, "b": {"finished": 3}})
    assert table.loc["a", "DRAM hit ratio"] == 0.25 and table.loc["a", "read from DRAM (GiB)"] == 2.0
    assert table.loc["a", "written to DRAM (GiB)"] == 1.0 and table.loc["a", "tier hits recomputed (tokens)"] == 7
    assert "SSD hit ratio" not in table and "DRAM hit ratio" not in comparison_table({"b": {"finished": 3}})
