"""GPU tests of the hardware backend on real CUDA VMM calls (marked ``gpu``; skipped cleanly without an
NVIDIA GPU with VMM support, torch with CUDA, or cuda-python). Run: ``python -m pytest -m gpu``."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.bindings.driver")

from hwbackend.vmm.driver import CudaVmmDriver, GpuUnavailableError, VmmError  # noqa: E402
from hwbackend.vmm.executor import Executor, policy_config_for  # noqa: E402
from hwbackend.vmm.kvcache import KVCache, KVCacheLayout  # noqa: E402
from hwbackend.vmm.tensors import kv_tensors  # noqa: E402
from sim.memory.vattention import VAttentionPolicy  # noqa: E402

MIB = 1 << 20
TOKENS_PER_PAGE = 1024  # 2 MiB / (8 KV heads * 128 * 2 B), Llama-3-8B shape per sub-tensor


@pytest.fixture(scope="module")
def driver():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    torch.cuda.init()
    try:
        drv = CudaVmmDriver(0)
    except GpuUnavailableError as exc:
        pytest.skip(str(exc))
    yield drv
    drv.close()


def layout(num_slots: int = 2, max_pages: int = 4, num_sub_tensors: int = 4) -> KVCacheLayout:
    return KVCacheLayout(num_sub_tensors=num_sub_tensors, num_slots=num_slots, max_pages_per_slot=max_pages,
                         page_size_bytes=2 * MIB, num_kv_heads=8, head_dim=128, dtype_bytes=2)


def executor(driver, background: bool, pool: int = 8, num_slots: int = 2, **knobs) -> Executor:
    cache = KVCache(driver, layout(num_slots=num_slots), pool)
    return Executor(VAttentionPolicy(policy_config_for(cache, **knobs)), cache, background=background,
                    stream_handle=torch.cuda.current_stream().cuda_stream)


def pattern(sub_tensor: int, first_token: int, num_tokens: int, salt: int = 0) -> "torch.Tensor":
    """Values exactly representable in bf16 (integers below 256), distinct per tensor, token and head."""
    tokens = torch.arange(first_token, first_token + num_tokens, device="cuda").view(-1, 1, 1)
    heads = torch.arange(8, device="cuda").view(1, -1, 1)
    dims = torch.arange(128, device="cuda").view(1, 1, -1)
    return ((tokens * 7 + heads * 3 + dims + sub_tensor * 11 + salt) % 251).to(torch.bfloat16)


def write(tensors, slot: int, first: int, count: int, salt: int = 0) -> None:
    for t, tensor in enumerate(tensors):
        tensor[slot, first:first + count] = pattern(t, first, count, salt)


def matches(tensors, slot: int, first: int, count: int, salt: int = 0) -> bool:
    return all(torch.equal(tensor[slot, first:first + count], pattern(t, first, count, salt))
               for t, tensor in enumerate(tensors))


def test_real_driver_errors_name_the_cuda_error_and_arguments(driver):
    with pytest.raises(VmmError) as info:
        driver.create(driver.granularity_bytes + 1)
    assert info.value.error_name.startswith("CUDA_ERROR_") and info.value.call == "cuMemCreate"
    assert info.value.call_args[0] == driver.granularity_bytes + 1
    assert driver.granularity_bytes == 2 * MIB


@pytest.mark.parametrize("background", [False, True])
def test_write_grow_free_reuse_read_back_exactly(driver, background):
    with executor(driver, background, num_slots=1) as ex:
        tensors = kv_tensors(ex.cache, torch.bfloat16)
        assert tensors[0].shape == (1, 4 * TOKENS_PER_PAGE, 8, 128)
        slot = ex.alloc_slot(10)
        assert ex.step({slot: 10})
        write(tensors, slot, 0, 10)
        ex.iteration_launched(0)
        if background:
            ex.map_ahead({slot: 2500})
        assert ex.step({slot: 2500})  # crosses two page boundaries
        assert ex.cache.mapped_pages(slot) == [0, 1, 2]
        write(tensors, slot, 10, 2490)
        ex.iteration_launched(1)
        assert matches(tensors, slot, 0, 2500)
        ex.free_slot(slot, last_read_iteration=1)
        torch.cuda.synchronize()
        assert ex.alloc_slot(3000) == slot  # deferred reclamation: same slot, pages kept
        assert ex.cache.mapped_pages(slot) == [0, 1, 2]
        assert matches(tensors, slot, 0, 2500)  # the previous request's KV is still there (no zeroing)
        assert ex.step({slot: 3000})
        write(tensors, slot, 0, 3000, salt=5)
        ex.iteration_launched(2)
        assert matches(tensors, slot, 0, 3000, salt=5)
        torch.cuda.synchronize()
        del tensors


def test_nothing_leaks_driver_free_memory_equal_before_and_after(driver):
    torch.cuda.synchronize()
    free_before, _ = driver.mem_info()
    with executor(driver, background=True, pool=16, num_slots=2) as ex:
        a, b = ex.alloc_slot(100), ex.alloc_slot(100)
        assert ex.step({a: 3000, b: 100})
        ex.iteration_launched(0)
        ex.map_ahead({a: 4000, b: 2000})
        ex.wait_background()
        assert driver.mem_info()[0] < free_before  # the pool really took memory
        ex.free_slot(a, last_read_iteration=0)
    torch.cuda.synchronize()
    free_after, _ = driver.mem_info()
    assert free_after == free_before


def test_error_midway_through_open_leaks_nothing(driver):
    free_before, _ = driver.mem_info()
    cache = KVCache(driver, layout(), pool_page_groups=4)
    original = driver.create
    calls = {"n": 0}

    def failing_create(size_bytes):
        calls["n"] += 1
        if calls["n"] == 7:
            raise VmmError("cuMemCreate", "CUDA_ERROR_OUT_OF_MEMORY", (size_bytes,), "injected in test")
        return original(size_bytes)

    driver.create = failing_create
    try:
        with pytest.raises(VmmError):
            cache.open()
    finally:
        del driver.create
    assert driver.mem_info()[0] == free_before and cache.bases == [] and cache.num_handles == 0
