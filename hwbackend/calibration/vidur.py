"""``kvsim calibrate --from-vidur DIR``: a kvsim profile from Vidur's published per-operator measurements (CPU only:
pandas and numpy, no torch, no GPU).

Vidur (microsoft/vidur) publishes, per GPU (``a100``, ``h100``, ``a40``) and model, CSVs of operator times measured
with the PyTorch profiler (CUDA kernel time, milliseconds: ``vidur/profiling/common/cuda_timer.py`` records
``cuda_time_total * 1e-3``):

* ``data/profiling/compute/<gpu>/<org>/<model>/mlp.csv``: per layer and tensor-parallel worker, the projections
  (``attn_pre_proj`` = QKV, ``attn_post_proj`` = O, ``mlp_up_proj`` = gate+up, ``mlp_down_proj``) and the
  elementwise operators (``mlp_act``, ``attn_rope``, ``input_layernorm``, ``post_attention_layernorm``, ``add``)
  by ``num_tokens`` and ``num_tensor_parallel_workers``; columns :data:`MLP_COLUMNS`;
* ``.../attention.csv`` (where present): ``attn_prefill`` by ``prefill_chunk_size`` and ``kv_cache_size``,
  ``attn_decode`` by ``batch_size`` and ``kv_cache_size``; columns :data:`ATTENTION_COLUMNS`;
* ``data/profiling/network/<gpu>_dgx/all_reduce.csv``: one NCCL all-reduce (median kernel time of 11 calls,
  ``collectives_wrapper.py``) by ``num_workers`` and ``size``; columns :data:`ALL_REDUCE_COLUMNS`. ``size`` is
  the payload in **bytes**: the wrapper allocates ``size`` fp16 elements and writes ``"size": self._size * 2  #
  bytes``, and Vidur's predictor reads tokens back as ``size / embedding_dim / 2``
  (``sklearn_execution_time_predictor.py``).

What is fitted (:func:`fit_profile`), in kvsim's roofline terms (:mod:`sim.timing.compute`):

* GEMMs: ``flops_efficiency`` and ``bw_efficiency`` of ``t(T) = max(2 T P / (e_F F), 2 P / (e_B B))`` per layer
  and worker (``P`` the four projections' parameters per worker, ``F`` the catalogue's bf16 peak, ``B`` its HBM
  bandwidth), each efficiency the median achieved fraction of its own regime (few tokens: weight streaming; many:
  FLOPs; :func:`fit_gemm`); the profile's ``compute.roofline`` takes the fit of the
  one-GPU rows (``num_tensor_parallel_workers == 1``: the whole matrices, as kvsim's catalogue efficiencies mean
  them); ``compute.gemm`` also holds the fit over every degree and one per degree (higher degrees' smaller
  matrices stream at a lower fraction);
* elementwise: achieved fraction of HBM bandwidth of the five elementwise operators at >= 1024 tokens
  (informational: kvsim's roofline has no elementwise term; it is part of ``overhead_us`` and the GEMM fit);
* attention (only with ``attention.csv``): decode ``attention_bytes_factor = bw_efficiency / e_decode`` (K/V
  bytes over time), prefill ``attention_flops_efficiency = e_prefill / flops_efficiency``;
* all-reduce: ``t = base + hop (n - 1) + 2 (n - 1) / n * bytes / busbw`` (least squares on relative error, every
  measured ``n``, GPUs of one node), giving ``allreduce_base_us``, ``allreduce_hop_us``,
  ``allreduce_bus_bytes_per_s``.

The profile's ``vmm`` section is not Vidur's (it measures no VMM calls): it is the quantiles of the committed
``profiles/h200.json``, kvsim's built-in VMM figures, said so in ``vmm_source``.
"""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pandas as pd

from sim.setup.catalog import get_gpu

MLP_COLUMNS = tuple(f"time_stats.{op}.{stat}" for op in (
    "emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
    "mlp_up_proj", "mlp_act", "mlp_down_proj", "add") for stat in ("min", "max", "mean", "median", "std")) + (
    "n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
    "num_tensor_parallel_workers")
"""The header of Vidur's ``mlp.csv`` (transcribed from ``data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/
mlp.csv``, commit 7d47513)."""

