"""CPU tests of the hardware backend against the emulated driver: strict driver semantics, transactions,
the KV cache and the executor running the simulator's own vAttention policy, with fault injection.
No GPU, torch or cuda-python needed."""
from __future__ import annotations

import threading

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hwbackend.vmm.driver import VmmError
from hwbackend.vmm.emulated import CompletedEvent, EmulatedVmmDriver
from hwbackend.vmm.executor import BackgroundMappingError, Executor, policy_config_for
from hwbackend.vmm.kvcache import KVCache, KVCacheLayout
from hwbackend.vmm.transaction import Transaction
from sim.memory.vattention import VAttentionPolicy
from sim.memory.plan import MapOp, Plan, UnmapOp

MIB = 1 << 20
G = 2 * MIB
NO_LEAK = {"reservations": 0, "handles": 0, "mappings": 0}
TOKENS_PER_PAGE = 1024  # 2 MiB / (8 heads * 128 * 2 B)


def small_layout(num_sub_tensors: int = 8, num_slots: int = 4, max_pages: int = 8) -> KVCacheLayout:
    return KVCacheLayout(num_sub_tensors=num_sub_tensors, num_slots=num_slots, max_pages_per_slot=max_pages,
                         page_size_bytes=G)


def make_executor(pool: int = 16, background: bool = True, layout: KVCacheLayout | None = None,
                  driver: EmulatedVmmDriver | None = None, **knobs) -> tuple[Executor, EmulatedVmmDriver]:
    driver = driver or EmulatedVmmDriver(capacity_bytes=1 << 36)
    cache = KVCache(driver, layout or small_layout(), pool_page_groups=pool)
    policy = VAttentionPolicy(policy_config_for(cache, **knobs))
    return Executor(policy, cache, background=background), driver


def snapshot_state(ex: Executor, driver: EmulatedVmmDriver) -> tuple:
    return (list(ex.policy.mapped), ex.policy.free_page_groups, sorted(ex.cache.iter_mapped()),
            ex.cache.num_free_page_groups, driver.live_objects())


def assert_consistent(ex: Executor) -> None:
    """Policy and cache agree page by page; the pool is conserved; nothing in flight."""
    assert ex.policy.conservation_error() == 0
    for slot in range(ex.cache.layout.num_slots):
        assert ex.cache.mapped_pages(slot) == list(range(ex.policy.mapped[slot]))
    assert ex.cache.num_free_page_groups == ex.policy.free_page_groups


def assert_tokens_accessible(ex: Executor, driver: EmulatedVmmDriver, slot: int, tokens: int) -> None:
    layout = ex.cache.layout
    last_page = (tokens - 1) // layout.tokens_per_page
    for t in range(layout.num_sub_tensors):
        assert driver.is_accessible(ex.cache.page_va(t, slot, 0), (last_page + 1) * G)


# ---- emulated driver: strict semantics -------------------------------------------------------------
def test_emulated_driver_rejects_every_misuse_with_a_named_rule():
    drv = EmulatedVmmDriver(capacity_bytes=4 * G)
    va = drv.reserve(4 * G)
    cases = [
        (lambda: drv.create(G + 1), "not a positive multiple"),
        (lambda: drv.map(va + 8 * G, G, drv.create(G)), "outside any reservation"),
        (lambda: drv.unmap(va, G), "not whole mappings"),
        (lambda: drv.set_access(va, G), "not fully mapped"),
    ]
    for call, detail in cases:
        with pytest.raises(VmmError, match=detail) as info:
            call()
        assert info.value.error_name == "CUDA_ERROR_INVALID_VALUE"
    handle = drv.create(G)
    drv.map(va, G, handle)
    with pytest.raises(VmmError, match="already mapped"):
        drv.map(va, G, drv.create(G))
    with pytest.raises(VmmError, match="still mapped"):
        drv.release(handle)
    with pytest.raises(VmmError, match="reservation still mapped"):
        drv.free_address(va, 4 * G)
    with pytest.raises(VmmError, match="physical capacity") as info:
        drv.create(2 * G)  # 3 handles of G exist, capacity 4 G
    assert info.value.error_name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert drv.stats.count("cuMemCreate") == 5 and drv.stats.count("cuMemMap") == 3


