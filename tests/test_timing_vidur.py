"""``kvsim calibrate --from-vidur`` (issue 31, item 2): the importer on tiny CSVs in Vidur's exact column layout
(headers transcribed from microsoft/vidur commit 7d47513, hwbackend.calibration.vidur), and a committed derived
profile checked against rows of Vidur's own measurements."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from cli import main
from hwbackend.calibration.vidur import (ALL_REDUCE_COLUMNS, MLP_COLUMNS, VidurError, fit_all_reduce, fit_profile,
                                         read_csv)
from sim.setup.catalog import get_gpu, get_model
from sim.timing.compute import RooflineComputeModel
from sim.setup.config import SimConfig
from sim.core.runner import load_models

ROOT = Path(__file__).resolve().parents[1]
A100 = get_gpu("a100")
H, FFN, HEADS = 64, 256, 8          # a tiny gated model: per layer 4 x 64^2 + 3 x 64 x 256 = 65,536 parameters
PARAMS = H * H * 4 + 3 * H * FFN


def _mlp_row(tokens: int, gemm_ms: float) -> dict:
    row = {c: "0.001" for c in MLP_COLUMNS}
    for op, share in (("attn_pre_proj", 0.375), ("attn_post_proj", 0.125), ("mlp_up_proj", 0.333), ("mlp_down_proj", 0.167)):
        row[f"time_stats.{op}.median"] = repr(gemm_ms * share)
    row.update(n_head=HEADS, n_kv_head=HEADS, n_embd=H, n_expanded_embd=FFN, vocab_size=32768, use_gated_mlp="True",
               num_tokens=tokens, num_tensor_parallel_workers=1)
    return row


def _roofline_ms(tokens: int, e_f: float, e_b: float) -> float:
    return max(2 * tokens * PARAMS / (e_f * A100.bf16_flops), 2 * PARAMS / (e_b * A100.mem_bw_bytes_per_s)) * 1e3


def _write(path: Path, header, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(header))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _vidur_dir(tmp_path: Path, e_f=0.6, e_b=0.5, base_us=10.0, hop_us=2.0, busbw=150e9) -> Path:
    rows = [_mlp_row(t, _roofline_ms(t, e_f, e_b)) for t in (1, 2, 8, 16, 2048, 4096)]
    _write(tmp_path / "data/profiling/compute/a100/org/Tiny-1b-hf/mlp.csv", MLP_COLUMNS, rows)
    ar = []
    for n in (2, 4, 8):
        for size in (2048, 1 << 20, 1 << 24, 1 << 26):
            t_ms = (base_us + hop_us * (n - 1) + 2 * (n - 1) / n * size / busbw * 1e6) / 1e3
            for rank in range(2):   # one row per rank, as Vidur writes them
                ar.append({"": len(ar), "time_stats.all_reduce.min": t_ms, "time_stats.all_reduce.max": t_ms,
                           "time_stats.all_reduce.mean": t_ms, "time_stats.all_reduce.median": t_ms,
                           "time_stats.all_reduce.std": 0.0, "rank": rank, "num_workers": n, "size": size,
                           "collective": "all_reduce", "devices_per_node": n, "max_devices_per_node": 8})
    _write(tmp_path / "data/profiling/network/a100_dgx/all_reduce.csv", ALL_REDUCE_COLUMNS, ar)
    return tmp_path


def test_the_fit_recovers_the_efficiencies_a_roofline_generated(tmp_path):
    """Rows made by max(2 T P / (0.6 F), 2 P / (0.5 B)): each regime's median fraction is exactly 0.6 and 0.5."""
    profile = fit_profile(_vidur_dir(tmp_path), "a100", "org/Tiny-1b-hf")
    roofline = profile["compute"]["roofline"]
    assert (roofline["flops_efficiency"], roofline["bw_efficiency"]) == (0.6, 0.5)
    assert profile["compute"]["gemm"]["fit_error"]["max"] < 1e-3


def test_the_all_reduce_fit_recovers_latency_and_bus_bandwidth(tmp_path):
    roofline = fit_profile(_vidur_dir(tmp_path), "a100", "org/Tiny-1b-hf")["compute"]["roofline"]
    assert roofline["allreduce_base_us"] == pytest.approx(10.0, abs=0.05)
    assert roofline["allreduce_hop_us"] == pytest.approx(2.0, abs=0.05)
    assert roofline["allreduce_bus_bytes_per_s"] == pytest.approx(150e9, rel=1e-3)