ALL_REDUCE_COLUMNS = ("", "time_stats.all_reduce.min", "time_stats.all_reduce.max", "time_stats.all_reduce.mean",
                      "time_stats.all_reduce.median", "time_stats.all_reduce.std", "rank", "num_workers", "size",
                      "collective", "devices_per_node", "max_devices_per_node")
"""The header of Vidur's ``all_reduce.csv`` (``data/profiling/network/a100_dgx/all_reduce.csv``, commit 7d47513;
the first column is pandas' unnamed index)."""

ATTENTION_COLUMNS = tuple(f"time_stats.{op}.{stat}" for op in (
    "attn_input_reshape", "attn_kv_cache_save", "attn_prefill", "attn_decode", "attn_output_reshape")
    for stat in ("min", "max", "mean", "median", "std")) + (
    "n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers", "max_model_len", "batch_size",
    "prefill_chunk_size", "kv_cache_size", "is_prefill", "attention_backend")
"""The columns of Vidur's ``attention.csv``: the record ``AttentionWrapper.profile`` returns
(``vidur/profiling/attention/attention_wrapper.py``) flattened as ``mlp.csv`` is, with sarathi's attention timers
(the files themselves are over the 4 MiB the mirror keeps, so this header is read from the code; the importer
selects columns by name, not position)."""

GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE = ("mlp_act", "attn_rope", "input_layernorm", "post_attention_layernorm", "add")
MLP_NEEDED = tuple(f"time_stats.{op}.median" for op in GEMMS) + (
    "n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp", "num_tokens", "num_tensor_parallel_workers")
ALL_REDUCE_NEEDED = ("time_stats.all_reduce.median", "num_workers", "size", "collective", "devices_per_node")
ATTENTION_NEEDED = ("n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers", "batch_size",
                    "prefill_chunk_size", "kv_cache_size", "is_prefill")

VIDUR_GPUS = {"a100": ("a100", "NVIDIA A100-SXM4-80GB (Vidur a100)"), "h100": ("h100", "NVIDIA H100 80GB HBM3 (Vidur h100)"),
              "a40": ("a40", "NVIDIA A40 (Vidur a40)")}
"""Vidur's GPU folder -> (kvsim catalogue GPU, the name the profile records). Vidur's SKUs
(``vidur/config/device_sku_config.py``): A100 312 TFLOPS 80 GB, H100 1000 TFLOPS 80 GB, A40 150 TFLOPS."""

US_PER_MS = 1000.0
ACTIVATION_BYTES = 2   # fp16 / bf16 operands and weights in every Vidur profile


class VidurError(ValueError):
    """A Vidur directory or CSV that cannot be imported; the message names the file, and the row and column."""


def read_csv(path: Path, needed: tuple[str, ...]) -> pd.DataFrame:
    """Read one Vidur CSV and check the columns the fit reads.

    Raises:
        VidurError: unreadable, a needed column missing, or a non-finite / negative number in one (naming the
            file, the column and the 1-based data row).
    """
    try:
        frame = pd.read_csv(path)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise VidurError(f"{path}: cannot read as CSV: {exc}") from None
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise VidurError(f"{path}: column {missing[0]} is missing (Vidur's layout: docs/profile-format.md)")
    for column in needed:
        if column in ("collective", "use_gated_mlp", "is_prefill"):
            continue
        values = pd.to_numeric(frame[column], errors="coerce")
        bad = ~np.isfinite(values.to_numpy(dtype=float)) | (values.to_numpy(dtype=float) < 0)
        if column.startswith("time_stats.") and column.endswith((".attn_prefill.median", ".attn_decode.median")):
            bad &= frame[column].notna().to_numpy()     # a prefill row has no decode time and vice versa
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise VidurError(f"{path}: row {row + 1}, column {column}: expected a finite number >= 0, got "
                             f"{frame[column].iloc[row]!r}")
        frame[column] = values
    return frame


def _gemm_params(frame: pd.DataFrame) -> np.ndarray:
    """Parameters per layer and worker of the four projections of each ``mlp.csv`` row (QKV with GQA, O, gate+up
    or up, down), ``head_dim = n_embd / n_head``."""
    h, ffn, tp = frame["n_embd"], frame["n_expanded_embd"], frame["num_tensor_parallel_workers"]
    head_dim = h / frame["n_head"]
    gated = frame["use_gated_mlp"].astype(str).str.lower().isin(("true", "1")).astype(float)
    qkv = h * (frame["n_head"] + 2 * frame["n_kv_head"]) * head_dim
    return ((qkv + frame["n_head"] * head_dim * h + h * ffn * (1 + gated) + ffn * h) / tp).to_numpy(dtype=float)


