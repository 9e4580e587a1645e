"""``kvsim validate``: the simulator against a hardware replay of the same trace slice and configuration.

The hardware run directory (``python -m hwbackend.replay.cli``, or a fresh replay when a GPU is present)
holds the configuration (``config.json``) and, in ``requests.parquet``, every replayed request's arrival
(already rate-scaled), prompt and output tokens: :func:`trace_of_run` rebuilds the replayed trace slice
from them (runs written before that carried it as ``trace.parquet``, still read). The simulator
(:func:`sim.core.runner.run_simulation`) runs that same :class:`sim.setup.config.SimConfig` on that same table. The error of a statistic is ``sim / hw - 1``.

Compared (percentiles linear-interpolated, as ``analysis.results``): iteration latency, TTFT, TPOT
(finished requests) and E2E at p50 / p90 / p99; TBT at p50 / p90 / p99 (nearest rank over all output tokens,
:func:`sim.results.records.tbt_stats_us`) where the hardware run recorded it (replays since 2026-12-01); synchronous mapping stall (total of the mapping part,
:func:`hwbackend.calibration.inloop.mapping_stall_us`: the replay's stall also times the policy step on the host
every iteration, which the simulator does not count as a stall; and the number of iterations that mapped on
the critical path); page groups mapped (total and synchronous); peak mapped memory.

Bad input is refused before anything is simulated (:class:`analysis.output.OutputDir` for ``--out``,
:func:`load_hw_run`, :func:`check_profile`, :func:`check_out_dir` for :func:`validate_run`'s ``out_dir``): one :class:`RunInputError` (a ValueError) line naming the file, the field / column / row
and the value; ``kvsim validate`` prints it as ``kvsim validate: ...`` and exits 2.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from hwbackend.calibration.run_files import RunInputError, _read_parquet, load_hw_run
from sim.setup.config import SimConfig

LATENCY_METRICS = (("iteration latency", "iterations", "duration_us", 1e3, "ms"),
                   ("TTFT", "requests", "ttft_us", 1e3, "ms"), ("TPOT", "requests", "tpot_us", 1e3, "ms"),
                   ("E2E", "requests", "e2e_us", 1e6, "s"))
TARGETS = {50: 0.05, 99: 0.10}  # issue 5: |error| <= 5% at p50, <= 10% at p99 (iteration, TTFT, TPOT)


def _values(run, table: str, column: str) -> np.ndarray:
    frame = run.iterations if table == "iterations" else run.requests[run.requests["status"] == "finished"]
    values = frame[column].to_numpy(dtype=float)
    return values[np.isfinite(values)]


def _percentile(values: np.ndarray, q: float) -> float:
    """``np.percentile`` (linear), NaN for no values (a simulation that finished no request)."""
    return float(np.percentile(values, q)) if len(values) else float("nan")


def error_table(hw, sim) -> pd.DataFrame:
    """Rows ``metric, stat, unit, hw, sim, error`` (error = sim / hw - 1; NaN where hw is 0)."""
    rows = []
    for name, table, column, scale, unit in LATENCY_METRICS:
        hw_values, sim_values = _values(hw, table, column), _values(sim, table, column)
        for q in (50, 90, 99):
            rows.append((name, f"p{q}", unit, _percentile(hw_values, q) / scale, _percentile(sim_values, q) / scale))
    if "tbt_p50_ms" in hw.summary and "tbt_p50_ms" in sim.summary:   # replays since 2026-12-01 record TBT
        for q in (50, 90, 99):
            rows.append(("TBT", f"p{q}", "ms", float(hw.summary[f"tbt_p{q}_ms"]), float(sim.summary[f"tbt_p{q}_ms"])))
    for (name, unit, hw_value), (_, _, sim_value) in zip(_memory_stats(hw), _memory_stats(sim)):
        rows.append((name, "total", unit, hw_value, sim_value))
    frame = pd.DataFrame(rows, columns=["metric", "stat", "unit", "hw", "sim"])
    frame["error"] = np.where(frame["hw"] != 0, frame["sim"] / frame["hw"].where(frame["hw"] != 0) - 1, np.nan)
    return frame


def _memory_stats(run) -> list[tuple[str, str, float]]:
    it, s = run.iterations, run.summary
    from hwbackend.calibration.inloop import mapping_stall_us

    return [("sync mapping stall", "ms", float(mapping_stall_us(it)[0].sum()) / 1e3),
            ("iterations mapping synchronously", "count", float((it["sync_map_page_groups"] > 0).sum())),
            ("page groups mapped", "count", float(s["map_page_groups"])),
            ("page groups mapped synchronously", "count", float(it["sync_map_page_groups"].sum())),
            ("peak mapped memory", "GiB", float(s["peak_mapped_bytes"]) / 2**30)]


def check_targets(table: pd.DataFrame) -> list[str]:
    """Targets missed (iteration latency, TTFT, TPOT at p50 and p99; TBT at p99, issue 19), one line each with
    the figure."""
    missed = []
    for _, row in table.iterrows():
        q = int(row["stat"][1:]) if row["stat"].startswith("p") else None
        targeted = row["metric"] in ("iteration latency", "TTFT", "TPOT") or (row["metric"] == "TBT" and q == 99)
        if targeted and q in TARGETS and abs(row["error"]) > TARGETS[q]:
            missed.append(f"{row['metric']} {row['stat']}: {row['error']:+.1%} (target {TARGETS[q]:.0%})")
    return missed


def markdown_table(table: pd.DataFrame) -> str:
    """The error table as GitHub markdown."""
    lines = ["| metric | stat | unit | hardware | simulator | error |", "|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        error = "n/a" if not np.isfinite(r["error"]) else f"{r['error']:+.1%}"
        lines.append(f"| {r['metric']} | {r['stat']} | {r['unit']} | {r['hw']:.4g} | {r['sim']:.4g} | {error} |")
    return "\n".join(lines)


def overlay_html(hw, sim, path: str | Path, title: str) -> Path:
    """Per-iteration latency over time, hardware and simulator overlaid (plotly, JS from the CDN)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for run, name in ((hw, "hardware"), (sim, "simulator")):
        it = run.iterations
        fig.add_trace(go.Scattergl(x=(it["start_at_us"] / 1e6).round(4), y=(it["duration_us"] / 1e3).round(3),
                                   mode="markers", marker={"size": 3}, name=name, opacity=0.6))
    fig.update_layout(title=title, xaxis_title="iteration start (s)", yaxis_title="iteration latency (ms)",
                      template="plotly_white")
    path = Path(path)
    fig.write_html(path, include_plotlyjs="cdn")
    return path


