"""CPU tests of the tensor-parallel executor (hwbackend.vmm.tp) over several emulated drivers, one per worker:
two-phase apply, faults injected on one worker only, background ops, teardown, consistency invariant,
timing report. No GPU, torch or cuda-python needed."""
from __future__ import annotations

import threading
import time

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from hwbackend.vmm.driver import VmmError
from hwbackend.vmm.emulated import CompletedEvent, EmulatedVmmDriver
from hwbackend.vmm.executor import BackgroundMappingError, _snapshot, policy_config_for
from hwbackend.vmm.kvcache import KVCacheLayout
from hwbackend.vmm.tp import TPExecutor, TPStepError, TPStepTiming, make_tp_caches, timing_report
from hwbackend.vmm.tp_worker import TPWorker
from sim.memory.vattention import VAttentionPolicy

MIB = 1 << 20
G = 2 * MIB
NO_LEAK = {"reservations": 0, "handles": 0, "mappings": 0}
TOKENS_PER_PAGE = 1024  # 2 MiB / (8 heads * 128 * 2 B)


class FaultyDriver(EmulatedVmmDriver):
    """Emulated driver whose pending injected faults can be dropped (so teardown never trips on one)."""

    def clear_faults(self) -> None:
        self._faults.clear()

    def pending_faults(self) -> int:
        return sum(len(by_index) for by_index in self._faults.values())


def small_layout(num_sub_tensors: int = 8, num_slots: int = 4, max_pages: int = 8) -> KVCacheLayout:
    return KVCacheLayout(num_sub_tensors=num_sub_tensors, num_slots=num_slots, max_pages_per_slot=max_pages,
                         page_size_bytes=G)


def make_tp(tp: int = 2, pool: int = 16, background: bool = True, layout: KVCacheLayout | None = None,
            delay_us: list[dict] | None = None, **knobs) -> tuple[TPExecutor, list[FaultyDriver]]:
    drivers = [FaultyDriver(capacity_bytes=1 << 36, delay_us=(delay_us or [{}] * tp)[r], device_ordinal=r)
               for r in range(tp)]
    caches = make_tp_caches(drivers, layout or small_layout(), pool)
    policy = VAttentionPolicy(policy_config_for(caches[0], **knobs))
    return TPExecutor(policy, caches, background=background), drivers


def worker_state(ex: TPExecutor, drivers: list[FaultyDriver]) -> list[tuple]:
    """Per worker: mapped (slot, page) pairs, the free-handle list in order, live driver objects."""
    return [(list(w.cache.iter_mapped()), list(w.cache._free_handles), d.live_objects())
            for w, d in zip(ex.workers, drivers)]


def full_state(ex: TPExecutor, drivers: list[FaultyDriver]) -> tuple:
    return _snapshot(ex.policy), worker_state(ex, drivers)


def assert_no_leaks(ex: TPExecutor, drivers: list[FaultyDriver]) -> None:
    assert [d.live_objects() for d in drivers] == [NO_LEAK] * len(drivers)
    assert not any(t.name.startswith("tp-worker") for t in threading.enumerate())
    assert ex._thread is None or not ex._thread.is_alive()


# ---- two-phase foreground ----------------------------------------------------------------------------
def test_every_worker_maps_the_same_pages_in_its_own_thread_and_reservations():
    ex, drivers = make_tp(tp=3, background=False)
    callers: list[set[str]] = [set() for _ in drivers]
    for rank, drv in enumerate(drivers):
        original = drv.map
        drv.map = lambda *a, _o=original, _c=callers[rank]: (_c.add(threading.current_thread().name), _o(*a))[1]
    with ex:
        slot = ex.alloc_slot(100)
        assert ex.step({slot: 3 * TOKENS_PER_PAGE + 1})
        assert ex.group.worker_mappings() == [[(slot, p) for p in range(4)]] * 3
        assert callers == [{f"tp-worker-{r}_0"} for r in range(3)]
        assert all(d.live_objects()["reservations"] == 8 for d in drivers)  # each worker its own ranges
        assert all(d.stats.count("cuCtxSetCurrent") == 1 for d in drivers)
        ex.check_consistent()
    assert_no_leaks(ex, drivers)


