"""CPU tests of the tensor-parallel replay's orchestration without torch (hwbackend.replay.tp): one scheduler
and one policy driving every rank's VMM executor through the two-phase TP executor, ranks 1.. behind a pipe
(a thread here, a spawned process in two tests) with emulated drivers; the compute of every rank recorded
(RecordingRunner) instead of run. Faults are injected on the remote worker's driver over its pipe."""
from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from hwbackend.replay.kv import layout_for
from hwbackend.replay.tp.cli import resolve_devices, unsupported_tp
from hwbackend.replay.tp.peers import decode_work, encode_work
from hwbackend.replay.tp.remote import RemoteTPExecutor, RemoteWorker, WorkerService
from hwbackend.replay.tp.replay import replay_tp
from hwbackend.replay.tp.rpc import Channel, PeerLostError, RemoteError, portable_error, serve
from hwbackend.replay.tp.session import PeerDriver, PeerSpec
from hwbackend.replay.model import SeqWork
from hwbackend.vmm.driver import VmmError
from hwbackend.vmm.emulated import CompletedEvent
from hwbackend.vmm.executor import BackgroundMappingError, _snapshot, policy_config_for
from hwbackend.vmm.kvcache import KVCache, KVCacheLayout
from hwbackend.vmm.tp import TPStepError
from hwbackend.vmm.tp_worker import TPWorker
from sim.setup.config import SimConfig
from sim.memory.vattention import VAttentionPolicy

MIB = 1 << 20
G = 2 * MIB
TOKENS_PER_PAGE = 1024  # 2 MiB / (8 heads * 128 * 2 B)
NO_LEAK = {"reservations": 0, "handles": 0, "mappings": 0}
ORDER_COLUMNS = ["prefill_tokens", "decode_tokens", "batch_size", "num_running", "num_waiting", "used_page_groups"]


def small_layout(num_sub_tensors: int = 8, num_slots: int = 4, max_pages: int = 8) -> KVCacheLayout:
    return KVCacheLayout(num_sub_tensors=num_sub_tensors, num_slots=num_slots, max_pages_per_slot=max_pages,
                         page_size_bytes=G)


class RemoteTP:
    """A RemoteTPExecutor over worker 0 here and workers 1.. served by WorkerService threads over pipes."""

    def __init__(self, tp: int = 2, pool: int = 16, background: bool = True, layout: KVCacheLayout | None = None,
                 delay_us: list[dict] | None = None, **knobs):
        layout = layout or small_layout()
        self.drivers = [PeerDriver(G, capacity_bytes=1 << 36, va_limit_bytes=1 << 50,
                                   delay_us=(delay_us or [{}] * tp)[r], device_ordinal=r) for r in range(tp)]
        caches = [KVCache(d, layout, pool) for d in self.drivers]
        self.services, workers = [], [TPWorker(0, caches[0])]
        for rank in range(1, tp):
            here, there = multiprocessing.Pipe()
            self.services.append(WorkerService(rank, caches[rank], there).start())
            workers.append(RemoteWorker(rank, here, layout, pool))
        policy = VAttentionPolicy(policy_config_for(caches[0], **knobs))
        self.ex = RemoteTPExecutor(policy, workers, background=background)

    def inject(self, rank: int, call: str, nth: int) -> None:
        """A fault on ``rank``'s driver: worker 0's directly, a remote one's over its pipe."""
        if rank == 0:
            self.drivers[0].inject_fault(call, nth)
        else:
            self.ex.workers[rank].query("driver", "inject_fault", call, nth)

    def pending_faults(self) -> int:
        return self.drivers[0].pending_faults() + sum(w.query("driver", "pending_faults") for w in self.ex.workers[1:])

    def clear_faults(self) -> None:
        self.drivers[0].clear_faults()
        for w in self.ex.workers[1:]:
            w.query("driver", "clear_faults")

    def worker_state(self) -> list[tuple]:
        """Per worker, read through the same interface the group uses (remote: over the pipe): mapped
        (slot, page) pairs, the free-handle pool in order, live driver objects."""
        state = [(list(self.ex.workers[0].cache.iter_mapped()), [str(h) for h in self.ex.workers[0].cache._free_handles],
                  self.drivers[0].live_objects())]
        for w in self.ex.workers[1:]:
            state.append((list(w.cache.iter_mapped()), w.cache.free_handles, w.query("driver", "live_objects")))
        return state

    def full_state(self) -> tuple:
        return _snapshot(self.ex.policy), self.worker_state()

    def assert_no_leaks(self) -> None:
        for service in self.services:
            service.join(5)
            assert not service.alive
        assert [d.live_objects() for d in self.drivers] == [NO_LEAK] * len(self.drivers)
        assert not any(t.name.startswith(("tp-worker", "tp-remote", "tp-service")) for t in threading.enumerate())


