"""The host-copy benchmark (hwbackend/beyond/host_copy_bench.py) on a machine without a GPU: it refuses in one
line with status 2 and writes nothing; its latency/rate fit is checked on exact synthetic points."""
import pytest

from hwbackend.beyond import host_copy_bench as bench


def test_refuses_cleanly_without_a_gpu(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "gpu_available", lambda: "no CUDA GPU (torch.cuda.is_available() is False)")
    out = tmp_path / "host_copy.json"
    assert bench.main(["--out", str(out)]) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip()
    assert err.startswith("host_copy_bench: no CUDA GPU") and "\n" not in err


def test_fit_recovers_latency_and_rate():
    """Points made with 8 us + bytes / 50 GB/s: the least-squares fit returns exactly those."""
    points = [(size, 8.0 + size / 50e9 * 1e6) for size in bench.SIZES_BYTES]
    latency_us, rate = bench.fit_latency_rate(points)
    assert latency_us == pytest.approx(8.0) and rate == pytest.approx(50e9)
    with pytest.raises(ValueError, match="two copy sizes"):
        bench.fit_latency_rate([(1024, 1.0)])


def test_sizes_span_64kib_to_256mib():
    assert bench.SIZES_BYTES[0] == 64 * 1024 and bench.SIZES_BYTES[-1] == 256 * 1024 * 1024