def test_map_failing_on_worker_1_at_the_40th_page_rolls_back_every_worker_and_the_policy():
    ex, drivers = make_tp(tp=3, pool=4, layout=small_layout(num_sub_tensors=64, num_slots=2), background=False)
    with ex:
        slot = ex.alloc_slot(100)
        assert ex.step({slot: 100})
        before = full_state(ex, drivers)
        maps_before = [d.stats.count("cuMemMap") for d in drivers]
        drivers[1].inject_fault("cuMemMap", nth=40)
        with pytest.raises(TPStepError, match="failed on worker 1 of 3") as info:
            ex.step({slot: 2 * TOKENS_PER_PAGE})
        assert set(info.value.worker_errors) == {1} and info.value.kind == "foreground"
        assert isinstance(info.value.__cause__, VmmError) and "OUT_OF_MEMORY" in str(info.value)
        assert full_state(ex, drivers) == before  # mappings, pools (handle order too), policy
        assert [d.stats.count("cuMemMap") - m for d, m in zip(drivers, maps_before)] == [64, 40, 64]
        assert not any(drivers[r].is_accessible(ex.workers[r].cache.page_va(0, slot, 1), G) for r in range(3))
        assert ex.step({slot: 2 * TOKENS_PER_PAGE})  # the fault is gone: the step now goes through
        ex.check_consistent()
    assert_no_leaks(ex, drivers)


def test_failures_on_two_workers_are_both_named():
    ex, drivers = make_tp(tp=3, background=False)
    with ex:
        slot = ex.alloc_slot(100)
        drivers[0].inject_fault("cuMemSetAccess", nth=2)
        drivers[2].inject_fault("cuMemMap", nth=5)
        with pytest.raises(TPStepError, match="worker 0, 2 of 3") as info:
            ex.step({slot: 100})
        assert set(info.value.worker_errors) == {0, 2}
        ex.check_consistent()
    assert_no_leaks(ex, drivers)


def test_unmap_failure_on_one_worker_when_freeing_restores_every_worker():
    ex, drivers = make_tp(background=False, deferred_reclaim=False)
    with ex:
        slot = ex.alloc_slot(100)
        ex.step({slot: 2 * TOKENS_PER_PAGE})
        ex.iteration_launched(0)
        before = full_state(ex, drivers)
        drivers[0].inject_fault("cuMemUnmap", nth=11)
        with pytest.raises(TPStepError, match="worker 0 of 2"):
            ex.free_slot(slot, last_read_iteration=0)
        assert full_state(ex, drivers) == before and ex.policy.active[slot]
        ex.free_slot(slot, last_read_iteration=0)
        assert ex.group.worker_mappings() == [[], []]
        ex.check_consistent()
    assert_no_leaks(ex, drivers)


def test_pool_short_returns_false_and_touches_no_worker():
    ex, drivers = make_tp(pool=4, background=False)
    with ex:
        slot = ex.alloc_slot(100)
        before = full_state(ex, drivers)
        assert not ex.step({slot: 5 * TOKENS_PER_PAGE})
        assert full_state(ex, drivers) == before and ex.timings == []
    assert_no_leaks(ex, drivers)


def test_a_failing_undo_is_named_on_the_error():
    """Double failure (corrupted-state tier): worker 0 fails, worker 1's rollback fails too."""
    ex, drivers = make_tp(background=False)
    ex.open()
    slot = ex.alloc_slot(100)
    drivers[0].inject_fault("cuMemMap", nth=5)
    drivers[1].inject_fault("cuMemUnmap", nth=1)
    with pytest.raises(TPStepError, match="worker 0 of 2") as info:
        ex.step({slot: 100})
    assert any(note.startswith("worker 1: rollback step failed too") for note in info.value.__notes__)
    with pytest.raises(VmmError):  # worker 1 lost track of a mapping: teardown reports it
        ex.close()
    assert not any(t.name.startswith("tp-worker") for t in threading.enumerate())


# ---- background --------------------------------------------------------------------------------------
def test_background_op_failing_on_one_worker_is_cancelled_everywhere_and_raised_next():
    ex, drivers = make_tp(eager_idle_slots=0)
    with ex:
        slot = ex.alloc_slot(100)
        ex.step({slot: 100})
        drivers[1].inject_fault("cuMemMap", nth=8 + 3)  # 2nd background page group, 3rd sub-tensor
        assert ex.map_ahead({slot: 4 * TOKENS_PER_PAGE}) == 3
        ex.wait_background()
        with pytest.raises(BackgroundMappingError) as info:
            ex.step({slot: 4 * TOKENS_PER_PAGE})
        cause = info.value.__cause__
        assert isinstance(cause, TPStepError) and set(cause.worker_errors) == {1} and cause.kind == "background"
        assert ex.group.worker_mappings() == [[(slot, 0), (slot, 1)]] * 2  # only the 1st op is done, on both
        ex.check_consistent()
        assert not any(ex.policy.in_flight_maps)
        assert ex.step({slot: 4 * TOKENS_PER_PAGE})
        ex.check_consistent()
        kinds = [t.kind for t in ex.timings]
        assert kinds == ["foreground", "background", "foreground"]
    assert_no_leaks(ex, drivers)