def test_unmap_must_cover_whole_mappings_and_may_span_several():
    drv = EmulatedVmmDriver()
    va = drv.reserve(4 * G)
    big, small = drv.create(2 * G), drv.create(G)
    drv.map(va, 2 * G, big)
    drv.map(va + 2 * G, G, small)
    with pytest.raises(VmmError):
        drv.unmap(va, G)  # half of a mapping
    drv.unmap(va, 3 * G)
    drv.release(big), drv.release(small), drv.free_address(va, 4 * G)
    assert drv.live_objects() == NO_LEAK


def test_fault_injection_fails_exactly_the_nth_call_from_now_and_changes_nothing():
    drv = EmulatedVmmDriver()
    drv.create(G)
    drv.inject_fault("cuMemCreate", nth=2, error_name="CUDA_ERROR_UNKNOWN")
    drv.create(G)
    with pytest.raises(VmmError, match="injected") as info:
        drv.create(G)
    assert info.value.error_name == "CUDA_ERROR_UNKNOWN" and info.value.call_args == (G,)
    assert drv.live_objects()["handles"] == 2
    drv.create(G)  # only the 3rd call failed
    assert drv.stats.count("cuMemCreate") == 4


def test_transaction_rolls_back_in_reverse_and_keeps_going_after_a_failed_undo():
    log = []

    def failing_undo():
        raise OSError("undo broke")

    with pytest.raises(ValueError) as info:
        with Transaction() as tx:
            tx.on_rollback(log.append, "first")
            tx.on_rollback(failing_undo)
            tx.on_rollback(log.append, "last")
            raise ValueError("step 4 failed")
    assert log == ["last", "first"]
    assert any("undo broke" in note for note in info.value.__notes__)
    with Transaction() as tx:
        tx.on_rollback(log.append, "never")
    assert log == ["last", "first"]


# ---- KV cache ----------------------------------------------------------------------------------------
def test_cache_open_and_close_leave_nothing():
    drv = EmulatedVmmDriver(capacity_bytes=1 << 34)
    with KVCache(drv, small_layout(), pool_page_groups=4) as cache:
        assert drv.live_objects() == {"reservations": 8, "handles": 32, "mappings": 0}
        cache.apply(Plan(maps=(MapOp(1, 0, 3),)))
        assert cache.mapped_pages(1) == [0, 1, 2] and cache.num_free_page_groups == 1
        assert drv.is_accessible(cache.page_va(7, 1, 0), 3 * G)
        assert not drv.is_accessible(cache.page_va(7, 1, 3), G)
    assert drv.live_objects() == NO_LEAK


def test_open_out_of_memory_midway_leaks_nothing():
    drv = EmulatedVmmDriver(capacity_bytes=20 * G)  # pool needs 8 * 4 = 32 handles
    with pytest.raises(VmmError, match="capacity"):
        KVCache(drv, small_layout(), pool_page_groups=4).open()
    assert drv.live_objects() == NO_LEAK


def test_map_failing_on_the_40th_page_leaves_pool_and_mappings_as_before():
    drv = EmulatedVmmDriver(capacity_bytes=1 << 36)
    layout = small_layout(num_sub_tensors=64, num_slots=2)
    with KVCache(drv, layout, pool_page_groups=4) as cache:
        cache.apply(Plan(maps=(MapOp(0, 0, 1),)))
        before = (sorted(cache.iter_mapped()), cache.num_free_page_groups, drv.live_objects())
        drv.inject_fault("cuMemMap", nth=40)
        with pytest.raises(VmmError, match="OUT_OF_MEMORY"):
            cache.apply(Plan(maps=(MapOp(1, 0, 1),)))
        assert (sorted(cache.iter_mapped()), cache.num_free_page_groups, drv.live_objects()) == before
        assert not drv.is_accessible(cache.page_va(0, 1, 0), G)
        cache.apply(Plan(maps=(MapOp(1, 0, 1),)))  # works once the fault is gone
    assert drv.live_objects() == NO_LEAK