SMALL_TOKENS = 16
"""Rows of at most this many tokens are weight-streaming bound (their FLOP time is < 6% of the weight read on every
Vidur GPU): they give ``bw_efficiency``."""
LARGE_TOKENS = 2048
"""Rows of at least this many tokens are FLOP bound: they give ``flops_efficiency``."""


def fit_gemm(frame: pd.DataFrame, flops_per_s: float, bytes_per_s: float, by_tp: bool = True) -> dict:
    """``flops_efficiency`` and ``bw_efficiency`` of the four projections (module docstring), each the median
    achieved fraction of its own regime: weight bytes ``2 P`` over time at <= :data:`SMALL_TOKENS` tokens, FLOPs
    ``2 T P`` over time at >= :data:`LARGE_TOKENS`; the relative error of ``max`` of the two over every row
    (between the regimes the kernels' tile shapes make them slower than either bound, so the roofline is low there:
    the error's p90), per tensor-parallel degree, and (``by_tp``) the same fit of each degree's rows alone (a
    higher degree's smaller matrices stream at a lower fraction of the bandwidth).

    Raises:
        VidurError: no row in one of the two regimes.
    """
    params = _gemm_params(frame)
    tokens = frame["num_tokens"].to_numpy(dtype=float)
    measured_us = sum(frame[f"time_stats.{op}.median"].to_numpy(dtype=float) for op in GEMMS) * US_PER_MS
    keep = measured_us > 0
    params, tokens, measured_us = params[keep], tokens[keep], measured_us[keep]
    flop_us = 2 * tokens * params / (flops_per_s / 1e6)
    byte_us = ACTIVATION_BYTES * params / (bytes_per_s / 1e6)
    small, large = tokens <= SMALL_TOKENS, tokens >= LARGE_TOKENS
    if not small.any() or not large.any():
        raise VidurError(f"mlp.csv needs rows of <= {SMALL_TOKENS} and >= {LARGE_TOKENS} num_tokens to fit the GEMMs, "
                         f"got num_tokens {int(tokens.min()) if tokens.size else 0}-{int(tokens.max()) if tokens.size else 0}")
    e_b = float(np.median(byte_us[small] / measured_us[small]))
    e_f = float(np.median(flop_us[large] / measured_us[large]))
    model = np.maximum(flop_us / e_f, byte_us / e_b)
    errors = np.abs(model / measured_us - 1)
    tps = frame["num_tensor_parallel_workers"].to_numpy()[keep]
    out = {"flops_efficiency": round(e_f, 3), "bw_efficiency": round(e_b, 3), "fit_error": _error(errors),
           "fit_error_by_tp": {str(int(tp)): _error(errors[tps == tp]) for tp in np.unique(tps)}}
    if by_tp:
        out["by_tp"] = {str(int(tp)): {k: v for k, v in fit_gemm(frame[frame["num_tensor_parallel_workers"] == tp],
                                                                 flops_per_s, bytes_per_s, False).items()
                                       if k != "fit_error_by_tp"} for tp in np.unique(tps)}
    return out


