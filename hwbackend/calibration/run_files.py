"""Hardware run directories (``python -m hwbackend.replay.cli``): reading and checking ``config.json``,
``summary.json`` and the tables before anything is computed from them.

Bad input is one :class:`RunInputError` (a ValueError) line naming the file, the field / column / row and the
value. Used by :mod:`hwbackend.calibration.validate` and :mod:`hwbackend.calibration.inloop`.
"""
from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import pandas as pd

from sim.setup.config import SimConfig

SHAPE_FIELDS = ("new_tokens", "attention_pairs", "kv_read_tokens", "logit_sequences", "max_context_tokens")
"""Columns of a replay's ``shapes.parquet`` besides ``iteration`` (the batch shape of each iteration)."""


class RunInputError(ValueError):
    """A hardware run directory (or ``--out`` / ``--profile`` path) that cannot be validated against; the one-line
    message names the file, the field / column / row and the offending value."""


# SimConfig fields a hardware run's config.json may lack: added after the first committed hardware runs
# (docs/validation/hw-async); absent means the default, which is what those runs ran with. Every other SimConfig
# field is required (python -m hwbackend.replay.cli writes SimConfig.to_dict(), so every run it wrote has them):
# a field added to SimConfig later belongs here, with a default that reproduces the older runs.
RUN_OPTIONAL_FIELDS = ("memset_bytes_per_s", "copy_bytes_per_s", "allow_long_context", "admission", "pp",
                       "weight_dtype", "kv_dtype", "usd_per_gpu_hour",   # these four: issue 21, defaults = before it
                       "engine", "frontend_overhead_us", "cuda_graph_decodes",   # issue 31, defaults = before it
                       "paged_kernel", "paged_prefill_factor", "paged_decode_factor", "vmm_driver",   # issue 28
                       "kv_tiers", "tier_write_policy", "tier_load_policy", "prefix_evict",   # issue 35
                       "window_alloc",                                           # issue 33: off = before it
                       "explicit_fields",                                        # 2026-12-02: () = before it
                       "null_blocks")                                            # stop 52: 0 = before it
RUN_FIELD_DEFAULTS = {"admission": "chunk"}
"""Settings of runs recorded before the field existed: replays before 2026-12-01 admitted a request when its
first chunk fitted (``chunk``), whatever the scheduler."""

# the CLI flag in a SimConfig / catalogue message -> the config.json field it stands for
_FIELD_OF_FLAG = {"--page-size": "page_size_bytes", "--max-batch": "max_batch_slots", "--token-budget": "token_budget",
                  "--max-context": "max_context_tokens", "--memory-util": "memory_util_frac", "--scheduler": "scheduler",
                  "--preemption": "preemption", "--tp": "tp", "--pp": "pp", "--weight-dtype": "weight_dtype",
                  "--kv-dtype": "kv_dtype", "--usd-per-gpu-hour": "usd_per_gpu_hour"}

# derived sizes config.json records next to the settings (SimConfig.to_dict); checked where present
_DERIVED_FIELDS = ("label", "num_sub_tensors", "slot_max_tokens", "tokens_per_page", "page_group_bytes",
                   "kv_budget_bytes", "pool_page_groups", "needs_modified_driver")