# ---- the pipe ----------------------------------------------------------------------------------------
def test_errors_cross_the_pipe_as_themselves_or_as_remote_errors():
    error = VmmError("cuMemMap", "CUDA_ERROR_OUT_OF_MEMORY", (1 << 40, 7), "injected")
    crossed = portable_error(error)
    assert crossed is error  # VmmError is registered for pickling
    unpicklable = ValueError(lambda: None)
    assert isinstance(portable_error(unpicklable), RemoteError) and "ValueError" in str(portable_error(unpicklable))
    here, there = multiprocessing.Pipe()
    server = threading.Thread(target=serve, args=(there, {"boom": lambda: (_ for _ in ()).throw(error),
                                                         "add": lambda a, b: a + b}))
    server.start()
    channel = Channel(here, "peer 1")
    assert channel.call("add", 2, 3) == 5
    with pytest.raises(VmmError, match="OUT_OF_MEMORY") as info:
        channel.call("boom")
    assert info.value.call == "cuMemMap" and info.value.call_args == (1 << 40, 7)
    with pytest.raises(ValueError, match="unknown command 'nope'"):
        channel.call("nope")
    channel.begin("add", 1, 1)
    assert channel.finish() == 2
    channel.close()  # the server sees the end of the pipe and returns
    server.join(5)
    assert not server.is_alive()
    with pytest.raises(PeerLostError):
        _lost_call()


def _lost_call():
    here, there = multiprocessing.Pipe()
    there.close()
    Channel(here, "peer 2").call("anything")


def test_work_encoding_round_trips_in_slot_order():
    work = [SeqWork(3, 10, 1, True), SeqWork(0, 0, 512, False), SeqWork(1, 7, 4, True)]
    encoded = encode_work(work)
    assert [e[0] for e in encoded] == [0, 1, 3]
    assert decode_work(encoded) == sorted(work, key=lambda w: w.slot)


# ---- two-phase over the pipe -------------------------------------------------------------------------
def test_remote_workers_map_the_same_pages_through_their_own_service():
    tp = RemoteTP(tp=3, background=False)
    with tp.ex as ex:
        slots = [ex.alloc_slot(100) for _ in range(3)]
        assert ex.step({slots[0]: 3000, slots[1]: 100, slots[2]: 5000})
        ex.check_consistent()
        mappings = ex.group.worker_mappings()
        assert mappings[0] == mappings[1] == mappings[2] and len(mappings[0]) == 3 + 1 + 5
        assert len(ex.timings) == 1 and len(ex.timings[0].worker_mapping_us) == 3
        assert ex.step({slots[0]: 3000})  # nothing to map: no plan is sent to any worker
        assert len(ex.timings) == 1
        bases = [w.cache.bases for w in ex.workers]
        assert all(bases) and bases[1] == tp.services[0].cache.bases
    tp.assert_no_leaks()


def test_map_failing_on_the_remote_worker_rolls_back_every_worker_and_the_policy():
    tp = RemoteTP(pool=4, layout=small_layout(num_sub_tensors=64, num_slots=2), background=False)
    with tp.ex as ex:
        slot = ex.alloc_slot(100)
        assert ex.step({slot: 100})
        before = tp.full_state()
        tp.inject(1, "cuMemMap", 40)
        with pytest.raises(TPStepError, match="failed on worker 1 of 2") as info:
            ex.step({slot: 2 * TOKENS_PER_PAGE})
        assert set(info.value.worker_errors) == {1} and info.value.kind == "foreground"
        assert isinstance(info.value.__cause__, VmmError) and "OUT_OF_MEMORY" in str(info.value)
        assert tp.full_state() == before  # mappings, pools (handle order too) and policy, on both workers
        assert tp.drivers[1].stats.count("cuMemMap") == 64 + 40  # the remote worker mapped 39 pages, then undid them
        assert ex.step({slot: 2 * TOKENS_PER_PAGE})
        ex.check_consistent()
    tp.assert_no_leaks()


