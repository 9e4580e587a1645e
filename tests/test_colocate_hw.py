"""Two tenants' KV caches served from one physical page pool on the emulated driver (hwbackend.vmm.shared_pool):
pages handed over with cuMemUnmap in one tenant's range and cuMemMap in the other's, ceilings, conservation,
nothing leaked; the executor runs each tenant's own vAttention policy on its cache."""
import pytest

from hwbackend.vmm.emulated import EmulatedVmmDriver
from hwbackend.vmm.executor import Executor, policy_config_for
from hwbackend.vmm.kvcache import KVCacheLayout
from hwbackend.vmm.shared_pool import SharedHandlePool, TenantKVCache
from sim.memory.plan import MapOp, Plan, UnmapOp
from sim.memory.vattention import VAttentionPolicy

G = 2 << 20
HELD_AFTER_FREE = 0   # deferred reclamation off: a freed slot is unmapped once its iteration completed
NO_LEAK = {"reservations": 0, "handles": 0, "mappings": 0}


def _layouts():
    # two model shapes: 8 and 6 sub-tensors (e.g. 4 and 3 layers), the same 2 MiB page
    return (KVCacheLayout(num_sub_tensors=8, num_slots=4, max_pages_per_slot=8, page_size_bytes=G),
            KVCacheLayout(num_sub_tensors=6, num_slots=4, max_pages_per_slot=8, page_size_bytes=G))


def test_pages_move_between_tenants_and_nothing_leaks():
    drv = EmulatedVmmDriver(capacity_bytes=1 << 36)
    pool = SharedHandlePool(drv, G, 48, [48, 48]).open()
    a_layout, b_layout = _layouts()
    with TenantKVCache(drv, a_layout, pool, 0) as a, TenantKVCache(drv, b_layout, pool, 1) as b:
        a.apply(Plan(maps=(MapOp(0, 0, 5),)))            # 5 groups x 8 = 40 handles
        assert pool.free_pages == 8 and b.num_free_page_groups == 1
        with pytest.raises(RuntimeError, match="exhausted"):
            b.apply(Plan(maps=(MapOp(0, 0, 2),)))       # 12 handles: no; rolled back
        assert pool.conservation_error() == 0 and pool.held_pages == [40, 0] and b.num_mapped_page_groups == 0
        a.apply(Plan(unmaps=(UnmapOp(0, 2, 3),)))        # cuMemUnmap in A's range: 24 handles back
        b.apply(Plan(maps=(MapOp(1, 0, 5),)))            # 30 handles cuMemMap'd into B's range
        assert pool.handed_over_pages == 24              # the free stack: A's 24 returned first, then 6 new
        assert drv.is_accessible(b.page_va(5, 1, 0), 5 * G)
        assert not drv.is_accessible(a.page_va(7, 0, 2), G)
        assert pool.conservation_error() == 0 and pool.free_pages == 2
    pool.close()
    assert drv.live_objects() == NO_LEAK


def test_ceiling_refuses_a_take():
    drv = EmulatedVmmDriver(capacity_bytes=1 << 36)
    pool = SharedHandlePool(drv, G, 48, [16, 48]).open()
    with TenantKVCache(drv, _layouts()[0], pool, 0) as a:
        a.apply(Plan(maps=(MapOp(0, 0, 2),)))
        with pytest.raises(RuntimeError, match="ceiling"):
            a.apply(Plan(maps=(MapOp(1, 0, 1),)))
        assert pool.held_pages[0] == 16 and pool.conservation_error() == 0
    pool.close()
    assert drv.live_objects() == NO_LEAK


def test_two_executors_with_their_own_policies_share_the_pool():
    drv = EmulatedVmmDriver(capacity_bytes=1 << 36)
    pool = SharedHandlePool(drv, G, 96, [96, 96]).open()
    a_layout, b_layout = _layouts()
    with TenantKVCache(drv, a_layout, pool, 0) as a_cache, TenantKVCache(drv, b_layout, pool, 1) as b_cache:
        # each policy sees only its share of the pool; the sum of its needs fits the shared handles
        a = Executor(VAttentionPolicy(policy_config_for(a_cache, deferred_reclaim=False)), a_cache, background=False)
        b = Executor(VAttentionPolicy(policy_config_for(b_cache, deferred_reclaim=False)), b_cache, background=False)
        slot_a = a.policy.alloc_slot(5000)
        assert a.step({slot_a: 5000})                     # 5 pages of 1024 tokens: 40 handles
        slot_b = b.policy.alloc_slot(6000)
        assert b.step({slot_b: 6000})                     # 6 pages: 36 handles
        assert pool.held_pages == [40, 36]
        a.iteration_launched(0)
        a.free_slot(slot_a, last_read_iteration=0)
        a.poll_completed()
        assert pool.held_pages[0] == HELD_AFTER_FREE
    pool.close()
    assert drv.live_objects() == NO_LEAK


def test_handover_script_dry_run_on_the_emulated_driver(capsys):
    from hwbackend.calibration.colocate_handover import main
    assert main(["--emulated", "--bursts", "1", "--burst-groups", "1"]) == 0
    # B maps 56 of A's 64 returned handles, then A maps those 56 back (and 8 of its own)
    assert '"handed_over_pages": 112' in capsys.readouterr().out