def _json(value) -> str:
    """``value`` as it reads in a JSON file (null, true, "lots", [1, 2])."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _type_error(kind: str, value) -> str | None:
    """What is wrong with ``value`` for a SimConfig field annotated ``kind`` (``int``, ``float | None``, ...);
    None when it fits. JSON booleans only for ``bool``; ``int`` takes whole numbers only; floats must be finite."""
    base, nullable = kind.replace(" | None", ""), kind.endswith("| None")
    if value is None:
        return None if nullable else f"must not be null (expected {_KIND_WORDS[base]})"
    if base == "bool":
        ok = isinstance(value, bool)
    elif base == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and bool(np.isfinite(value))
    elif base == "tuple":
        ok = isinstance(value, list)
    else:
        ok = isinstance(value, str)
    if ok:
        return None
    return f"expected {_KIND_WORDS[base]}{' or null' if nullable else ''}, got {_json(value)}"


_KIND_WORDS = {"tuple": "a JSON list", "bool": "a JSON boolean (true/false)", "int": "a whole number", "float": "a finite number",
               "str": "a string"}


def config_from_run(config: dict, source: str | None = None) -> SimConfig:
    """The :class:`SimConfig` recorded in a run's ``config.json`` (derived and extra keys ignored).

    Every SimConfig field but :data:`RUN_OPTIONAL_FIELDS` must be present; each must have its field's JSON type
    (booleans ``true``/``false``, whole numbers for counts and byte sizes, finite numbers, strings, ``null`` only
    where the field allows it); model and GPU must be catalogue names.

    Args:
        config: the parsed ``config.json``.
        source: the file, to start every message with (e.g. ``runs/x/config.json``); None: no prefix (the
            caller adds one).

    Raises:
        RunInputError: not a JSON object, a missing field, a value of the wrong type or an impossible one; one
            line naming the field and the value (and ``source``).
    """
    from sim.setup.catalog import get_gpu, get_model
    from sim.setup.config import KV_LAYOUTS, POLICIES, PREEMPTION_MODES, SCHEDULERS, ZERO_MODES

    where = f"{source}: " if source else ""
    if not isinstance(config, dict):
        raise RunInputError(f"{where}expected a JSON object of settings, got a JSON {type(config).__name__}")
    kinds = {f.name: str(f.type) for f in fields(SimConfig)}
    missing = [name for name in kinds if name not in config and name not in RUN_OPTIONAL_FIELDS]
    if missing:
        raise RunInputError(f"{where}missing field(s) {', '.join(missing)} (a hardware run's config.json states every "
                            "setting it ran with; python -m hwbackend.replay.cli writes them all)")
    for name, kind in kinds.items():
        problem = _type_error(kind, config[name]) if name in config else None
        if problem:
            raise RunInputError(f"{where}field {name!r}: {problem}")
    choices = {"scheduler": SCHEDULERS, "policy": POLICIES, "kv_layout": KV_LAYOUTS, "zero_on_reuse": ZERO_MODES,
               "preemption": PREEMPTION_MODES}
    for name, allowed in choices.items():
        if config[name] not in allowed:
            raise RunInputError(f"{where}field {name!r}: {_json(config[name])} is not one of {', '.join(allowed)}")
    for name, lookup in (("model", get_model), ("gpu", get_gpu)):
        try:
            lookup(config[name])
        except ValueError as exc:
            raise RunInputError(f"{where}field {name!r}: {exc}") from None
    for name, kind in kinds.items():      # JSON lists back to the tuples SimConfig holds (KV tiers)
        if name == "kv_tiers" and config.get(name):
            raise RunInputError(f"{where}field {name!r}: {_json(config[name])}: a hardware run has no KV tiers "
                                "(the replay serves HBM only)")
    try:
        return SimConfig(**{k: (tuple(v) if kinds[k] == "tuple" else v)
                            for k, v in {**RUN_FIELD_DEFAULTS, **config}.items() if k in kinds})
    except ValueError as exc:  # ConfigError / CatalogError: phrased for the command line; name the fields instead
        message = str(exc)
        for flag, name in _FIELD_OF_FLAG.items():
            message = re.sub(rf"{re.escape(flag)}(?![\w-])", name, message)
        raise RunInputError(f"{where}{message}") from None


def check_recorded_sizes(config: SimConfig, recorded: dict, source: str) -> None:
    """The derived sizes and label a run's ``config.json`` records (:meth:`SimConfig.to_dict`: ``label``,
    ``pool_page_groups``, ``page_group_bytes``, ...; checked where present) must be those of its settings:
    otherwise the file was edited, or the catalogue changed since the run, and the simulation would not be of
    the configuration the hardware ran.

    Raises:
        RunInputError: naming ``source``, the field, the recorded and the derived value.
    """
    derived = config.to_dict()
    for name in _DERIVED_FIELDS:
        if name in recorded and recorded[name] != derived[name]:
            raise RunInputError(f"{source}: field {name!r} records {_json(recorded[name])} but the run's settings give "
                                f"{_json(derived[name])} (edited file, or a changed catalogue): fix the file")


# columns of the hardware run's tables that validation reads: name -> kind (tokens: whole numbers >= 1;
# count: whole numbers >= 0; time: finite and >= 0 (us); instant: finite (us); numeric: any number, NaN allowed; text)
RUN_COLUMNS = {
    "requests.parquet": {"request_id": "numeric", "arrival_at_us": "instant", "prompt_tokens": "tokens",
                         "output_tokens": "tokens", "status": "text", "ttft_us": "numeric", "tpot_us": "numeric",
                         "e2e_us": "numeric"},
    "iterations.parquet": {"start_at_us": "instant", "duration_us": "time", "sync_stall_us": "time",
                           "sync_map_page_groups": "count"},
}
SUMMARY_FIELDS = ("map_page_groups", "peak_mapped_bytes")


TBT_FIELDS = ("tbt_p50_ms", "tbt_p90_ms", "tbt_p99_ms")
"""The hardware run's TBT percentiles (replays since 2026-12-01 record them): all three or none."""