def test_unmap_failing_midway_remaps_what_it_had_unmapped():
    drv = EmulatedVmmDriver(capacity_bytes=1 << 34)
    with KVCache(drv, small_layout(), pool_page_groups=4) as cache:
        cache.apply(Plan(maps=(MapOp(2, 0, 2),)))
        drv.inject_fault("cuMemUnmap", nth=11)  # 8 of page 0 done, 3rd of page 1 fails
        with pytest.raises(VmmError):
            cache.apply(Plan(unmaps=(UnmapOp(2, 0, 2),)))
        assert cache.mapped_pages(2) == [0, 1] and cache.num_free_page_groups == 2
        for t in range(8):
            assert drv.is_accessible(cache.page_va(t, 2, 0), 2 * G)
    assert drv.live_objects() == NO_LEAK


def test_create_on_demand_respects_the_budget_and_rolls_back_creates():
    drv = EmulatedVmmDriver(capacity_bytes=1 << 34)
    with KVCache(drv, small_layout(), pool_page_groups=2, create_on_demand=True) as cache:
        assert drv.live_objects()["handles"] == 0 and cache.num_free_page_groups == 2
        drv.inject_fault("cuMemCreate", nth=5)
        with pytest.raises(VmmError):
            cache.apply(Plan(maps=(MapOp(0, 0, 1),)))
        assert drv.live_objects()["handles"] == 0 and cache.num_handles == 0
        cache.apply(Plan(maps=(MapOp(0, 0, 2),)))
        with pytest.raises(RuntimeError, match="exhausted"):
            cache.apply(Plan(maps=(MapOp(1, 0, 1),)))
    assert drv.live_objects() == NO_LEAK


def test_plan_contradicting_the_cache_is_refused():
    drv = EmulatedVmmDriver(capacity_bytes=1 << 34)
    with KVCache(drv, small_layout(), pool_page_groups=4) as cache:
        cache.apply(Plan(maps=(MapOp(0, 0, 1),)))
        with pytest.raises(RuntimeError, match="already mapped"):
            cache.apply(Plan(maps=(MapOp(0, 0, 1),)))
        with pytest.raises(RuntimeError, match="not mapped"):
            cache.apply(Plan(unmaps=(UnmapOp(1, 0, 1),)))
        with pytest.raises(ValueError, match="outside the layout"):
            cache.apply(Plan(maps=(MapOp(9, 0, 1),)))
        assert cache.mapped_pages(0) == [0]
    assert drv.live_objects() == NO_LEAK


# ---- executor ----------------------------------------------------------------------------------------
def test_synchronous_step_maps_the_target_across_page_boundaries():
    ex, drv = make_executor(background=False)
    with ex:
        slot = ex.alloc_slot(100)
        assert ex.step({slot: 100})
        assert ex.cache.mapped_pages(slot) == [0]
        assert ex.step({slot: 3 * TOKENS_PER_PAGE + 1})  # chunked prefill: several pages at once
        assert ex.cache.mapped_pages(slot) == [0, 1, 2, 3]
        assert_tokens_accessible(ex, drv, slot, 3 * TOKENS_PER_PAGE + 1)
        assert_consistent(ex)
    assert drv.live_objects() == NO_LEAK


def test_step_returns_false_and_changes_nothing_when_the_pool_is_short():
    ex, drv = make_executor(pool=4, background=False)
    with ex:
        slot = ex.alloc_slot(100)
        before = snapshot_state(ex, drv)
        assert not ex.step({slot: 5 * TOKENS_PER_PAGE})
        assert snapshot_state(ex, drv) == before
    assert drv.live_objects() == NO_LEAK


def test_foreground_map_failure_restores_cache_and_policy():
    ex, drv = make_executor(background=False)
    with ex:
        slot = ex.alloc_slot(100)
        ex.step({slot: 100})
        before = snapshot_state(ex, drv)
        drv.inject_fault("cuMemMap", nth=13)
        with pytest.raises(VmmError):
            ex.step({slot: 3 * TOKENS_PER_PAGE})
        assert snapshot_state(ex, drv) == before
        assert_consistent(ex)
        assert ex.step({slot: 3 * TOKENS_PER_PAGE})
    assert drv.live_objects() == NO_LEAK