def elementwise_efficiency(frame: pd.DataFrame, bytes_per_s: float) -> dict:
    """Achieved fraction of HBM bandwidth of the elementwise operators at >= 1024 tokens (median over rows) and
    their time per layer at one token (us: a launch-bound floor), per worker. Bytes per token read + written:
    SiLU-and-multiply ``3 ffn' P`` (gated; ``2 ffn' P`` else), RoPE ``2 (q + k) P``, two RMSNorms ``2 h P`` each,
    the residual add ``3 h P`` (``P`` = 2 bytes)."""
    h, tp = frame["n_embd"], frame["num_tensor_parallel_workers"]
    head_dim = h / frame["n_head"]
    gated = frame["use_gated_mlp"].astype(str).str.lower().isin(("true", "1")).astype(float)
    ffn = frame["n_expanded_embd"] / tp
    qk = (frame["n_head"] + frame["n_kv_head"]) * head_dim / tp
    per_token = ACTIVATION_BYTES * ((2 + gated) * ffn + 2 * qk + 2 * 2 * h + 3 * h)
    columns = [f"time_stats.{op}.median" for op in ELEMENTWISE if f"time_stats.{op}.median" in frame.columns]
    if not columns:
        return {}
    time_us = sum(pd.to_numeric(frame[c], errors="coerce").fillna(0.0) for c in columns) * US_PER_MS
    large = (frame["num_tokens"] >= 1024) & (time_us > 0)
    one = frame["num_tokens"] == 1
    fraction = (per_token * frame["num_tokens"] / (time_us * 1e-6) / bytes_per_s)[large]
    return {"bw_efficiency": round(float(fraction.median()), 3) if len(fraction) else None,
            "us_per_layer_at_1_token": round(float(time_us[one].median()), 1) if one.any() else None,
            "operators": [c.split(".")[1] for c in columns]}


def fit_attention(frame: pd.DataFrame, flops_per_s: float, bytes_per_s: float) -> dict:
    """Achieved fractions of attention (module docstring): decode, K/V bytes read (``batch kv_cache_size 2 H' D
    P``) over time, median over rows reading >= 64 MiB; prefill, FLOPs ``4 Hq' D C (K + (C + 1) / 2)`` over time,
    median over rows of >= 1024 chunk tokens."""
    head_dim = frame["n_embd"] / frame["n_q_head"]
    tp = frame["num_tensor_parallel_workers"]
    prefill = frame["is_prefill"].astype(str).str.lower().isin(("true", "1"))
    out = {}
    if "time_stats.attn_decode.median" in frame.columns:
        d = frame[~prefill]
        kv_bytes = d["batch_size"] * d["kv_cache_size"] * 2 * (d["n_kv_head"] / tp[~prefill]).clip(lower=1) * head_dim[~prefill] * ACTIVATION_BYTES
        t_s = d["time_stats.attn_decode.median"] / 1e3
        use = (kv_bytes >= 64 * 2 ** 20) & (t_s > 0)
        if use.any():
            out["decode_bw_efficiency"] = round(float((kv_bytes / t_s / bytes_per_s)[use].median()), 3)
            out["decode_rows"] = int(use.sum())
    if "time_stats.attn_prefill.median" in frame.columns:
        p = frame[prefill]
        chunk, context = p["prefill_chunk_size"], p["kv_cache_size"]
        flops = 4 * (p["n_q_head"] / tp[prefill]) * head_dim[prefill] * chunk * (context + (chunk + 1) / 2)
        t_s = p["time_stats.attn_prefill.median"] / 1e3
        use = (chunk >= 1024) & (t_s > 0)
        if use.any():
            out["prefill_flops_efficiency"] = round(float((flops / t_s / flops_per_s)[use].median()), 3)
            out["prefill_rows"] = int(use.sum())
    return out


def fit_all_reduce(frame: pd.DataFrame, path: Path) -> dict:
    """``base + hop (n - 1) + 2 (n - 1) / n * bytes / busbw`` over the rows of one node (``devices_per_node ==
    num_workers``, Vidur's own filter), the median over ranks of each (n, size), weighted least squares on
    relative error.

    Raises:
        VidurError: no all-reduce row of two or more GPUs in one node.
    """
    rows = frame[(frame["collective"] == "all_reduce") & (frame["devices_per_node"] == frame["num_workers"])
                 & (frame["num_workers"] >= 2)]
    if rows.empty:
        raise VidurError(f"{path}: no all_reduce row with num_workers >= 2 and devices_per_node == num_workers")
    grouped = rows.groupby(["num_workers", "size"])["time_stats.all_reduce.median"].median().reset_index()
    n = grouped["num_workers"].to_numpy(dtype=float)
    nbytes = grouped["size"].to_numpy(dtype=float)
    t_us = grouped["time_stats.all_reduce.median"].to_numpy(dtype=float) * US_PER_MS
    keep = t_us > 0
    n, nbytes, t_us = n[keep], nbytes[keep], t_us[keep]
    design = np.column_stack([np.ones_like(n), n - 1, 2 * (n - 1) / n * nbytes]) / t_us[:, None]
    (base, hop, inverse_bw), *_ = np.linalg.lstsq(design, np.ones_like(t_us), rcond=None)
    base, hop = max(float(base), 0.0), max(float(hop), 0.0)
    if not inverse_bw > 0:
        raise VidurError(f"{path}: the all-reduce times do not grow with size; no bus bandwidth can be fitted")
    model = base + hop * (n - 1) + 2 * (n - 1) / n * nbytes * inverse_bw
    errors = np.abs(model / t_us - 1)
    return {"allreduce_base_us": round(base, 2), "allreduce_hop_us": round(hop, 2),
            "allreduce_bus_bytes_per_s": float(f"{1e6 / inverse_bw:.4g}"), "fit_error": _error(errors),
            "fit_error_by_ranks": {str(int(k)): _error(errors[n == k]) for k in np.unique(n)},
            "sizes_bytes": [int(nbytes.min()), int(nbytes.max())]}