def _check_summary(path: Path, summary: dict) -> None:
    """:data:`SUMMARY_FIELDS` (finite numbers >= 0) and, when any is there, every one of :data:`TBT_FIELDS`
    (finite numbers >= 0, ms).

    Raises:
        RunInputError: naming the file, the field and the value.
    """
    tbt = [name for name in TBT_FIELDS if name in summary]
    for name in SUMMARY_FIELDS + (TBT_FIELDS if tbt else ()):
        if name not in summary:
            also = f" (the run records {', '.join(tbt)}: TBT percentiles come as p50, p90 and p99)" if tbt else ""
            raise RunInputError(f"{path}: missing field {name!r}{also}")
        value = summary[name]
        problem = _type_error("float", value) or (f"must be >= 0, got {_json(value)}" if value < 0 else None)
        if problem:      # (a null in the file is read as NaN: sim.results.json_text)
            raise RunInputError(f"{path}: field {name!r}: {problem}")


def _check_finished_latencies(path: Path, requests: pd.DataFrame, ids: pd.Series | None) -> None:
    """A finished request's TTFT and E2E latency are finite and >= 0, its TPOT >= 0 (NaN only for a single
    output token, which has no gap); a negative or missing latency would enter the percentiles compared.

    Raises:
        RunInputError: naming the file, the row (and request id), the column and the value.
    """
    finished = (requests["status"] == "finished").to_numpy()
    single = requests["output_tokens"].to_numpy() <= 1
    for column in ("ttft_us", "e2e_us", "tpot_us"):
        values = pd.to_numeric(requests[column], errors="coerce").to_numpy(dtype=np.float64)
        bad = finished & (~np.isfinite(values) | (values < 0))
        if column == "tpot_us":
            bad &= ~(single & np.isnan(values))        # one output token: no gap, TPOT undefined
        if bad.any():
            row = int(np.argmax(bad))
            who = f" (request_id {_scalar(ids.iloc[row])!r})" if ids is not None else ""
            raise RunInputError(f"{path}: row {row + 1}{who}: column {column} of a finished request must be a finite "
                                f"number >= 0 (us), got {_scalar(requests[column].iloc[row])!r}")