def test_unmap_failing_on_the_remote_worker_while_freeing_restores_every_worker():
    tp = RemoteTP(background=False, deferred_reclaim=False)
    with tp.ex as ex:
        slot = ex.alloc_slot(100)
        ex.step({slot: 2 * TOKENS_PER_PAGE})
        ex.iteration_launched(0, CompletedEvent())
        before = tp.full_state()
        tp.inject(1, "cuMemUnmap", 11)
        with pytest.raises(TPStepError, match="worker 1 of 2"):
            ex.free_slot(slot, last_read_iteration=0)
        assert tp.full_state() == before and ex.policy.active[slot]
        ex.free_slot(slot, last_read_iteration=0)
        assert ex.group.worker_mappings() == [[], []]
    tp.assert_no_leaks()


def test_background_op_failing_on_the_remote_worker_is_cancelled_everywhere_and_raised_next():
    tp = RemoteTP(eager_idle_slots=0)
    with tp.ex as ex:
        slot = ex.alloc_slot(100)
        ex.step({slot: 100})
        tp.inject(1, "cuMemMap", 8 + 3)  # 2nd background page group, 3rd sub-tensor
        assert ex.map_ahead({slot: 4 * TOKENS_PER_PAGE}) == 3
        ex.wait_background()
        with pytest.raises(BackgroundMappingError) as info:
            ex.step({slot: 4 * TOKENS_PER_PAGE})
        cause = info.value.__cause__
        assert isinstance(cause, TPStepError) and set(cause.worker_errors) == {1} and cause.kind == "background"
        assert ex.group.worker_mappings() == [[(slot, 0), (slot, 1)]] * 2
        ex.check_consistent()
        assert ex.step({slot: 4 * TOKENS_PER_PAGE})
        ex.check_consistent()
        assert [t.kind for t in ex.timings] == ["foreground", "background", "foreground"]
    tp.assert_no_leaks()


def test_workers_in_two_places_map_concurrently():
    tp = RemoteTP(background=False, delay_us=[{"cuMemMap": 3000}, {"cuMemMap": 3000}])
    with tp.ex as ex:
        slot = ex.alloc_slot(100)
        assert ex.step({slot: 100})  # 8 maps of 3 ms on each worker
        timing = ex.timings[0]
        assert timing.wall_us < 0.8 * sum(timing.worker_mapping_us)  # serial would be the sum
    tp.assert_no_leaks()


def test_a_lost_peer_fails_the_step_on_every_worker_and_teardown_still_ends():
    tp = RemoteTP(background=False)
    ex = tp.ex.open()
    slot = ex.alloc_slot(100)
    assert ex.step({slot: 100})
    before = tp.worker_state()[0]
    ex.workers[1].channel.conn.send("garbage")  # the peer breaks down: it stops serving (and closes its cache) ...
    tp.services[0].join(5)
    assert not tp.services[0].alive
    tp.services[0].conn.close()  # ... and its end of the pipe closes, as when its process ends
    with pytest.raises(TPStepError, match="worker 1 of 2") as info:
        ex.step({slot: 3 * TOKENS_PER_PAGE})
    assert isinstance(info.value.__cause__, PeerLostError)
    assert (list(ex.workers[0].cache.iter_mapped()), tp.drivers[0].live_objects()) == (before[0], before[2])
    with pytest.raises(PeerLostError):
        ex.close()  # worker 0 is closed anyway; the lost peer is reported
    assert tp.drivers[0].live_objects() == NO_LEAK
    assert tp.drivers[1].live_objects() == NO_LEAK  # the service closed its cache when the pipe ended


# ---- consistency invariant over the pipe ---------------------------------------------------------------
ACTIONS = st.lists(st.tuples(st.sampled_from(["admit", "grow", "free", "ahead", "fault"]),
                             st.integers(0, 3), st.integers(1, 8 * TOKENS_PER_PAGE)), max_size=25)