def _error(errors: np.ndarray) -> dict:
    if errors.size == 0:
        return {"n": 0}
    return {"median": round(float(np.median(errors)), 4), "p90": round(float(np.percentile(errors, 90)), 4),
            "max": round(float(np.max(errors)), 4), "n": int(errors.size)}


def builtin_vmm_section() -> dict:
    """The committed ``profiles/h200.json`` ``vmm`` section as quantiles only (Vidur measures no VMM call)."""
    path = Path(__file__).resolve().parents[2] / "profiles" / "h200.json"
    vmm = json.loads(path.read_text())["vmm"]
    return {call: {size: {"n": entry.get("n"), "quantiles_us": entry["quantiles_us"]} for size, entry in sizes.items()}
            for call, sizes in vmm.items()}


def model_slug(model_dir: str) -> str:
    """``meta-llama/Llama-2-7b-hf`` -> ``llama-2-7b``; ``meta-llama/Meta-Llama-3-8B`` -> ``llama-3-8b``."""
    name = model_dir.rstrip("/").split("/")[-1].lower()
    name = name[:-3] if name.endswith("-hf") else name
    return name[5:] if name.startswith("meta-") else name


def fit_profile(root: Path, gpu_dir: str, model_dir: str, provenance: dict | None = None) -> dict:
    """A ``kvsim-profile/1`` profile from Vidur's CSVs for one GPU folder and model under ``root`` (a Vidur checkout
    or any directory with its ``data/profiling`` layout).

    Args:
        root: the directory holding ``data/profiling``. gpu_dir: ``a100``, ``h100`` or ``a40``.
        model_dir: the model's folder under the GPU's (``meta-llama/Llama-2-7b-hf``).
        provenance: recorded as ``compute.vidur`` besides the file paths (repository, commit, date).
    Raises:
        VidurError: an unknown GPU folder, a missing ``mlp.csv``, or a bad CSV (naming file, row and column).
    """
    if gpu_dir not in VIDUR_GPUS:
        raise VidurError(f"GPU folder {gpu_dir!r}: kvsim knows Vidur's {', '.join(VIDUR_GPUS)}")
    kvsim_gpu, gpu_name = VIDUR_GPUS[gpu_dir]
    gpu = get_gpu(kvsim_gpu)
    compute_dir = root / "data" / "profiling" / "compute" / gpu_dir / model_dir
    mlp_path = compute_dir / "mlp.csv"
    if not mlp_path.is_file():
        raise VidurError(f"{mlp_path}: missing (Vidur's layout: data/profiling/compute/<gpu>/<org>/<model>/mlp.csv)")
    mlp = read_csv(mlp_path, MLP_NEEDED)
    gemm = fit_gemm(mlp, gpu.bf16_flops, gpu.mem_bw_bytes_per_s)
    single = gemm.get("by_tp", {}).get("1", gemm)   # one GPU's whole matrices (module docstring)
    roofline = {"flops_efficiency": single["flops_efficiency"], "bw_efficiency": single["bw_efficiency"]}
    files = [str(mlp_path.relative_to(root))]
    notes = []
    attention_path = compute_dir / "attention.csv"
    attention = {}
    if attention_path.is_file():
        attention = fit_attention(read_csv(attention_path, ATTENTION_NEEDED), gpu.bf16_flops, gpu.mem_bw_bytes_per_s)
        files.append(str(attention_path.relative_to(root)))
        if "decode_bw_efficiency" in attention:
            roofline["attention_bytes_factor"] = round(single["bw_efficiency"] / attention["decode_bw_efficiency"], 3)
        if "prefill_flops_efficiency" in attention:
            roofline["attention_flops_efficiency"] = round(attention["prefill_flops_efficiency"]
                                                           / single["flops_efficiency"], 3)
    else:
        notes.append(f"{attention_path.relative_to(root)} absent: attention keeps kvsim's defaults")
    network_path = root / "data" / "profiling" / "network" / f"{gpu_dir}_dgx" / "all_reduce.csv"
    all_reduce = {}
    if network_path.is_file():
        all_reduce = fit_all_reduce(read_csv(network_path, ALL_REDUCE_NEEDED), network_path)
        roofline.update({k: all_reduce[k] for k in ("allreduce_base_us", "allreduce_hop_us", "allreduce_bus_bytes_per_s")})
        files.append(str(network_path.relative_to(root)))
    else:
        notes.append(f"{network_path.relative_to(root)} absent: all-reduces keep NCCL's cost model")
    vidur = dict(provenance or {}, files=files, gpu_folder=gpu_dir, model=model_dir)
    return {
        "format": "kvsim-profile/1",
        "created_by": (provenance or {}).get("command", "kvsim calibrate --from-vidur"),
        "environment": {"gpu_name": gpu_name, "date": (provenance or {}).get("date")},
        "vmm": builtin_vmm_section(),
        "vmm_source": "not measured by Vidur: the quantiles of kvsim's built-in profiles/h200.json vmm section",
        "compute": {
            "roofline": roofline, "gpu_name": gpu_name, "model": model_slug(model_dir), "vidur": vidur,
            "gemm": gemm, "elementwise": elementwise_efficiency(mlp, gpu.mem_bw_bytes_per_s),
            "attention": attention, "all_reduce": all_reduce, "notes": notes,
            "method": "Vidur's median CUDA kernel times (ms -> us); GEMMs: median achieved fraction of the weight "
                      "read at <= 16 tokens (e_B) and of the FLOPs at >= 2048 tokens (e_F); all-reduce: weighted least squares on "
                      "relative error (hwbackend/calibration/vidur.py)",
        },
    }