def check_columns(frame: pd.DataFrame, path: str | Path, columns: dict[str, str],
                  ids: pd.Series | None = None) -> None:
    """Every column of ``columns`` (name -> kind, as :data:`RUN_COLUMNS`) present in ``frame`` with values of its
    kind: ``tokens`` whole numbers >= 1, ``count`` whole numbers >= 0, ``time`` finite numbers >= 0 (us),
    ``instant`` finite numbers (us), ``numeric`` numbers (NaN allowed), ``text`` strings.

    Args:
        path: the file read, for messages.
        ids: per row, an id to name next to the row (e.g. ``request_id``).

    Raises:
        RunInputError: naming the file and the missing columns, or the column, the first bad row (1-based)
            and its value.
    """
    from traces.fields import MAX_TOKENS

    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise RunInputError(f"{path}: missing column(s) {', '.join(missing)}")
    for column, kind in columns.items():
        values = frame[column]
        if kind == "text":
            if not (pd.api.types.is_string_dtype(values) or values.dtype == object):
                raise RunInputError(f"{path}: column {column!r}: expected text, not {values.dtype}")
            continue
        if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
            raise RunInputError(f"{path}: column {column!r}: expected numbers, not {values.dtype}")
        if kind == "numeric":
            continue
        array = values.to_numpy(dtype=float, na_value=np.nan)
        bad = ~np.isfinite(array)
        what = "not a finite number"
        if kind in ("tokens", "count"):
            bad |= array != np.floor(np.where(np.isfinite(array), array, 0))
            what = "not a whole number"
        if not bad.any():
            minimum = {"tokens": 1, "count": 0, "time": 0}.get(kind)
            if minimum is not None:
                bad = array < minimum
                what = f"must be >= {minimum}"
        if not bad.any() and kind == "tokens":
            bad = array > MAX_TOKENS
            what = f"above {MAX_TOKENS:,} tokens (no model has such a context)"
        if bad.any():
            row = int(np.argmax(bad))
            named = "" if ids is None else f" ({ids.name} {_scalar(ids.iloc[row])!r})"
            raise RunInputError(f"{path}: row {row + 1}{named}, column {column!r}: {what} (got {_scalar(values.iloc[row])!r})")


def _scalar(value):
    """A table cell as a plain Python value (3, not np.int64(3))."""
    return value.item() if hasattr(value, "item") else value


def check_run_consistency(run: Path, config: dict, requests: pd.DataFrame, iterations: pd.DataFrame) -> None:
    """The run's files describe one run: every ``request_id`` once, as many requests as ``config.json``'s
    ``num_requests`` (where recorded), iterations that start in their order (``start_at_us`` non-decreasing with
    ``iteration``, where recorded) and end no earlier than the last finished request's completion (1 us of slack):
    a table cut short or shuffled would otherwise be compared silently, or fail inside the comparison.

    Raises:
        RunInputError: naming the file, the row and what disagrees with what.
    """
    req_path, it_path = run / "requests.parquet", run / "iterations.parquet"
    if "request_id" in requests.columns:
        repeated = requests["request_id"].duplicated().to_numpy()
        if repeated.any():
            row = int(np.argmax(repeated))
            raise RunInputError(f"{req_path}: row {row + 1}: request_id {_scalar(requests['request_id'].iloc[row])!r} "
                                "appears twice (each request is recorded once)")
    expected = config.get("num_requests")
    if isinstance(expected, int) and not isinstance(expected, bool) and expected != len(requests):
        raise RunInputError(f"{req_path}: {len(requests):,} requests, but {run / 'config.json'} records num_requests "
                            f"{expected:,}: the files are not of one run (a table cut short?)")
    if "iteration" in iterations.columns:
        starts = iterations.sort_values("iteration", kind="stable")["start_at_us"].to_numpy(dtype=float)
    else:
        starts = iterations["start_at_us"].to_numpy(dtype=float)
    back = np.diff(starts) < 0
    if back.any():
        row = int(np.argmax(back)) + 1
        raise RunInputError(f"{it_path}: iteration row {row + 1} starts at {starts[row]:.1f} us, before the one "
                            f"before it ({starts[row - 1]:.1f} us): iterations must start in their order")
    ends_us = iterations["start_at_us"].to_numpy(dtype=float) + iterations["duration_us"].to_numpy(dtype=float)
    finished = requests[requests["status"] == "finished"]
    if "completion_at_us" in finished.columns and len(finished):
        last_us = float(np.nanmax(finished["completion_at_us"].to_numpy(dtype=float)))
        if last_us > float(ends_us.max()) + 1.0:
            raise RunInputError(f"{it_path}: the iterations end at {float(ends_us.max()):.1f} us, before the last "
                                f"request completes ({last_us:.1f} us, {req_path}): the iteration table is cut short")