def test_the_profile_records_provenance_and_loads_in_the_simulator(tmp_path):
    root = _vidur_dir(tmp_path / "vidur")
    out = tmp_path / "out"
    assert main(["calibrate", "--from-vidur", str(root), "--out", str(out)]) == 0
    path = out / "vidur-a100-tiny-1b.json"
    data = json.loads(path.read_text())
    vidur = data["compute"]["vidur"]
    assert vidur["repository"] == "https://github.com/microsoft/vidur" and vidur["date"]
    assert vidur["files"] == ["data/profiling/compute/a100/org/Tiny-1b-hf/mlp.csv",
                              "data/profiling/network/a100_dgx/all_reduce.csv"]
    _, compute = load_models(SimConfig(gpu="a100", model="llama-3-8b", tp=2), str(path))
    assert (compute.flops_efficiency, compute.bw_efficiency, compute.allreduce_base_us) == (0.6, 0.5, 10.0)
    assert main(["calibrate", "--from-vidur", str(root), "--out", str(out)]) == 2      # exists, no --force


def test_a_bad_cell_is_one_message_naming_file_row_and_column(tmp_path, capsys):
    root = _vidur_dir(tmp_path)
    path = root / "data/profiling/compute/a100/org/Tiny-1b-hf/mlp.csv"
    text = path.read_text().splitlines()
    fields = text[3].split(",")
    fields[MLP_COLUMNS.index("num_tokens")] = "many"
    path.write_text("\n".join(text[:3] + [",".join(fields)] + text[4:]) + "\n")
    assert main(["calibrate", "--from-vidur", str(root), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "mlp.csv: row 3, column num_tokens" in err and "'many'" in err and "Traceback" not in err


def test_a_missing_column_and_an_empty_directory_are_refused(tmp_path):
    _write(tmp_path / "ar.csv", ("size",), [{"size": 1}])
    with pytest.raises(VidurError, match="column time_stats.all_reduce.median is missing"):
        fit_all_reduce(read_csv(tmp_path / "ar.csv", ("time_stats.all_reduce.median",)), tmp_path / "ar.csv")
    assert main(["calibrate", "--from-vidur", str(tmp_path), "--out", str(tmp_path / "o")]) == 2


# Vidur's own rows (data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv, commit 7d47513, TP1): num_tokens
# -> median ms of attn_pre_proj + attn_post_proj + mlp_up_proj + mlp_down_proj (one layer).
VIDUR_A100_LLAMA2_7B_TP1_MS = {1: 0.065 + 0.025 + 0.116 + 0.060, 8: 0.063 + 0.025 + 0.111 + 0.061,
                               2048: 0.9795 + 0.301 + 1.693 + 0.850, 4096: 1.8865 + 0.603 + 3.324 + 1.585}


@pytest.mark.parametrize("tokens", sorted(VIDUR_A100_LLAMA2_7B_TP1_MS))
def test_the_committed_a100_profile_predicts_vidurs_rows_within_6_percent(tokens):
    """At the ends of the token range (where the roofline's max is one bound) the derived profile reproduces
    Vidur's measured per-layer GEMM time within 6% (the fit's TP1 median error is 2.3%, the regimes' rows spread
    +-5% around their median fraction); between them (128-1024 tokens) the roofline is up to 49% low, stated in
    the profile's fit_error."""
    data = json.loads((ROOT / "profiles/vidur-a100-llama-2-7b.json").read_text())
    roofline = data["compute"]["roofline"]
    model = RooflineComputeModel(get_model("llama-2-7b"), A100, 1, flops_efficiency=roofline["flops_efficiency"],
                                 bw_efficiency=roofline["bw_efficiency"])
    layer = get_model("llama-2-7b").linear_params_per_layer()
    predicted_us = max(2 * tokens * layer / model._linear_flops_per_us, 2 * layer / model._bytes_per_us)
    assert predicted_us == pytest.approx(VIDUR_A100_LLAMA2_7B_TP1_MS[tokens] * 1e3, rel=0.06)
    assert data["compute"]["vidur"]["commit"] == "7d47513363ec447a741ac5e47241580b47724fbf"
