"""GPU check of the tensor-parallel executor: two workers, each with its own driver instance, reservations
and handle pool, stay consistent through a short random workload, roll back together, and leak nothing.
Each test runs with both workers on GPU 0 (one device's primary context) and, where two GPUs are present,
with worker 1 on GPU 1 (marked ``gpu``; skipped cleanly without an NVIDIA GPU with VMM support, torch with
CUDA, or cuda-python; the two-GPU variant skipped with fewer than two). Run:
``python -m pytest -m gpu tests/test_hw_tp_gpu.py``."""
from __future__ import annotations

import random

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.bindings.driver")

from hwbackend.vmm.driver import CudaVmmDriver, GpuUnavailableError, VmmError  # noqa: E402
from hwbackend.vmm.executor import policy_config_for  # noqa: E402
from hwbackend.vmm.kvcache import KVCacheLayout  # noqa: E402
from hwbackend.vmm.tensors import kv_tensors  # noqa: E402
from hwbackend.vmm.tp import TPExecutor, TPStepError, make_tp_caches  # noqa: E402
from sim.memory.vattention import VAttentionPolicy  # noqa: E402

MIB = 1 << 20
HEADS_PER_WORKER = 4  # 8 KV heads, tp = 2
TOKENS_PER_PAGE = 2048  # 2 MiB / (4 heads * 128 * 2 B)


@pytest.fixture(params=[(0, 0), (0, 1)], ids=["one-gpu", "two-gpus"])
def drivers(request):
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    devices = request.param
    if torch.cuda.device_count() <= max(devices):
        pytest.skip(f"needs {max(devices) + 1} GPUs, torch sees {torch.cuda.device_count()}")
    torch.cuda.init()
    try:
        pair = [CudaVmmDriver(d) for d in devices]
    except GpuUnavailableError as exc:
        pytest.skip(str(exc))
    for device in sorted(set(devices)):
        warm_up_torch(device)
    yield pair
    for driver in pair:
        driver.close()


def warm_up_torch(device: int) -> None:
    """Run the torch operations the tests use once, so that lazily loaded kernels and the caching
    allocator do not show up as a change of driver free memory (seen on the H200: -114 MiB)."""
    scratch = torch.zeros((2, 64, HEADS_PER_WORKER, 128), device=f"cuda:{device}", dtype=torch.bfloat16)
    scratch[0, :8] = torch.full((8, HEADS_PER_WORKER, 128), 1.0, device=f"cuda:{device}", dtype=torch.bfloat16)
    assert torch.equal(scratch[0, :8], scratch[0, :8])
    del scratch


def free_bytes(drivers: list[CudaVmmDriver]) -> list[int]:
    """Driver free memory of each worker's device once its GPU is idle and torch's cached blocks are
    returned."""
    for driver in drivers:
        with torch.cuda.device(driver.device_ordinal):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return [driver.mem_info()[0] for driver in drivers]


def tp_executor(drivers, background: bool, pool: int = 12, **knobs) -> TPExecutor:
    layout = KVCacheLayout(num_sub_tensors=4, num_slots=4, max_pages_per_slot=4, page_size_bytes=2 * MIB,
                           num_kv_heads=HEADS_PER_WORKER, head_dim=128, dtype_bytes=2)
    caches = make_tp_caches(drivers, layout, pool)
    streams = [torch.cuda.current_stream(d.device_ordinal).cuda_stream for d in drivers]
    return TPExecutor(VAttentionPolicy(policy_config_for(caches[0], **knobs)), caches, background=background,
                      stream_handles=streams)


def write_and_check(ex: TPExecutor, slot: int, tokens: int) -> None:
    """Write a distinct pattern into the slot's first ``tokens`` tokens on each worker; read it back."""
    for rank, worker in enumerate(ex.workers):
        for t, tensor in enumerate(kv_tensors(worker.cache, torch.bfloat16)):
            values = torch.full((tokens, HEADS_PER_WORKER, 128), float(rank * 16 + t + 1), device=tensor.device,
                                dtype=torch.bfloat16)
            tensor[slot, :tokens] = values
            assert torch.equal(tensor[slot, :tokens], values)
    for worker in ex.workers:
        torch.cuda.synchronize(worker.cache.driver.device_ordinal)


@pytest.mark.parametrize("background", [False, True])
def test_two_workers_stay_consistent_through_a_random_workload(drivers, background):
    free_before = free_bytes(drivers)
    rng = random.Random(9)
    lengths: dict[int, int] = {}
    with tp_executor(drivers, background) as ex:
        for iteration in range(60):
            kind = rng.choice(["admit", "grow", "grow", "free", "ahead"])
            active = sorted(lengths)
            if kind == "admit":
                slot = ex.alloc_slot(rng.randint(1, TOKENS_PER_PAGE))
                if slot is not None:
                    lengths[slot] = 1
            elif kind == "grow" and active:
                slot = rng.choice(active)
                target = min(4 * TOKENS_PER_PAGE, lengths[slot] + rng.randint(1, 2 * TOKENS_PER_PAGE))
                if ex.step({slot: target}):
                    lengths[slot] = target
                    write_and_check(ex, slot, target)
            elif kind == "free" and active:
                slot = rng.choice(active)
                ex.free_slot(slot, last_read_iteration=iteration - 1)
                del lengths[slot]
            elif kind == "ahead":
                ex.map_ahead({s: min(n + TOKENS_PER_PAGE, 4 * TOKENS_PER_PAGE) for s, n in lengths.items()})
            ex.iteration_launched(iteration)
            ex.check_consistent()
        assert len(ex.timings) > 10
    assert free_bytes(drivers) == free_before


def test_a_failure_on_worker_1_rolls_back_both_workers(drivers):
    free_before = free_bytes(drivers)
    original, calls = drivers[1].map, {"n": 0}

    def failing_map(va, size_bytes, handle):
        calls["n"] += 1
        if calls["n"] == 3:
            raise VmmError("cuMemMap", "CUDA_ERROR_OUT_OF_MEMORY", (va, size_bytes), "injected in test")
        return original(va, size_bytes, handle)

    with tp_executor(drivers, background=False) as ex:
        slot = ex.alloc_slot(100)
        assert ex.step({slot: 100})
        before = ex.group.worker_mappings(), ex.policy.free_page_groups
        drivers[1].map = failing_map
        try:
            with pytest.raises(TPStepError, match="worker 1 of 2"):
                ex.step({slot: 2 * TOKENS_PER_PAGE})
        finally:
            del drivers[1].map
        assert (ex.group.worker_mappings(), ex.policy.free_page_groups) == before
        assert ex.step({slot: 2 * TOKENS_PER_PAGE})
        write_and_check(ex, slot, 2 * TOKENS_PER_PAGE)
        ex.check_consistent()
    assert free_bytes(drivers) == free_before