def load_hw_run(hw_dir: str | Path):
    """Read and check a hardware run directory before it is simulated; returns ``(hw, config)``:
    the :class:`analysis.results.RunResult` and the :class:`SimConfig` of its ``config.json``.

    Checked: the four run files are readable (:func:`analysis.results.load_run`); ``config.json`` is a hardware
    run's (``backend: "hardware"``), its settings as :func:`config_from_run`, its recorded sizes and label as
    :func:`check_recorded_sizes`, ``cuda_graphs`` a boolean where present; the columns of :data:`RUN_COLUMNS`
    (token counts whole numbers >= 1, times in us finite), at least one iteration and one finished request, and
    every request within the run's slot length (prompt + output - 1 KV tokens <= ``slot_max_tokens``);
    ``summary.json``'s :data:`SUMMARY_FIELDS` numbers; ``shapes.parquet`` and ``trace.parquet``, where present,
    readable Parquet with their columns.

    Raises:
        FileNotFoundError: the directory or one of its four run files is missing.
        ValueError: a run file is unreadable (:class:`RunInputError` for every check above); one line naming the
            file, the field / column / row and the value.
    """
    from analysis.results import load_run

    run = Path(hw_dir)
    hw = load_run(run)
    source = run / "config.json"
    if hw.config.get("backend") != "hardware":
        raise RunInputError(f"{source}: field 'backend' is {_json(hw.config.get('backend'))}, not \"hardware\": "
                            "not a hardware run (python -m hwbackend.replay.cli writes one)")
    config = config_from_run(hw.config, str(source))
    check_recorded_sizes(config, hw.config, str(source))
    if "cuda_graphs" in hw.config and not isinstance(hw.config["cuda_graphs"], bool):
        raise RunInputError(f"{source}: field 'cuda_graphs': expected a JSON boolean (true/false), got "
                            f"{_json(hw.config['cuda_graphs'])}")
    requests = hw.requests
    ids = requests["request_id"] if "request_id" in requests.columns else None
    check_columns(requests, run / "requests.parquet", RUN_COLUMNS["requests.parquet"], ids)
    check_columns(hw.iterations, run / "iterations.parquet", RUN_COLUMNS["iterations.parquet"])
    if hw.iterations.empty:
        raise RunInputError(f"{run / 'iterations.parquet'}: no iteration recorded")
    if not (requests["status"] == "finished").any():
        raise RunInputError(f"{run / 'requests.parquet'}: no request with status 'finished' to compare")
    _check_finished_latencies(run / "requests.parquet", requests, ids)
    check_run_consistency(run, hw.config, requests, hw.iterations)
    kv_tokens = requests["prompt_tokens"].to_numpy(dtype=np.int64) + requests["output_tokens"].to_numpy(dtype=np.int64) - 1
    too_long = kv_tokens > config.slot_max_tokens
    if too_long.any():
        row = int(np.argmax(too_long))
        raise RunInputError(f"{run / 'requests.parquet'}: row {row + 1} (request_id {_scalar(ids.iloc[row])!r}): "
                            f"prompt_tokens {_scalar(requests['prompt_tokens'].iloc[row])} + output_tokens "
                            f"{_scalar(requests['output_tokens'].iloc[row])} - 1 = {kv_tokens[row]} KV tokens, more than the run's "
                            f"slot holds ({config.slot_max_tokens}, from {source})")
    _check_summary(run / "summary.json", hw.summary)
    shape_kinds = {"iteration": "count", "new_tokens": "count", "attention_pairs": "time", "kv_read_tokens": "count",
                   "logit_sequences": "count"}
    for name, columns in (("shapes.parquet", shape_kinds),
                          ("trace.parquet", {"arrival_s": "instant", "prompt_tokens": "tokens", "output_tokens": "tokens"})):
        path = run / name
        if path.exists():
            frame = _read_parquet(path)
            if name == "shapes.parquet" and SHAPE_FIELDS[4] in frame.columns:  # replays since it was logged
                columns = {**columns, SHAPE_FIELDS[4]: "count"}
            check_columns(frame, path, columns)
            if name == "shapes.parquet":
                check_columns(hw.iterations, run / "iterations.parquet", {"iteration": "count"})
    return hw, config


def _read_parquet(path: Path) -> pd.DataFrame:
    """``path`` read; RunInputError naming it where it is not readable Parquet (truncated, corrupt, a folder)."""
    try:
        return pd.read_parquet(path)
    except (ValueError, OSError) as exc:  # Arrow errors are ValueErrors / OSErrors
        raise RunInputError(f"{path}: unreadable or corrupt Parquet file ({exc})") from None