def simulate(config: SimConfig, trace: pd.DataFrame, profile: str | None, compute_model: str = "auto"):
    """The simulator's run (:func:`sim.core.runner.run_simulation`) with the profile's compute model
    (:data:`sim.core.runner.COMPUTE_MODELS`; ``auto``: in-loop fit, else tiled, else roofline).

    Raises:
        ValueError: a compute model the profile does not hold (or any but auto/roofline without a profile).
    """
    from sim.core.runner import run_simulation

    return run_simulation(config, trace, profile, compute_model=compute_model)


def trace_of_run(hw_dir: str | Path, requests: pd.DataFrame) -> pd.DataFrame:
    """The canonical trace a hardware run replayed: ``trace.parquet`` if the run has one, else rebuilt from
    its request records (arrival us -> s; the simulator re-quantises arrivals to 100 ns, so the rebuilt table
    simulates bit-identically to the original slice: ``tests/test_validate.py``)."""
    path = Path(hw_dir) / "trace.parquet"
    if path.exists():
        trace = _read_parquet(path)
        trace.attrs["source"] = str(path)
        return trace
    from traces.canonical import build_table

    ordered = requests.sort_values(["arrival_at_us", "request_id"], kind="stable")
    return build_table(ordered["arrival_at_us"].to_numpy(dtype=float) / 1e6, ordered["prompt_tokens"].to_numpy(),
                       ordered["output_tokens"].to_numpy(), f"{hw_dir}/requests.parquet (replayed requests)")


