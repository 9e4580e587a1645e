"""Known behaviour of the memory policies, each with the argument for why the expected value is right."""
import math

import numpy as np
import pytest

from sim.frontend.policy_spec import parse_policy
from sim.setup.config import ConfigError, SimConfig
from sim.core.engine import Simulator
from sim.units import KIB, MIB
from tests.helpers import ConstantCompute, constant_vmm, trace


def run(rows, compute_us=1000.0, vmm=None, **config):
    cfg = SimConfig(**config)
    out = Simulator(cfg, trace(rows), vmm=vmm or constant_vmm(), compute=ConstantCompute(compute_us)).run()
    return out, out.requests_frame(), out.iterations_frame()


def _util_for_tokens(tokens: int) -> float:
    """memory_util giving a KV budget of exactly ``tokens`` tokens of Llama-3-8B (128 KiB each) + 1 byte."""
    cfg = SimConfig()
    return (cfg.model_spec.weight_bytes() + tokens * 131072 + 1) / cfg.gpu_spec.hbm_bytes


def test_static_admits_fewer_concurrent_requests_than_paged_or_vattention():
    """Budget 16,384 tokens; 40 requests of 100 + 200 tokens arriving together. Static reserves the
    8,192-token slot length per request -> 16,384 / 8,192 = 2 run at once. Paged needs 300/16 -> 19 blocks
    each (16,384/16 = 1,024 blocks -> 53 fit, capped by 40 requests); vAttention at 64 KiB pages holds 32
    tokens per page -> 10 page groups each, 512 groups -> 51 fit (eager pre-mapping aside)."""
    rows = [(0.0, 100, 200)] * 40
    util = _util_for_tokens(16384)
    _, _, static = run(rows, policy="static", memory_util_frac=util)
    _, _, paged = run(rows, policy="paged", memory_util_frac=util)
    _, _, vatt = run(rows, policy="vattention", page_size_bytes=64 * KIB, memory_util_frac=util)
    assert static["batch_size"].max() == 2
    assert paged["batch_size"].max() == 40
    assert vatt["batch_size"].max() == 40


def test_sync_mapping_page_crossings_cost_groups_times_map_plus_set_access():
    """Constant calls: cuMemMap 10 us + cuMemSetAccess 40 us; Llama-3-8B has 64 sub-tensors, so a page group
    costs 64 x 50 = 3,200 us. With 64 KiB pages (32 tokens), a decode crossing into a new page maps exactly
    one group: those iterations are 3,200 us slower than the others (1,000 us compute)."""
    _, _, it = run([(0.0, 32, 200)], page_size_bytes=64 * KIB, sync_mapping=True)
    crossing = it[it["sync_map_page_groups"] == 1].iloc[1:]      # skip the prefill's own map
    plain = it[it["sync_map_page_groups"] == 0]
    assert len(crossing) == math.ceil((32 + 200 - 1) / 32) - 1
    assert (crossing["duration_us"] == 1000.0 + 3200.0).all()
    assert (plain["duration_us"] == 1000.0).all()


def test_async_mapping_hides_stalls_while_compute_exceeds_mapping_time():
    """Same request, asynchronous mapper, 9-step look-ahead. With 5,000 us of compute per iteration a page
    group (3,200 us) is mapped within one iteration, long before the crossing: no stall after the prefill.
    With 100 us of compute the mapper needs 32 iterations per group but gets only 9 steps of warning:
    stalls return."""
    _, _, slow = run([(0.0, 32, 200)], compute_us=5000.0, page_size_bytes=64 * KIB, eager_idle_slots=0)
    _, _, fast = run([(0.0, 32, 200)], compute_us=100.0, page_size_bytes=64 * KIB, eager_idle_slots=0)
    assert slow["sync_stall_us"].iloc[1:].sum() == 0.0
    assert fast["sync_stall_us"].iloc[1:].sum() > 0.0


def test_smaller_pages_less_tail_waste_more_map_operations():
    rng = np.random.default_rng(1)
    rows = [(i * 0.02, int(p), int(o)) for i, (p, o) in enumerate(zip(rng.integers(50, 3000, 50), rng.integers(10, 300, 50)))]
    results = {}
    for page in (64 * KIB, 256 * KIB, 2 * MIB):
        out, _, it = run(rows, page_size_bytes=page, sync_mapping=True)
        results[page] = (it["tail_waste_bytes"].mean(), out.counters["sync_map_page_groups"])
    waste = [results[p][0] for p in (64 * KIB, 256 * KIB, 2 * MIB)]
    maps = [results[p][1] for p in (64 * KIB, 256 * KIB, 2 * MIB)]
    assert waste[0] < waste[1] < waste[2]
    assert maps[0] > maps[1] > maps[2]