def test_background_op_counts_as_done_only_once_every_worker_did_it():
    ex, drivers = make_tp(eager_idle_slots=0, delay_us=[{}, {"cuMemSetAccess": 3000}])
    committed_while_mapping = []
    original = ex.policy.commit

    def commit(op):
        committed_while_mapping.append([len(w.cache.mapped_pages(op.slot)) for w in ex.workers])
        original(op)

    ex.policy.commit = commit
    with ex:
        slot = ex.alloc_slot(100)
        ex.step({slot: 100})
        ex.map_ahead({slot: 3 * TOKENS_PER_PAGE})
        ex.wait_background()
        assert committed_while_mapping == [[2, 2], [3, 3]]  # the slow worker had mapped too
    assert_no_leaks(ex, drivers)


# ---- teardown ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("error", [KeyboardInterrupt, ValueError])
def test_teardown_on_interrupt_or_error_closes_every_worker(error):
    ex, drivers = make_tp(tp=3)
    with pytest.raises(error):
        with ex:
            slot = ex.alloc_slot(100)
            ex.step({slot: 2 * TOKENS_PER_PAGE})
            ex.map_ahead({slot: 6 * TOKENS_PER_PAGE})
            raise error()
    assert_no_leaks(ex, drivers)


def test_interrupt_inside_one_worker_mid_step_rolls_back_and_tears_down():
    ex, drivers = make_tp(background=False)
    calls = {"n": 0}
    original = drivers[1].map

    def interrupted_map(*args):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return original(*args)

    with pytest.raises(KeyboardInterrupt):
        with ex:
            slot = ex.alloc_slot(100)
            ex.step({slot: 100})
            drivers[1].map = interrupted_map
            ex.step({slot: 2 * TOKENS_PER_PAGE})
    assert_no_leaks(ex, drivers)


def test_open_failing_on_one_worker_leaves_nothing_on_any():
    drivers = [FaultyDriver(capacity_bytes=1 << 36), FaultyDriver(capacity_bytes=10 * G)]  # pool needs 32 G
    caches = make_tp_caches(drivers, small_layout(), 4)
    ex = TPExecutor(VAttentionPolicy(policy_config_for(caches[0])), caches)
    with pytest.raises(TPStepError, match="open plan failed on worker 1 of 2"):
        with ex:
            pass
    assert_no_leaks(ex, drivers)


def test_mismatched_worker_caches_are_refused():
    drivers = [FaultyDriver(), FaultyDriver()]
    caches = make_tp_caches(drivers[:1], small_layout(), 4) + make_tp_caches(drivers[1:], small_layout(num_slots=2), 4)
    with pytest.raises(ValueError, match="worker 1's cache"):
        TPExecutor(VAttentionPolicy(policy_config_for(caches[0])), caches)
    assert not any(t.name.startswith("tp-worker") for t in threading.enumerate())


# ---- timing ------------------------------------------------------------------------------------------
def test_timing_report_has_per_worker_and_critical_path_times():
    slow_us = 2000.0
    ex, drivers = make_tp(tp=3, background=False, delay_us=[{}, {}, {"cuMemSetAccess": slow_us}])
    with ex:
        slot = ex.alloc_slot(100)
        for pages in (1, 2, 3):
            assert ex.step({slot: pages * TOKENS_PER_PAGE})
        report = ex.timing_report()
    assert report["num_workers"] == 3 and report["num_plans"] == 3 and report["kind"] == "foreground"
    assert [w["rank"] for w in report["per_worker"]] == [0, 1, 2]
    assert set(report["critical_path"]) == {"total_us", "mean_us", "p50_us", "max_us"}
    for timing in ex.timings:
        assert isinstance(timing, TPStepTiming) and len(timing.worker_mapping_us) == 3
        assert timing.critical_path_us == timing.worker_mapping_us[2] >= 8 * slow_us  # 8 set-access calls
        assert timing.wall_us >= timing.critical_path_us and timing.page_groups_mapped == 1
    assert report["critical_path"]["total_us"] == pytest.approx(report["per_worker"][2]["total_us"])
    assert report["critical_path_over_mean_worker"] > 2.0
    record = ex.timings[0].as_record()
    assert {"worker_0_mapping_us", "worker_2_mapping_us", "critical_path_us", "wall_us"} <= set(record)
    assert timing_report([], 2)["per_worker"][1]["total_us"] == 0.0