FAULTS = st.tuples(st.integers(0, 1), st.sampled_from(["cuMemMap", "cuMemSetAccess", "cuMemUnmap"]),
                   st.integers(1, 12))


@settings(max_examples=60, deadline=None)
@given(ACTIONS, st.booleans(), st.lists(FAULTS, min_size=1, max_size=4))
@example([("admit", 0, 100), ("fault", 0, 1), ("grow", 0, 3000)], True, [(1, "cuMemMap", 5)])
@example([("admit", 0, 100), ("grow", 0, 100), ("fault", 0, 1), ("ahead", 1, 4000), ("grow", 0, 4000)], True,
         [(1, "cuMemSetAccess", 2)])
@example([("admit", 0, 100), ("grow", 0, 3000), ("fault", 0, 1), ("free", 0, 1)], False, [(1, "cuMemUnmap", 3)])
def test_random_workloads_keep_both_workers_identical_to_the_policy(actions, deferred, faults):
    tp = RemoteTP(pool=12, deferred_reclaim=deferred)
    lengths: dict[int, int] = {}
    faults = list(faults)
    with tp.ex as ex:
        for iteration, (kind, pick, tokens) in enumerate(actions):
            if kind == "fault" and faults and not tp.pending_faults():
                rank, call, nth = faults.pop()  # one fault pending at a time: a second one could hit an undo
                tp.inject(rank, call, nth)
            _run_action(tp, lengths, kind, pick, tokens, iteration)
            ex.iteration_launched(iteration, CompletedEvent())
        ex.check_consistent()
        tp.clear_faults()
        mappings = ex.group.worker_mappings()
        assert mappings[0] == mappings[1]
    tp.assert_no_leaks()


def _run_action(tp: RemoteTP, lengths: dict[int, int], kind: str, pick: int, tokens: int, iteration: int) -> None:
    """One scheduler action; a failed one must leave every worker and the policy exactly as before."""
    ex = tp.ex
    active = sorted(lengths)
    if kind == "admit":
        slot = ex.alloc_slot(tokens)
        if slot is not None:
            lengths[slot] = tokens
        return
    if kind == "ahead":
        try:
            ex.map_ahead({s: min(n + tokens, 8 * TOKENS_PER_PAGE) for s, n in lengths.items()})
        except BackgroundMappingError:
            event("background op rolled back on both workers")
        if pick % 2:
            ex.wait_background()
        return
    if kind not in ("grow", "free") or not active:
        return
    slot = active[pick % len(active)]
    try:
        ex._drain_background()
    except BackgroundMappingError:
        event("background op rolled back on both workers")
    ex.check_consistent()
    before = tp.full_state()
    try:
        if kind == "grow" and ex.step({slot: max(tokens, lengths[slot])}):
            lengths[slot] = max(tokens, lengths[slot])
        elif kind == "free":
            ex.free_slot(slot, last_read_iteration=iteration - 1)
            del lengths[slot]
    except TPStepError as error:
        event(f"{kind} rolled back on both workers")
        assert tp.full_state() == before, error
    ex.check_consistent()


# ---- the serving loop --------------------------------------------------------------------------------
def small_trace(n: int = 8, seed: int = 0, spread_s: float = 0.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"request_id": range(n), "arrival_s": np.linspace(0, spread_s, n),
                         "prompt_tokens": rng.integers(10, 3000, n), "output_tokens": rng.integers(2, 16, n)})


def recording_spec(config: SimConfig, delay_us: dict | None = None, compute_us: float = 0.0) -> PeerSpec:
    layout = layout_for(config, config.model_spec.per_worker(config.tp))
    return PeerSpec(tp=config.tp, devices=("cpu",) * config.tp, layout=layout, pool_page_groups=config.pool_page_groups,
                    runner="recording", emulated_delay_us=delay_us or {}, emulated_compute_us=compute_us)