def same_batches_error(hw_dir: str | Path, config: SimConfig, profile: str | None,
                       compute_model: str = "auto") -> pd.DataFrame | None:
    """The compute model on the hardware's own batches: per iteration of the run (its ``shapes.parquet``), the
    simulator's compute time against the measured one (``duration_us`` minus the mapping part of the stall,
    :func:`hwbackend.calibration.inloop.load_rows`). Separates the compute model's error from the divergence of
    the simulated schedule. Rows ``stat, hw_ms, sim_ms, error`` for p50 / p90 / p99 of the two
    distributions, plus the median and p90 of the per-iteration ``|sim / hw - 1|``; None without
    ``shapes.parquet``."""
    if not (Path(hw_dir) / "shapes.parquet").is_file():
        return None
    from sim.core.runner import load_models
    from hwbackend.calibration.inloop import InLoopError, load_rows, shape_columns

    try:
        rows, _ = load_rows(hw_dir)
    except InLoopError:
        raise
    except (ValueError, OSError) as exc:  # Arrow errors: a truncated or corrupt table
        raise RunInputError(f"{hw_dir}: iterations.parquet or shapes.parquet unreadable or corrupt ({exc})") from None
    _, compute = load_models(config, profile, compute_model)
    if compute.wave_us_per_token and rows["max_context_tokens"].isna().any():
        return None  # the run predates max_context_tokens: the model's wave term cannot be evaluated
    predicted = compute.iteration_us_array(*shape_columns(rows))
    measured = rows["target_us"].to_numpy(dtype=float)
    records = [(f"p{q}", np.percentile(measured, q) / 1e3, np.percentile(predicted, q) / 1e3) for q in (50, 90, 99)]
    frame = pd.DataFrame(records, columns=["stat", "hw_ms", "sim_ms"])
    frame["error"] = frame["sim_ms"] / frame["hw_ms"] - 1
    per_iteration = np.abs(predicted / measured - 1)
    extra = pd.DataFrame([("per-iteration |error| median", np.nan, np.nan, float(np.median(per_iteration))),
                          ("per-iteration |error| p90", np.nan, np.nan, float(np.percentile(per_iteration, 90)))],
                         columns=frame.columns)
    tpot = tpot_on_hardware_schedule(rows, predicted + rows["mapping_us"].to_numpy(dtype=float),
                                     pd.read_parquet(Path(hw_dir) / "requests.parquet"))
    same = pd.concat([frame, extra, tpot], ignore_index=True)
    same.attrs["bins"] = binned_error(rows, predicted, measured)
    return same


CONTEXT_BINS_TOKENS = (0, 1024, 2048, 3072, 4096, 6144, 8192, 16384, 32768, float("inf"))
BATCH_BINS = (1, 2, 5, 9, 17, 33, 65, 129, float("inf"))