def discover(root: Path) -> list[tuple[str, str]]:
    """``(gpu folder, model folder)`` of every ``mlp.csv`` under ``root/data/profiling/compute`` of a known GPU,
    sorted."""
    base = root / "data" / "profiling" / "compute"
    found = []
    for path in sorted(base.glob("*/*/*/mlp.csv")):
        gpu_dir = path.parts[-4]
        if gpu_dir in VIDUR_GPUS:
            found.append((gpu_dir, f"{path.parts[-3]}/{path.parts[-2]}"))
    return found


def import_directory(root: Path, out_dir: Path, provenance: dict | None = None, force: bool = False) -> list[Path]:
    """Write ``vidur-<gpu>-<model>.json`` into ``out_dir`` for every GPU and model under ``root`` (:func:`discover`).

    Raises:
        VidurError: no ``mlp.csv`` under ``root``, a bad CSV, or an existing output without ``force``.
    """
    pairs = discover(root)
    if not pairs:
        raise VidurError(f"{root}: no data/profiling/compute/<gpu>/<org>/<model>/mlp.csv of {', '.join(VIDUR_GPUS)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for gpu_dir, model_dir in pairs:
        target = out_dir / f"vidur-{gpu_dir}-{model_slug(model_dir)}.json"
        if target.exists() and not force:
            raise VidurError(f"{target} exists; pass --force to replace it")
        profile = fit_profile(root, gpu_dir, model_dir, provenance)
        target.write_text(json.dumps(profile, indent=1, allow_nan=False) + "\n")
        written.append(target)
    return written


def default_provenance(root: Path, command: str) -> dict:
    """Repository, commit (``git rev-parse HEAD`` of ``root``, or of a bare mirror given as ``root``'s
    ``.git``), and the UTC date of the import."""
    import subprocess

    commit = None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"repository": "https://github.com/microsoft/vidur", "commit": commit, "command": command,
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")}


__all__ = ["ALL_REDUCE_COLUMNS", "ATTENTION_COLUMNS", "MLP_COLUMNS", "VidurError", "fit_profile", "import_directory"]