@pytest.mark.parametrize("policy", ["vattention", "paged", "static"])
def test_too_small_budget_preempts_and_never_hangs(policy):
    """A budget of 3,000 tokens and 30 requests of up to 2,000 KV tokens: the run ends (finished or
    rejected, none left over), with preemptions, in a bounded number of iterations."""
    rng = np.random.default_rng(5)
    rows = [(i * 0.001, int(p), int(o)) for i, (p, o) in enumerate(zip(rng.integers(200, 1200, 30), rng.integers(50, 800, 30)))]
    kwargs = dict(policy=policy, memory_util_frac=_util_for_tokens(3000), sync_mapping=True)
    if policy == "vattention":
        kwargs["page_size_bytes"] = 64 * KIB
    if policy == "static":
        kwargs["max_len_tokens"] = 2048
    out, req, it = run(rows, **kwargs)
    assert set(req["status"]) <= {"finished", "rejected"} and len(req) == 30
    assert (req["status"] == "finished").sum() >= 1
    total_tokens = int((req["prompt_tokens"] + req["output_tokens"]).sum())
    assert len(it) < 10 * total_tokens          # bounded: no livelock
    if policy != "static":
        assert req["preemptions"].sum() > 0


def test_swap_preemption_records_bytes_and_pcie_time():
    """Three requests of 1,024-token prompts on a 4-group pool (2 MiB pages: 1,024 tokens each), token budget
    1,024: r0 prefills alone, r1 and then r2 are admitted chunk by chunk while r0 decodes, until the decodes
    need a new group with none free and the most recently admitted request, holding a computed prefill
    chunk, is swapped out. By hand: it0 r0 prefill 1024 (1 group); it1 r0 decode + r1 chunk 1023 (r0 needs
    group 2); it2 r0 decode + r1's last token + r2 chunk 1022 (r2 takes the last free group); it3 r1's decode
    needs a group: r2 (1,022 computed tokens) is swapped out: 1,022 x 128 KiB = 133,955,584 B, moved out and
    back at the H200's PCIe 5.0 x16 rate (64 GB/s): 2 x 2,093.056 us."""
    cfg = SimConfig()
    util = (cfg.model_spec.weight_bytes() + 4 * 64 * 2 * MIB + 1) / cfg.gpu_spec.hbm_bytes
    out, req, it = run([(0.0, 1024, 1024)] * 3, memory_util_frac=util, admission_watermark_frac=0.0,
                       sync_mapping=True, preemption="swap", token_budget=1024)
    assert (req["status"] == "finished").all()
    assert out.counters["swap_out_bytes"] == out.counters["swap_in_bytes"] == 1022 * 131072
    assert list(req["preemptions"]) == [0, 0, 1]
    assert out.counters["swap_total_us"] == pytest.approx(2 * 2093.056)
    assert it["swap_us"].sum() == pytest.approx(out.counters["swap_total_us"])


def test_swap_falls_back_to_recompute_without_host_memory():
    cfg = SimConfig()
    util = (cfg.model_spec.weight_bytes() + 4 * 64 * 2 * MIB + 1) / cfg.gpu_spec.hbm_bytes
    out, req, _ = run([(0.0, 1024, 1024)] * 3, memory_util_frac=util, admission_watermark_frac=0.0,
                      sync_mapping=True, preemption="swap", host_swap_bytes=1024, token_budget=1024)
    assert out.counters["swap_out_bytes"] == 0 and req["preemptions"].sum() > 0


def test_create_on_demand_adds_cu_mem_create_to_each_map():
    """cuMemCreate is 20 us per page in the constant model: a page group created on demand costs
    64 x (10 + 40 + 20) = 4,480 us instead of 3,200 us."""
    _, _, pool = run([(0.0, 100, 2)], sync_mapping=True)
    _, _, demand = run([(0.0, 100, 2)], sync_mapping=True, create_on_demand=True)
    assert pool["sync_stall_us"].iloc[0] == 3200.0 and demand["sync_stall_us"].iloc[0] == 4480.0


def test_paged_block_table_cpu_time_and_no_vmm_calls():
    """Block-table CPU time = 50 us + 0.02 us x blocks in the batch: a 100-token prompt holds
    ceil(100/16) = 7 blocks at its prefill -> 50.14 us; the paged policy makes no VMM call."""
    out, _, it = run([(0.0, 100, 3)], policy="paged")
    assert it["block_table_us"].iloc[0] == pytest.approx(50.0 + 0.02 * 7)
    assert it["sync_stall_us"].sum() == 0.0
    assert it["duration_us"].iloc[0] == pytest.approx(1000.0 + 50.14)


def test_deferred_reclamation_off_unmaps_on_free():
    out_on, _, _ = run([(0.0, 100, 3), (0.01, 100, 3)], sync_mapping=True)
    out_off, _, _ = run([(0.0, 100, 3), (0.01, 100, 3)], sync_mapping=True, deferred_reclaim=False)
    # on: the second request reuses the first one's slot and page; off: it is unmapped and mapped again
    assert out_on.counters["sync_map_page_groups"] == 1 and out_on.counters["sync_unmap_page_groups"] == 0
    assert out_off.counters["sync_map_page_groups"] == 2 and out_off.counters["sync_unmap_page_groups"] == 2


@pytest.mark.parametrize("spec, message", [("vattention:page=3MiB", "power of two"), ("paged:page=2MiB", "valid keys"),
                                           ("lru", "unknown policy"), ("vattention:deferred=maybe", "on/off")])