def test_unmap_failure_when_freeing_without_deferred_reclamation_restores_everything():
    ex, drv = make_executor(background=False, deferred_reclaim=False)
    with ex:
        slot = ex.alloc_slot(100)
        ex.step({slot: 2 * TOKENS_PER_PAGE})
        ex.iteration_launched(0)
        drv.inject_fault("cuMemUnmap", nth=5)
        with pytest.raises(VmmError):
            ex.free_slot(slot, last_read_iteration=0)
        assert ex.policy.active[slot] and ex.cache.mapped_pages(slot) == [0, 1]
        assert_consistent(ex)
        ex.free_slot(slot, last_read_iteration=0)
        assert ex.cache.mapped_pages(slot) == []
    assert drv.live_objects() == NO_LEAK


def test_background_mapper_maps_ahead_in_its_own_thread():
    ex, drv = make_executor(eager_idle_slots=0)
    threads = []
    original = drv.map
    drv.map = lambda *a: (threads.append(threading.current_thread().name), original(*a))[1]
    with ex:
        slot = ex.alloc_slot(100)
        ex.step({slot: 100})
        ex.iteration_launched(0)
        assert ex.map_ahead({slot: 3 * TOKENS_PER_PAGE}) == 2
        ex.wait_background()
        assert ex.cache.mapped_pages(slot) == [0, 1, 2] and set(threads) == {"MainThread", "kv-mapper"}
        ex.step({slot: 3 * TOKENS_PER_PAGE})
        assert ex.metrics["sync_page_groups"] == 1 and ex.metrics["background_page_groups"] == 2
        assert_consistent(ex)
    assert drv.live_objects() == NO_LEAK


def test_foreground_cancels_queued_background_ops_waits_and_maps_the_rest():
    driver = EmulatedVmmDriver(capacity_bytes=1 << 36, delay_us={"cuMemSetAccess": 2000})
    ex, drv = make_executor(pool=32, driver=driver, eager_idle_slots=0)
    with ex:
        slot = ex.alloc_slot(100)
        ex.step({slot: 100})
        ex.map_ahead({slot: 8 * TOKENS_PER_PAGE})  # 7 ops, ~16 ms each
        assert ex.step({slot: 8 * TOKENS_PER_PAGE})
        assert ex.metrics["cancelled_ops"] >= 5
        assert ex.cache.mapped_pages(slot) == list(range(8))
        assert_consistent(ex)
        assert not any(ex.policy.in_flight_maps)
    assert drv.live_objects() == NO_LEAK


def test_background_failure_is_rolled_back_and_raised_by_the_next_foreground_call():
    ex, drv = make_executor(eager_idle_slots=0)
    with ex:
        slot = ex.alloc_slot(100)
        ex.step({slot: 100})
        drv.inject_fault("cuMemMap", nth=8 + 3)  # 2nd background page group, 3rd sub-tensor
        assert ex.map_ahead({slot: 4 * TOKENS_PER_PAGE}) == 3
        ex.wait_background()
        with pytest.raises(BackgroundMappingError) as info:
            ex.step({slot: 4 * TOKENS_PER_PAGE})
        assert isinstance(info.value.__cause__, VmmError)
        assert ex.cache.mapped_pages(slot) == [0, 1]  # the first background op was committed
        assert_consistent(ex)
        assert ex.step({slot: 4 * TOKENS_PER_PAGE})
        assert_consistent(ex)
    assert drv.live_objects() == NO_LEAK


class PendingEvent:
    """An iteration event the test completes by hand."""

    def __init__(self) -> None:
        self.done = False
        self.synchronized = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.synchronized = self.done = True