@pytest.mark.parametrize("sync", [True, False])
def test_tp_loop_schedules_like_the_simulator_and_every_rank_computes_the_same_batches(sync):
    pytest.importorskip("simpy")
    from sim.core.runner import run_simulation

    config = SimConfig(tp=2, max_batch_slots=4, max_context_tokens=4096, token_budget=512, sync_mapping=sync,
                       memory_util_frac=0.2)
    trace = small_trace()
    output, meta = replay_tp(config, trace, recording_spec(config), sleep=lambda s: None, peer_mode="thread")
    hw, sim = output.iterations_frame(), run_simulation(config, trace)
    batches = meta["rank_batches"]
    assert len(batches[0]) == len(hw) and batches[0] == batches[1]  # same iterations, same order, same work
    launches = output.rank_launches
    assert len(launches) == 2 * len(hw) and (launches.groupby("rank").size() == len(hw)).all()
    assert set(meta["tp_launch"]["launched_lag_us"]) == {"1"}
    assert meta["tp_page_tables"] == "identical" and meta["peer_exit_codes"] == [0]
    if sync:  # all arrive at 0, no mapper thread: every batch and policy decision is the simulator's at tp 2
        pd.testing.assert_frame_equal(hw[ORDER_COLUMNS], sim.iterations[ORDER_COLUMNS], check_dtype=False)
        for column in ("sync_map_page_groups", "mapped_page_groups", "free_page_groups"):
            assert hw[column].tolist() == sim.iterations[column].tolist()
    else:
        for column in ("prefill_tokens", "decode_tokens"):
            assert hw[column].sum() == sim.iterations[column].sum()
    assert (output.requests_frame()["status"] == "finished").all()
    assert meta["tp_mapping"]["foreground"]["num_plans"] >= 1
    assert len(meta["tp_mapping"]["foreground"]["per_worker"]) == 2


def test_the_mapper_thread_maps_ahead_on_every_rank_while_the_emulated_gpu_computes():
    pytest.importorskip("simpy")
    from sim.core.runner import run_simulation

    config = SimConfig(tp=2, max_batch_slots=4, max_context_tokens=8192, token_budget=512, memory_util_frac=0.2)
    trace = pd.DataFrame({"request_id": range(4), "arrival_s": [0, 0.001, 0.002, 0.003],
                          "prompt_tokens": [2000, 1990, 4000, 100], "output_tokens": [120, 200, 150, 300]})
    output, meta = replay_tp(config, trace, recording_spec(config, compute_us=2000), sleep=lambda s: None,
                             peer_mode="thread")
    hw = output.iterations_frame()
    sim = run_simulation(config, trace).iterations
    assert hw["bg_map_page_groups"].sum() > 0 and meta["tp_mapping"]["background"]["num_plans"] > 0
    assert hw["bg_map_page_groups"].sum() + hw["sync_map_page_groups"].sum() == (
        sim["bg_map_page_groups"].sum() + sim["sync_map_page_groups"].sum())
    assert meta["tp_page_tables"] == "identical" and meta["rank_batches"][0] == meta["rank_batches"][1]


def test_tp_loop_with_a_spawned_peer_process_writes_a_run_that_validate_reads_at_tp_2(tmp_path):
    from hwbackend.calibration.run_files import load_hw_run
    from hwbackend.replay.cli import write_hw_run

    config = SimConfig(tp=2, max_batch_slots=4, max_context_tokens=4096, token_budget=512, memory_util_frac=0.2)
    trace = small_trace(6, seed=2, spread_s=0.05)
    output, meta = replay_tp(config, trace, recording_spec(config, {"cuMemMap": 20}), peer_mode="process")
    assert meta["ranks"][0]["pid"] != meta["ranks"][1]["pid"]  # rank 1 ran in its own process
    assert meta["rank_batches"][0] == meta["rank_batches"][1] and meta["peer_exit_codes"] == [0]
    assert meta["tp_page_tables"] == "identical"
    meta.pop("rank_batches")
    out = write_hw_run(output, config, meta, tmp_path / "run")
    for name in ("requests.parquet", "iterations.parquet", "shapes.parquet", "summary.json", "config.json"):
        assert (out / name).is_file()
    hw, rebuilt = load_hw_run(out)
    assert rebuilt.tp == 2 and rebuilt == config
    assert hw.config["devices"] == ["cpu", "cpu"] and [r["rank"] for r in hw.config["ranks"]] == [0, 1]
    assert len(hw.iterations) == len(output.iteration_records)