def binned_error(rows: pd.DataFrame, predicted_us: np.ndarray, measured_us: np.ndarray) -> pd.DataFrame:
    """Where the compute model extrapolates: the per-iteration error on the hardware's own batches by bins of
    the longest context in the batch (:data:`CONTEXT_BINS_TOKENS`, tokens) and of the batch size
    (:data:`BATCH_BINS`, sequences). Rows ``by, bin, iterations, hw_p50_ms, sim_p50_ms, error_p50`` (the p50s'
    ratio minus 1) ``, abs_error_median`` (median of the per-iteration ``|sim / hw - 1|``); empty bins left out."""
    error = np.abs(predicted_us / measured_us - 1)
    records = []
    for by, values, edges in (("longest context (tokens)", rows["max_context_tokens"].to_numpy(dtype=float),
                               CONTEXT_BINS_TOKENS),
                              ("batch size", rows["batch_size"].to_numpy(dtype=float), BATCH_BINS)):
        for low, high in zip(edges[:-1], edges[1:]):
            inside = (values >= low) & (values < high)
            if not inside.any():
                continue
            label = f"{low:,.0f}+" if high == float("inf") else (
                f"{low:,.0f}" if high - low == 1 else f"{low:,.0f}-{high - 1:,.0f}")
            hw_p50, sim_p50 = np.median(measured_us[inside]) / 1e3, np.median(predicted_us[inside]) / 1e3
            records.append((by, label, int(inside.sum()), hw_p50, sim_p50, sim_p50 / hw_p50 - 1,
                            float(np.median(error[inside]))))
    return pd.DataFrame(records, columns=["by", "bin", "iterations", "hw_p50_ms", "sim_p50_ms", "error_p50",
                                          "abs_error_median"])


def binned_markdown(bins: pd.DataFrame) -> str:
    """:func:`binned_error` as a markdown table."""
    lines = ["| by | bin | iterations | hardware p50 (ms) | simulator p50 (ms) | error at p50 | median abs error |",
             "|---|---|---|---|---|---|---|"]
    for _, r in bins.iterrows():
        lines.append(f"| {r['by']} | {r['bin']} | {r['iterations']:,} | {r['hw_p50_ms']:.4g} | {r['sim_p50_ms']:.4g} "
                     f"| {r['error_p50']:+.1%} | {r['abs_error_median']:.1%} |")
    return "\n".join(lines)


def tpot_on_hardware_schedule(rows: pd.DataFrame, modelled_us: np.ndarray, requests: pd.DataFrame) -> pd.DataFrame:
    """TPOT of the hardware's own schedule with each iteration's measured duration replaced by a modelled one.

    Every request keeps the iterations it ran in on the hardware (from the one that emitted its first token to
    the one that completed it); its TPOT is the sum of those iterations' durations over ``output_tokens - 1``,
    once measured (``duration_us``) and once modelled. The difference is the compute model's share of a TPOT
    error; what the full simulation adds on top comes from its schedule drifting from the hardware's.

    Args:
        rows: :func:`hwbackend.calibration.inloop.load_rows` rows (``iteration``, ``start_at_us``, ``duration_us``).
        modelled_us: modelled duration of each row, microseconds (the compute model plus the measured mapping
            part of the stall), shape ``(len(rows),)``.
        requests: the run's ``requests.parquet`` (finished requests with more than one output token count).

    Returns:
        Rows ``stat, hw_ms, sim_ms, error`` named ``TPOT pQ on the hardware's schedule`` for Q = 50, 90, 99
        (``hw_ms`` from the measured durations; matches the recorded TPOT up to the gaps between iterations).
    """
    order = np.argsort(rows["iteration"].to_numpy(), kind="stable")
    measured = rows["duration_us"].to_numpy(dtype=float)[order]
    ends_us = rows["start_at_us"].to_numpy(dtype=float)[order] + measured
    modelled = np.asarray(modelled_us, dtype=float)[order]
    done = requests[(requests["status"] == "finished") & (requests["output_tokens"] > 1)]
    # the iteration that emitted the first token / completed the request ends at that instant (1 us of slack)
    first = np.searchsorted(ends_us, done["first_token_at_us"].to_numpy(dtype=float) - 1.0)
    last = np.searchsorted(ends_us, done["completion_at_us"].to_numpy(dtype=float) - 1.0)
    tokens = done["output_tokens"].to_numpy(dtype=float) - 1
    records = []
    for durations, name in ((measured, "hw_ms"), (modelled, "sim_ms")):
        cumulative = np.concatenate(([0.0], np.cumsum(durations)))
        per_request = (cumulative[last + 1] - cumulative[first + 1]) / tokens
        records.append({q: np.percentile(per_request, q) / 1e3 for q in (50, 90, 99)} if len(per_request) else {})
    frame = pd.DataFrame([(f"TPOT p{q} on the hardware's schedule", records[0].get(q, np.nan), records[1].get(q, np.nan))
                          for q in (50, 90, 99)], columns=["stat", "hw_ms", "sim_ms"])
    frame["error"] = frame["sim_ms"] / frame["hw_ms"] - 1
    return frame