def test_bad_policy_specs(spec, message):
    with pytest.raises(ConfigError, match=message):
        SimConfig().with_overrides(parse_policy(spec))


def test_a_bad_value_a_spec_set_is_named_by_the_spec(capsys):
    """``simulate --policy vattention:page=3MiB`` names the spec and its key, not the --page-size flag."""
    from cli import main

    for command in (["simulate", "--policy", "vattention:page=3MiB"],
                    ["compare", "--policy", "vattention:page=3MiB", "--policy", "paged"]):
        assert main(command + ["--num-requests", "5"]) == 2
        assert "policy 'vattention:page=3MiB': page=3145728 B: must be a power of two" in capsys.readouterr().err


@pytest.mark.parametrize("spec, named", [("vattention:watermark=2", "watermark=2.0: must lie in [0, 0.5)"),
                                         ("vattention:lookahead=-1", "lookahead=-1: must be >= 0"),
                                         ("vattention:eager_slots=-3", "eager_slots=-3: must be >= 0")])
def test_a_policy_knob_out_of_range_is_named_by_its_key(spec, named, capsys):
    """Watermark and eager-allocation values out of range are refused before any run, naming the spec and its
    key (they were refused only when the policy was built, in the policy's own words)."""
    from cli import main

    assert main(["simulate", "--num-requests", "5", "--quiet", "--policy", spec]) == 2
    assert f"policy '{spec}': {named}" in capsys.readouterr().err


def test_tensor_parallel_mapping_waits_for_the_slowest_worker():
    """TP=2: each worker draws its own latencies; every operation costs the slower worker's time, so the
    critical path is at least each worker's total and, with random latencies, strictly more than their
    mean. With constant latencies both workers take exactly the same time and nothing changes. (2 MiB pages:
    the measured stock calls are random; sub-2 MiB pages cost the modified driver's fixed time per page.)"""
    from sim.timing.latency import VmmLatencyModel
    rows = [(i * 0.01, 300 + 50 * i, 40) for i in range(20)]
    out, _, it = run(rows, vmm=VmmLatencyModel.builtin(), tp=2, page_size_bytes=2 * MIB, sync_mapping=True)
    workers, critical = out.counters["mapping_worker_us"], out.counters["mapping_critical_us"]
    assert len(workers) == 2 and workers[0] != workers[1]
    assert critical >= max(workers) and critical > sum(workers) / 2
    assert it["sync_stall_us"].sum() == pytest.approx(critical)     # sync mode: all mapping is on the critical path
    const, _, _ = run(rows, tp=2, page_size_bytes=64 * KIB, sync_mapping=True)
    assert const.counters["mapping_worker_us"][0] == const.counters["mapping_worker_us"][1] == const.counters["mapping_critical_us"]


def test_tensor_parallel_workers_are_slowed_by_the_measured_contention():
    """Profile vmm_tp.worker_scale (docs/tp2/README.md: 1.381 for two H200s, one process per GPU) multiplies
    every worker's drawn time at that TP degree: with the same generator seed, each plan costs exactly that
    factor more; TP=1 and degrees without a measurement are unchanged."""
    import numpy as np
    from sim.core.engine import VmmCost
    from sim.timing.latency import VmmLatencyModel
    from sim.memory.plan import MapOp, UnmapOp

    ops = [MapOp(0, 0, 1), MapOp(1, 0, 3), UnmapOp(0, 0, 1)]

    def costs(tp, scales):
        vmm = VmmLatencyModel.builtin()
        vmm.tp_worker_scale = scales
        cost = VmmCost(vmm, SimConfig(tp=tp), np.random.default_rng(7))
        return [cost.op_us(op) for op in ops * 50], cost

    plain, _ = costs(2, {})
    scaled, cost = costs(2, {2: 1.381})
    assert scaled == pytest.approx([1.381 * x for x in plain], rel=1e-12)
    assert cost.critical_us == pytest.approx(sum(scaled)) and max(cost.worker_us) <= cost.critical_us
    assert costs(1, {2: 1.381})[0] == costs(1, {})[0]
    assert costs(4, {2: 1.381})[0] == costs(4, {})[0]
    assert VmmLatencyModel.builtin().tp_worker_scale == {2: 1.381}  # the committed profile's vmm_tp


def test_a_paged_block_longer_than_the_slot_is_refused():
    """Helper-48: ``paged:block=100000`` ran against 8,192-token slots (16.8 GiB mean tail waste); a block may be
    as long as the slot (one block per request), never longer, as ``static:max_len`` is bounded by the slot."""
    import pytest

    from sim.setup.config import ConfigError, SimConfig
    assert SimConfig(policy="paged", block_size_tokens=8192).block_size_tokens == 8192
    with pytest.raises(ConfigError, match=r"block_size_tokens=8193 \(policy key block=\): must lie in \[1, 8192\] tokens"):
        SimConfig(policy="paged", block_size_tokens=8193)
    assert SimConfig(policy="vattention", block_size_tokens=100000).policy == "vattention"   # unused there