def test_workers_map_concurrently():
    delay = [{"cuMemMap": 1000.0}] * 4
    ex, drivers = make_tp(tp=4, background=False, delay_us=delay)
    with ex:
        slot = ex.alloc_slot(100)
        start = time.perf_counter()
        assert ex.step({slot: 100})  # 8 maps of 1 ms on each worker
        elapsed_us = (time.perf_counter() - start) * 1e6
    timing = ex.timings[0]
    assert elapsed_us < 0.6 * sum(timing.worker_mapping_us)  # serial would be the sum (4 x >= 8 ms)
    assert_no_leaks(ex, drivers)


# ---- consistency invariant ---------------------------------------------------------------------------
ACTIONS = st.lists(st.tuples(st.sampled_from(["admit", "grow", "free", "ahead", "fault"]),
                             st.integers(0, 3), st.integers(1, 8 * TOKENS_PER_PAGE)), max_size=30)
FAULTS = st.tuples(st.integers(0, 2), st.sampled_from(["cuMemMap", "cuMemSetAccess", "cuMemUnmap"]),
                   st.integers(1, 12))


@settings(max_examples=300, deadline=None)
@given(ACTIONS, st.booleans(), st.lists(FAULTS, min_size=1, max_size=6))
@example([("admit", 0, 100), ("fault", 0, 1), ("grow", 0, 3000)], True, [(1, "cuMemMap", 5)])
@example([("admit", 0, 100), ("grow", 0, 100), ("fault", 0, 1), ("ahead", 1, 4000), ("grow", 0, 4000)], True,
         [(2, "cuMemSetAccess", 2)])  # a background op fails on worker 2
@example([("admit", 0, 100), ("grow", 0, 3000), ("fault", 0, 1), ("free", 0, 1)], False,
         [(0, "cuMemUnmap", 3)])  # freeing without deferred reclamation fails on worker 0
@example([("fault", 0, 1), ("ahead", 1, 1), ("ahead", 0, 1)], False, [(0, "cuMemMap", 1)])  # found on the H200
def test_random_workloads_keep_every_worker_in_step_with_the_policy(actions, deferred, faults):
    ex, drivers = make_tp(tp=3, pool=12, deferred_reclaim=deferred)
    lengths: dict[int, int] = {}
    faults = list(faults)
    with ex:
        for iteration, (kind, pick, tokens) in enumerate(actions):
            if kind == "fault" and faults and not any(d.pending_faults() for d in drivers):
                rank, call, nth = faults.pop()  # one fault pending at a time: a second one could hit an undo
                drivers[rank].inject_fault(call, nth)
            run_action(ex, drivers, lengths, kind, pick, tokens, iteration)
            ex.iteration_launched(iteration, CompletedEvent())
        ex.check_consistent()
        for drv in drivers:
            drv.clear_faults()
    assert_no_leaks(ex, drivers)


def run_action(ex: TPExecutor, drivers: list[FaultyDriver], lengths: dict[int, int], kind: str, pick: int,
               tokens: int, iteration: int) -> None:
    """One scheduler action; a failed one must leave every worker and the policy exactly as before."""
    active = sorted(lengths)
    if kind == "admit":
        slot = ex.alloc_slot(tokens)
        if slot is not None:
            lengths[slot] = tokens
        return
    if kind == "ahead":
        try:  # map_ahead reports an earlier background failure, as every foreground call does
            ex.map_ahead({s: min(n + tokens, 8 * TOKENS_PER_PAGE) for s, n in lengths.items()})
        except BackgroundMappingError:
            event("background op rolled back on every worker")
        if pick % 2:  # let the mapper finish; otherwise the next foreground call races it
            ex.wait_background()
        return
    if kind not in ("grow", "free") or not active:
        return
    slot = active[pick % len(active)]
    try:
        ex._drain_background()
    except BackgroundMappingError:
        event("background op rolled back on every worker")
    ex.check_consistent()
    before = full_state(ex, drivers)
    try:
        if kind == "grow" and ex.step({slot: max(tokens, lengths[slot])}):
            lengths[slot] = max(tokens, lengths[slot])
        elif kind == "free":
            ex.free_slot(slot, last_read_iteration=iteration - 1)
            del lengths[slot]
    except TPStepError as error:
        event(f"{kind} rolled back on every worker")
        assert full_state(ex, drivers) == before, error
    ex.check_consistent()