def test_deferred_reclamation_reuses_a_slot_only_after_the_gpu_finished_with_it():
    ex, drv = make_executor(layout=small_layout(num_slots=1), background=False)
    with ex:
        slot = ex.alloc_slot(100)
        ex.step({slot: 2 * TOKENS_PER_PAGE})
        event = PendingEvent()
        ex.iteration_launched(0, event)
        ex.free_slot(slot, last_read_iteration=0)
        assert ex.cache.mapped_pages(slot) == [0, 1]  # deferred: still mapped
        assert ex.alloc_slot(100) is None  # the GPU may still read it
        event.done = True
        assert ex.alloc_slot(100) == slot
        maps_before = drv.stats.count("cuMemMap")
        assert ex.step({slot: 2 * TOKENS_PER_PAGE})
        assert drv.stats.count("cuMemMap") == maps_before  # reused the deferred pages
    assert drv.live_objects() == NO_LEAK


def test_unmapping_a_freed_slot_waits_for_its_last_iteration():
    ex, drv = make_executor(background=False, deferred_reclaim=False)
    with ex:
        slot = ex.alloc_slot(100)
        ex.step({slot: 100})
        event = PendingEvent()
        ex.iteration_launched(0, event)
        ex.free_slot(slot, last_read_iteration=0)
        assert event.synchronized and ex.cache.mapped_pages(slot) == []
    assert drv.live_objects() == NO_LEAK


def test_low_watermark_reclaims_idle_slots_in_the_background():
    ex, drv = make_executor(pool=20, layout=small_layout(num_slots=4, max_pages=16),
                            eager_idle_slots=0, low_watermark_frac=0.2)
    with ex:
        a, b = ex.alloc_slot(100), ex.alloc_slot(100)
        ex.step({a: 9 * TOKENS_PER_PAGE, b: 8 * TOKENS_PER_PAGE})
        ex.iteration_launched(0, CompletedEvent())
        ex.free_slot(b, last_read_iteration=0)  # deferred: 8 page groups stay on idle slot b
        assert ex.policy.free_page_groups == 3  # below the low watermark of 4
        assert ex.map_ahead({}) > 0
        ex.wait_background()
        assert ex.policy.free_page_groups >= 8  # back above twice the watermark
        assert len(ex.cache.mapped_pages(b)) < 8
        assert_consistent(ex)
    assert drv.live_objects() == NO_LEAK


@pytest.mark.parametrize("error", [KeyboardInterrupt, ValueError])
def test_teardown_on_interrupt_or_error_releases_everything(error):
    ex, drv = make_executor()
    with pytest.raises(error):
        with ex:
            slot = ex.alloc_slot(100)
            ex.step({slot: 2 * TOKENS_PER_PAGE})
            ex.map_ahead({slot: 6 * TOKENS_PER_PAGE})
            raise error()
    assert drv.live_objects() == NO_LEAK
    assert not ex._thread.is_alive()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "grow", "free", "ahead"]),
                          st.integers(0, 3), st.integers(1, 8 * TOKENS_PER_PAGE)), max_size=30),
       st.booleans())
@example([("admit", 0, 1), ("grow", 0, 1), ("ahead", 0, 1024), ("free", 0, 1)], False)  # freed while mapping ahead
def test_random_workloads_keep_policy_and_cache_in_agreement(actions, deferred):
    ex, drv = make_executor(pool=12, deferred_reclaim=deferred)
    lengths: dict[int, int] = {}
    with ex:
        for iteration, (kind, pick, tokens) in enumerate(actions):
            active = sorted(lengths)
            if kind == "admit":
                slot = ex.alloc_slot(tokens)
                if slot is not None:
                    lengths[slot] = tokens
            elif kind == "grow" and active:
                slot = active[pick % len(active)]
                if ex.step({slot: max(tokens, lengths[slot])}):
                    lengths[slot] = max(tokens, lengths[slot])
            elif kind == "free" and active:
                slot = active[pick % len(active)]
                ex.free_slot(slot, last_read_iteration=iteration - 1)
                del lengths[slot]
            elif kind == "ahead":
                ex.map_ahead({s: min(n + tokens, 8 * TOKENS_PER_PAGE) for s, n in lengths.items()})
            ex.iteration_launched(iteration, CompletedEvent())
        ex.wait_background()
        assert_consistent(ex)
    assert drv.live_objects() == NO_LEAK