def _same_batches_markdown(frame: pd.DataFrame) -> str:
    lines = ["| compute time on the hardware's batches | hardware (ms) | simulator (ms) | error |", "|---|---|---|---|"]
    for _, r in frame.iterrows():
        hw_ms = "" if not np.isfinite(r["hw_ms"]) else f"{r['hw_ms']:.4g}"
        sim_ms = "" if not np.isfinite(r["sim_ms"]) else f"{r['sim_ms']:.4g}"
        error = f"{r['error']:.1%}" if r["stat"].startswith("per-iteration") else f"{r['error']:+.1%}"
        lines.append(f"| {r['stat']} | {hw_ms} | {sim_ms} | {error} |")
    return "\n".join(lines)


def matching_compute_model(run_config: dict, profile: str | None, compute_model: str) -> str:
    """``auto`` for a run that served decodes eagerly (no ``cuda_graphs`` in its config: the first session's
    runs) becomes ``tiled`` (else ``roofline``) when the profile's ``compute_in_loop`` was fitted on graphed
    decodes: that fit describes another loop. Any explicit choice is kept."""
    from sim.setup.catalog import is_profile_keyword

    if compute_model != "auto" or profile is None or is_profile_keyword(profile) or run_config.get("cuda_graphs"):
        return compute_model
    from sim.timing.latency import read_profile

    data = read_profile(profile)
    in_loop = ((data.get("compute_in_loop") or {}).get("params") or {})
    if not in_loop.get("decode_graphs"):
        return compute_model
    return "tiled" if ((data.get("compute") or {}).get("tiled_roofline") or {}).get("params") else "roofline"


def validate_run(hw_dir: str | Path, profile: str | None = None, out_dir: str | Path | None = None,
                 compute_model: str = "auto", shown_hw_dir: str | Path | None = None):
    """Simulate the hardware run's configuration and trace; returns ``(table, hw, sim, same)`` (``same``:
    :func:`same_batches_error`, None without ``shapes.parquet``) and writes ``validation.md``, ``errors.csv``
    and ``overlay.html`` into ``out_dir`` when given (replacing those three files there; ``kvsim validate``
    passes a staging directory, :func:`command`). ``validation.md`` names the run as ``shown_hw_dir`` (default
    ``hw_dir``).

    The run (:func:`load_hw_run`), the profile (:func:`check_profile`) and ``out_dir`` (:func:`check_out_dir`)
    are checked before anything is simulated.

    Raises:
        FileNotFoundError: the run directory, one of its files or the profile is missing.
        ValueError: a malformed run, profile or out_dir (:class:`RunInputError`, ``ProfileError``), one line
            naming the file, the field / column / row and the value.
    """
    hw, config = load_hw_run(hw_dir)
    check_profile(profile)
    if out_dir is not None:
        check_out_dir(out_dir, force=True)
    trace = trace_of_run(hw_dir, hw.requests)
    compute_model = matching_compute_model(hw.config, profile, compute_model)
    sim = simulate(config, trace, profile, compute_model)
    table = error_table(hw, sim)
    same = same_batches_error(hw_dir, config, profile, compute_model)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "errors.csv", index=False)
        missed = check_targets(table)
        resolved = sim.config["compute_model"]        # "roofline (compute.roofline of P)": said once
        shown_model = resolved if resolved.startswith(str(compute_model)) else f"{compute_model} ({resolved})"
        from sim.core.runner import effective_profile
        used = effective_profile(config, profile)
        shown_profile = (profile if profile is not None else
                         f"{Path(used).name}, {config.gpu}'s default" if used else "built-in")
        (out / "validation.md").write_text(
            f"# {config.label}: simulator vs hardware\n\nhardware run: `{shown_hw_dir or hw_dir}`; profile: `{shown_profile}`; "
            f"compute model: {shown_model}; VMM: {sim.config['vmm_latency_source']}\n\n"
            + markdown_table(table) + "\n\ntargets missed: " + ("; ".join(missed) or "none") + "\n"
            + ("" if same is None else "\nThe compute model on the hardware's own batches (`shapes.parquet`; hardware: "
               "duration minus the mapping part of the stall):\n\n" + _same_batches_markdown(same) + "\n"
               + "\nBy bins of the batch's longest context and of its size (where the model extrapolates):\n\n"
               + binned_markdown(same.attrs["bins"]) + "\n"))
        overlay_html(hw, sim, out / "overlay.html", f"{config.label}: per-iteration latency, hardware vs simulator")
    return table, hw, sim, same


