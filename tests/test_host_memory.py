"""The CPU replay's K/V tensors must not be charged to the test process (CI, 2026-12-02: 34 GB of committed
host tensors left by one CPU replay made every later fork fail with ENOMEM on a 24 GiB runner)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hwbackend.vmm.host import reserved_host_tensor  # noqa: E402


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _heuristic_overcommit() -> bool:
    path = Path("/proc/sys/vm/overcommit_memory")
    return sys.platform.startswith("linux") and path.exists() and path.read_text().strip() in ("0", "1")


@pytest.mark.skipif(not _heuristic_overcommit(), reason="needs Linux with heuristic overcommit (vm.overcommit_memory 0/1)")
def test_a_reservation_larger_than_ram_is_zero_until_written_and_fork_still_works():
    mem_total_bytes = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0]) * 1024
    heads, head_dim = 8, 128
    tokens = 2 * mem_total_bytes // (heads * head_dim * 4) + 1  # twice the machine's RAM, float32
    t = reserved_host_tensor((tokens, heads, head_dim))
    assert t.shape == (tokens, heads, head_dim) and t.dtype == torch.float32 and t.is_contiguous()
    t[0] = 1.5
    t[tokens - 1, 3, 7] = -2.0
    assert t[0].sum().item() == 1.5 * heads * head_dim
    assert t[tokens // 2].abs().sum().item() == 0.0  # never written: zero, as a fresh GPU page is not
    assert t[tokens - 1, 3, 7].item() == -2.0
    # a process holding it can still start another: the mapping is not charged to the commit limit
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0


def test_shapes_and_bad_input():
    assert reserved_host_tensor((0, 4)).shape == (0, 4)
    assert reserved_host_tensor((2, 3), torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="negative dimension"):
        reserved_host_tensor((2, -1))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_cpu_replay_leaves_no_host_kv_memory_behind(tmp_path):
    from hwbackend.beyond.replay import main

    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,40,5\n0.0,300,3\n")
    before_kib = _status_kib("VmData")
    assert main(["--trace", str(trace), "--device", "cpu", "--warmup-s", "0", "--out", str(tmp_path / "run")]) == 0
    grown_mib = (_status_kib("VmData") - before_kib) / 1024
    assert grown_mib < 2048, f"the CPU replay left {grown_mib:.0f} MiB mapped (its K/V reservation is ~34 GB)"