# ---- command line ------------------------------------------------------------------------------------
def test_devices_and_unsupported_settings_are_named():
    assert resolve_devices("cuda:0", None, 2) == ("cuda:0", "cuda:1")
    assert resolve_devices("cuda:2", None, 2) == ("cuda:2", "cuda:3")
    assert resolve_devices("cpu", None, 4) == ("cpu",) * 4
    assert resolve_devices("cuda:0", "cuda:1,cuda:0", 2) == ("cuda:1", "cuda:0")
    for devices, match in (("cuda:0", "1 devices for --tp 2"), ("cuda:0,cuda:0", "named twice"),
                           ("cuda:0,cpu", "every rank on cpu"), ("cuda:0,gpu1", "not cuda:N")):
        with pytest.raises(ValueError, match=match):
            resolve_devices("cuda:0", devices, 2)
    config = SimConfig(tp=2)
    assert unsupported_tp(config, ("cpu", "cpu"), "auto", "gloo") is None
    assert "needs GPUs" in unsupported_tp(config, ("cpu", "cpu"), "auto", "nccl")
    assert "varlen needs CUDA" in unsupported_tp(config, ("cpu", "cpu"), "varlen", "gloo")
    assert "recompute" in unsupported_tp(SimConfig(tp=2, preemption="swap"), ("cuda:0", "cuda:1"), "auto", "nccl")


def test_the_tp_command_refuses_bad_devices_in_one_line(tmp_path, capsys):
    from hwbackend.replay.tp.cli import main

    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,2\n")
    for extra, message in ((["--devices", "cuda:0"], "1 devices for --tp 2"),
                           (["--device", "cpu", "--dist-backend", "nccl"], "nccl needs GPUs"),
                           (["--device", "cpu", "--preemption", "swap"], "recompute preemption only")):
        assert main(["--tp", "2", "--trace", str(trace), "--out", str(tmp_path / "run"), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run" / "summary.json").exists()


def test_the_fit_rule_of_the_tp2_plan_gives_a_tp2_profile_that_validate_uses(tmp_path):
    """docs/tp2/PLAN.md's fit rule, mechanically, on a TP=2 run of the recording runner (its iteration times
    are the emulated GPU's, so the fitted values mean nothing; what is checked is where they go)."""
    pytest.importorskip("simpy")
    import json
    import shutil
    import subprocess
    import sys

    from cli import main as kvsim_main
    from hwbackend.calibration.validate import validate_run
    from hwbackend.replay.cli import write_hw_run
    from sim.timing.latency import read_profile
    from sim.core.runner import resolve_compute_model

    config = SimConfig(tp=2, max_batch_slots=8, max_context_tokens=4096, token_budget=512, memory_util_frac=0.2,
                       sync_mapping=True)
    rng = np.random.default_rng(1)
    trace = pd.DataFrame({"request_id": range(12), "arrival_s": np.linspace(0, 0.02, 12),
                          "prompt_tokens": rng.integers(10, 1500, 12), "output_tokens": rng.integers(2, 40, 12)})
    output, meta = replay_tp(config, trace, recording_spec(config, compute_us=300), peer_mode="thread")
    meta.pop("rank_batches")
    run = write_hw_run(output, config, meta, tmp_path / "tp2-train")
    profile = tmp_path / "h200-tp2.json"
    shutil.copy(Path(__file__).resolve().parents[1] / "profiles" / "h200.json", profile)
    assert kvsim_main(["calibrate", "--from-run", str(run), "--out", str(profile), "--force"]) == 0
    subprocess.run([sys.executable, "-c", "import json; p='" + str(profile) + "'; d=json.load(open(p)); "
                    "d.pop('vmm_tp', None); open(p,'w').write(json.dumps(d, indent=1) + '\\n')"], check=True)
    data = json.loads(profile.read_text())
    assert data["compute_in_loop"]["tp"] == 2 and "vmm_in_loop" in data and "vmm_tp" not in data
    assert resolve_compute_model(read_profile(profile), "auto", config) == "in-loop"  # applies at tp 2 ...
    assert resolve_compute_model(read_profile(profile), "auto", SimConfig()) != "in-loop"  # ... not at tp 1
    table, hw, sim, same = validate_run(run, str(profile), tmp_path / "validation")
    assert sim.config["tp"] == 2 and "in-loop" in sim.config["compute_model"]
    assert "vmm_tp" not in sim.config["vmm_latency_source"]
    assert (tmp_path / "validation" / "validation.md").is_file() and same is not None