def coverage_notes(profile: str | None, hw_dir: str | Path, config: SimConfig) -> list[str]:
    """The profile's coverage (``compute_in_loop.coverage``, written by ``kvsim calibrate --from-run``) as one
    line, then one warning line for each way the run leaves it: another model, a longer context, a larger
    decode-only or mixed batch (from the run's ``shapes.parquet``). Empty without a profile or coverage."""
    from sim.setup.catalog import is_profile_keyword

    if not profile or is_profile_keyword(profile):
        return []
    from sim.timing.latency import read_profile

    coverage = ((read_profile(profile).get("compute_in_loop") or {}).get("coverage")) or {}
    if not coverage:
        return []
    lines = [f"profile coverage: models {', '.join(coverage.get('models', []))}; contexts to "
             f"{coverage.get('max_context_tokens', 0):,} tokens; decode-only batches to {coverage.get('max_decode_batch', 0)}, "
             f"mixed batches to {coverage.get('max_mixed_batch', 0)} sequences"]
    if config.model not in coverage.get("models", [config.model]):
        lines.append(f"warning: the run's model {config.model} is not among the profile's models")
    shapes_path = Path(hw_dir) / "shapes.parquet"
    if shapes_path.is_file():
        shapes = pd.read_parquet(shapes_path)
        decode = shapes["new_tokens"] == shapes["logit_sequences"]
        checks = (("max_context_tokens", shapes.get("max_context_tokens", pd.Series([0])).max(), "context (tokens)"),
                  ("max_decode_batch", shapes.loc[decode, "logit_sequences"].max() if decode.any() else 0,
                   "decode-only batch (sequences)"),
                  ("max_mixed_batch", shapes.loc[~decode, "logit_sequences"].max() if (~decode).any() else 0,
                   "mixed batch (sequences)"))
        for key, value, what in checks:
            if key in coverage and value > coverage[key]:
                lines.append(f"warning: the run's largest {what} {int(value):,} exceeds the profile's "
                             f"{coverage[key]:,}: the fit extrapolates there")
    return lines


VALIDATION_FILES = ("validation.md", "errors.csv", "overlay.html")


def check_out_dir(out_dir: str | Path, force: bool = False) -> None:
    """``--out`` usable before anything is simulated: not an existing file, under writable folders (the nearest
    existing one a writable directory), and, unless ``force``, holding no validation (:data:`VALIDATION_FILES`)
    already (the convention of ``kvsim simulate`` / ``compare``: ``--force`` replaces those files, nothing else).

    Raises:
        RunInputError: the path is a file, or lies under a file or a folder that cannot be written.
        FileExistsError: it already holds a validation and ``force`` is false.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise RunInputError(f"--out {out} is a file, not a directory")
    existing = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise RunInputError(f"--out {out}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunInputError(f"--out {out}: {existing} is not writable")
    held = [name for name in VALIDATION_FILES if (out / name).exists()]
    if held and not force:
        raise FileExistsError(f"--out {out} already holds a validation ({', '.join(held)}); choose another --out or "
                              "pass --force")


def check_profile(profile: str | Path | None) -> None:
    """``--profile`` readable as a calibration profile (:func:`sim.timing.latency.read_profile`) before anything is
    simulated; None (the built-in latencies) passes.

    Raises:
        RunInputError: the path is a directory, or cannot be read.
        ProfileError: missing, not JSON, or not of format ``kvsim-profile/1`` (a ValueError naming the file).
    """
    from sim.setup.catalog import is_profile_keyword

    if profile is None or is_profile_keyword(profile):
        return
    from sim.timing.latency import read_profile

    path = Path(profile)
    if path.is_dir():
        raise RunInputError(f"--profile {path} is a directory, not a profile JSON file (kvsim calibrate writes one, "
                            "e.g. profiles/h200.json)")
    try:
        read_profile(path)
    except OSError as exc:
        raise RunInputError(f"--profile {path}: unreadable ({exc.strerror or exc})") from None


# options a saved hardware run already fixes (its config.json and request records), with their CLI defaults
_RUN_DEFINED = {"model": "llama-3-8b", "gpu": "h200", "tp": 1, "page_size": 2 * 1024 * 1024, "max_batch": None,
                "scheduler": None, "token_budget": None, "max_context": None, "engine": None,
                "frontend_overhead_ms": None, "sync_mapping": False,
                "no_deferred_reclaim": False, "skip_requests": 0, "num_requests": None, "rate_scale": 1.0, "seed": 0,
                "memory_util": 0.9, "kv_tier": None, "preemption": "recompute", "host_swap": 4 * 1024 ** 3,
                "trace": None, "trace_format": None, "arrival": None, "sample": None, "pp": 1, "weight_dtype": None,
                "kv_dtype": None, "device": "cuda:0"}
_FLAG_NAMES = {"trace_format": "format"}      # options whose flag is not the dest spelled with dashes


def command(args) -> int:
    """``kvsim validate``: against ``--hw-run DIR``, or a fresh replay (GPU) saved under ``--out``.

    ``--out`` is checked first with the rule of every kvsim result directory (:class:`analysis.output.OutputDir`:
    new or empty; ``--force`` replaces only a kvsim result as a whole; never a directory holding anything else,
    nor one of the inputs), then ``--profile``, then the run (:func:`validate_run`); the validation is written
    into a staging directory renamed over ``--out`` at the end. A bad one raises ValueError / OSError with one
    line naming the file, field and value (``hwbackend.cli`` prints it, exit 2).
    """
    from analysis.output import OutputDir, command_inputs, default_out_dir

    out = None
    if args.out or args.hw_run is None:    # a fresh replay is saved even without --out
        out = OutputDir(args.out or default_out_dir("validate"), getattr(args, "force", False),
                        inputs=command_inputs(args))
    check_profile(args.profile)
    if args.hw_run is None and _replay_unavailable() is not None:
        import sys
        print(f"kvsim: error: validate: no --hw-run and no usable GPU ({_replay_unavailable()}); pass --hw-run DIR",
              file=sys.stderr)
        return 2
    hw_dir = args.hw_run
    if hw_dir is not None:
        ignored = [f"--{_FLAG_NAMES.get(name, name).replace('_', '-')}" for name, default in _RUN_DEFINED.items()
                   if getattr(args, name, default) != default]
        if ignored:
            import sys
            print(f"kvsim: note: {', '.join(ignored)} ignored: the hardware run's own configuration and trace slice "
                  "are simulated", file=sys.stderr, flush=True)
    if out is None:
        table, hw, sim, same = validate_run(hw_dir, args.profile, None, getattr(args, "compute_model", "auto"))
    else:
        with out.writing() as stage:
            shown = hw_dir
            if hw_dir is None:
                hw_dir, shown = _fresh_replay(args, stage / "hw"), out.path / "hw"
            table, hw, sim, same = validate_run(hw_dir, args.profile, stage, getattr(args, "compute_model", "auto"),
                                                shown_hw_dir=shown)
    _print_validation(args, table, hw, sim, same, hw_dir)
    return 0


def _print_validation(args, table, hw, sim, same, hw_dir) -> None:
    run_config = hw.config     # (a --trace given beside --hw-run is noted as ignored by command())
    # the label of the settings simulated (config.json's own label was checked against them)
    print(f"{sim.config['label']} ({len(hw.requests)} requests, {len(hw.iterations)} hw iterations)")
    if sim.summary.get("compute_model"):      # which timing the simulator used (a default profile, or the roofline)
        from analysis.results import compute_model_text
        print(f"compute model: {compute_model_text(sim.summary['compute_model'], sim.config.get('gpu'))}")
    note = replay_compute_note(run_config, args.profile)
    if note:
        print(note)
    for line in coverage_notes(args.profile, hw_dir, load_hw_run(hw_dir)[1]):
        print(line)
    print(markdown_table(table))
    missed = check_targets(table)
    print("targets missed: " + ("; ".join(missed) or "none"))
    if same is not None:
        print("\n" + _same_batches_markdown(same))
        print("\nerror by bins of the batch's longest context and of its size (compute model on the hardware's "
              "batches):\n" + binned_markdown(same.attrs["bins"]))


def replay_compute_note(run_config: dict, profile_arg: str | None) -> str | None:
    """A note when the hardware run timed its compute on one replay compute and the profile's in-loop fit was made
    on the other (the run's ``compute``: ``harness``, the PyTorch forward of ``hwbackend.replay``, ~2x slower than
    engine kernels, or ``engine``; the profile's ``compute_in_loop.replay_compute``): the error table then
    measures the gap between the two computes, not the simulator (``docs/validation/engine-replay/README.md``).
    None when they agree, or the profile has no in-loop fit."""
    from types import SimpleNamespace

    from sim.core.runner import effective_profile
    from sim.timing.latency import read_profile

    try:          # (effective_profile reads only the configuration's GPU)
        path = effective_profile(SimpleNamespace(gpu=run_config.get("gpu", "h200")), profile_arg)
        fit = (read_profile(path).get("compute_in_loop") or {}) if path else {}
    except Exception:  # noqa: BLE001 - a bad profile is refused by its loader, naming it
        return None
    if not fit:
        return None
    run_compute, fit_compute = run_config.get("compute", "harness"), fit.get("replay_compute", "harness")
    if run_compute == fit_compute:
        return None
    hint = ("profiles/h200.json, fitted on harness replays" if run_compute == "harness"
            else "a profile fitted on engine replays, e.g. profiles/h200-engine.json")
    return (f"kvsim: note: the hardware run timed its compute on the {run_compute} and {path}'s in-loop fit was "
            f"made on {fit_compute} replays (the harness runs ~2x slower than engine kernels): the errors below "
            f"measure that gap, not the simulator; pass --profile for {hint}")


def _replay_unavailable() -> str | None:
    """Why a fresh replay cannot run here (no torch, no CUDA device), or None."""
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        import hwbackend.replay.cli  # noqa: F401
    except Exception as exc:  # no GPU or no torch: the comparison needs a saved run
        return str(exc)
    return None


def _fresh_replay(args, hw_out: Path) -> Path:
    """Replay the workload of ``args`` on the GPU and save the run in ``hw_out``."""
    from sim.frontend.options import config_from_args
    from traces.workload import load_workload
    from hwbackend.replay.cli import replay, write_hw_run

    config = config_from_args(args)
    trace, _ = load_workload(args, config.seed, config.slot_max_tokens)
    output, meta = replay(config, trace, args.device)
    meta.update(trace_source=trace.attrs.get("source", args.trace), rate_scale=args.rate_scale,
                num_requests=args.num_requests, skip_requests=args.skip_requests)
    return write_hw_run(output, config, meta, hw_out)
