"""``kvsim validate --hw-run DIR`` for a co-located hardware run (``python -m hwbackend.replay.colocate``): the
simulator's ``kvsim colocate`` of the same tenants, traces and sharing against it, tenant by tenant.

The run's ``summary.json`` (``backend: hardware`` and ``tenants: [...]``) gives the sharing and each tenant's
directory; each tenant's directory is an ordinary hardware run (:func:`hwbackend.calibration.run_files.load_hw_run`
reads and checks it; its ``requests.parquet`` rebuilds the tenant's trace slice, :func:`validate.trace_of_run`).
:func:`sim.cluster.colocate.simulate_colocated` runs those tenants together, and every tenant gets the error
table of a single run (:func:`validate.error_table`: iteration latency, TTFT, TPOT, E2E, TBT, mapping) plus the
co-location figures: pages moved in from the other tenants (hardware: physical handles another tenant had
returned; simulator: ``SharedPagePool.moved_in_pages``), peak held KV (the tenant's page groups mapped and in
flight: under elastic sharing the shared pool's running peak, under static sharing the largest memory sample; not
the single-run row ``peak mapped memory``, the largest mapped count of the tenant's iteration records, which it
may exceed or fall short of), mean mapped KV and the time its ready iterations waited for the other tenants' (GPU
wait). Errors are ``sim / hw - 1`` as everywhere in ``kvsim validate``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from hwbackend.calibration.run_files import RunInputError

COLOCATION_FIGURES = (("pages moved in", "moved_in_pages", "count", 1.0),
                      ("peak held KV (mapped + in flight)", "peak_kv_bytes", "GiB", 2**30),
                      ("mean mapped KV", "mean_kv_bytes", "GiB", 2**30), ("GPU wait", "gpu_wait_s", "s", 1.0))


def _colocated_summary(hw_dir: str | Path) -> dict | None:
    """``hw_dir``'s ``summary.json`` when it is a co-located hardware run's (``backend: hardware`` and a
    ``tenants`` list), else None (no summary, or another run's).

    Raises:
        RunInputError: a ``summary.json`` that is not a JSON object, in a folder without ``requests.parquet`` (so
            not a single run either): the message names ``summary.json`` and the parse error, instead of the
            single-run loader's "requests.parquet is missing".
    """
    root = Path(hw_dir)
    path = root / "summary.json"
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        if (root / "requests.parquet").exists():
            return None         # a single run: its own loader reports the summary
        raise RunInputError(f"{path}: unreadable or not JSON ({exc})") from None
    if not isinstance(summary, dict):
        if (root / "requests.parquet").exists():
            return None
        raise RunInputError(f"{path}: expected a JSON object, got {type(summary).__name__}")
    is_colocated = summary.get("backend") == "hardware" and isinstance(summary.get("tenants"), list)
    return summary if is_colocated else None


def is_colocated_run(hw_dir: str | Path) -> bool:
    """Whether ``hw_dir`` holds a co-located hardware run (:func:`_colocated_summary`; raises as it does)."""
    return _colocated_summary(hw_dir) is not None


def colocated_parent(hw_dir: str | Path) -> tuple[Path, str] | None:
    """``(run folder, tenant name)`` when ``hw_dir`` is one tenant's folder (``RUN/tenants/NAME``) of a co-located
    hardware run, else None (validated alone, a tenant would be simulated without the other tenants' compute and
    memory: ``kvsim validate`` refuses it and names the run folder)."""
    folder = Path(hw_dir).resolve()
    if folder.parent.name != "tenants":
        return None
    root = folder.parent.parent
    try:
        summary = _colocated_summary(root)
    except RunInputError:
        return None
    for row in (summary or {}).get("tenants", []):
        if isinstance(row, dict) and isinstance(row.get("dir"), str) and (root / row["dir"]).resolve() == folder:
            return root, str(row.get("tenant", folder.name))
    return None


def colocated_member(run_dir: str | Path) -> str | None:
    """How ``run_dir`` belongs to a co-located hardware run (``python -m hwbackend.replay.colocate``), for a
    refusal (``kvsim calibrate --from-run``: a tenant's iteration times hold the other tenants' work), or None:
    the run's folder (:func:`is_colocated_run`), one tenant's folder in it (:func:`colocated_parent`), or a tenant's
    folder copied out of its run (its ``config.json`` names the ``tenant``; an unreadable one is left to the
    run's loader, as an unreadable ``summary.json`` is)."""
    try:
        if is_colocated_run(run_dir):
            return "a co-located run (summary.json lists its tenants)"
    except RunInputError:
        pass
    parent = colocated_parent(run_dir)
    if parent is not None:
        return f"tenant {parent[1]!r} of the co-located run {parent[0]}"
    try:
        config = json.loads((Path(run_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if isinstance(config, dict) and config.get("backend") == "hardware" and config.get("tenant") is not None:
        return f"config.json names tenant {config['tenant']!r} of a co-located run"
    return None


@dataclass
class ColocatedValidation:
    """Per tenant (in the run's order): ``names``, ``tables`` (the error table with the co-location rows),
    ``hw`` / ``sim`` (:class:`analysis.results.RunResult`); ``sharing``: the sharing simulated; ``notes``: per
    tenant, the profile's coverage and a warning for each way the tenant's run leaves it
    (:func:`hwbackend.calibration.validate.coverage_notes`; empty without a profile); ``unlisted``: tenant folders
    on disk that the run's ``summary.json`` does not list, so not validated (:func:`unlisted_tenant_folders`)."""

    names: list[str]
    tables: list[pd.DataFrame]
    hw: list
    sim: list
    sharing: object
    notes: list[list[str]]
    unlisted: list[str] = field(default_factory=list)

    def unlisted_warning(self) -> str | None:
        """One line naming :attr:`unlisted`, or None when every tenant folder is listed."""
        if not self.unlisted:
            return None
        return (f"tenant folder{'s' if len(self.unlisted) > 1 else ''} {', '.join(self.unlisted)} on disk "
                f"{'are' if len(self.unlisted) > 1 else 'is'} not listed in the run's summary.json (field tenants), "
                "so not simulated or validated")

    def frame(self) -> pd.DataFrame:
        """Every tenant's rows in one table (a leading ``tenant`` column)."""
        return pd.concat([t.assign(tenant=n)[["tenant", *t.columns]] for n, t in zip(self.names, self.tables)],
                         ignore_index=True)


def _number(source: Path, where: str, value, low: float = float("-inf"), high: float = float("inf"),
            low_open: bool = False) -> float:
    """``value`` of field ``where`` as a float in ``[low, high]`` (``(low, high]`` with ``low_open``).

    Raises:
        RunInputError: not a JSON number (a bool, string, list or null), or outside the range; names the file,
            the field and the value.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RunInputError(f"{source}: field {where} must be a number, got {value!r}")
    if value != value:      # NaN: written by the replay for a figure it could not measure
        return float("nan")
    if not (low < value if low_open else low <= value) or value > high:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise RunInputError(f"{source}: field {where}={value!r} must lie in {interval}")
    return float(value)


def _sharing(source: Path, fields) -> object:
    """The :class:`sim.cluster.colocate.Sharing` of the summary's ``sharing`` field (the replay writes ``mode``,
    ``split`` (null or one positive share per tenant), ``trim_delay_us`` >= 0 and ``compute: serial``).

    Raises:
        RunInputError: a field of another type or value, naming the file and field.
    """
    from sim.cluster.colocate import Sharing

    if not isinstance(fields, dict) or fields.get("mode") not in ("static", "elastic"):
        raise RunInputError(f"{source}: field 'sharing' must hold mode static or elastic, got {fields!r}")
    split = fields.get("split")
    if split is not None:
        if not isinstance(split, list) or not split:
            raise RunInputError(f"{source}: field sharing.split must be null or a list of shares, got {split!r}")
        split = tuple(_number(source, f"sharing.split[{i}]", x, 0.0, low_open=True) for i, x in enumerate(split))
    trim_us = _number(source, "sharing.trim_delay_us", fields.get("trim_delay_us", Sharing.trim_delay_us), 0.0)
    compute = fields.get("compute", "serial")
    if compute != "serial":      # the replay serialises iterations (hwbackend.replay.colocate.check_replayable)
        raise RunInputError(f"{source}: field sharing.compute={compute!r}: a co-located hardware run computes "
                            "serially (serial)")
    return Sharing(fields["mode"], split, trim_us, compute)


def _tenant_rows(source: Path, rows) -> list[dict]:
    """The summary's ``tenants`` rows, checked: each a dict with a string ``tenant`` (unique) and ``dir``,
    fractions ``floor_frac`` / ``ceiling_frac`` in [0, 1] / (0, 1] and numeric co-location figures.

    Raises:
        RunInputError: naming the file, ``tenants[i].field`` and the value.
    """
    if not rows:
        raise RunInputError(f"{source}: field 'tenants' is empty (a co-located run has at least one tenant)")
    names, folders = [], []
    for index, row in enumerate(rows):
        if not isinstance(row, dict) or "tenant" not in row or "dir" not in row:
            raise RunInputError(f"{source}: tenants[{index}] needs the fields 'tenant' and 'dir'")
        for key in ("tenant", "dir"):
            if not isinstance(row[key], str) or not row[key]:
                raise RunInputError(f"{source}: field tenants[{index}].{key} must be a non-empty string, "
                                    f"got {row[key]!r}")
        if row["tenant"] in names:
            raise RunInputError(f"{source}: field tenants[{index}].tenant={row['tenant']!r} names a tenant twice")
        folder = (source.parent / row["dir"]).resolve()
        if folder in folders:
            raise RunInputError(f"{source}: field tenants[{index}].dir={row['dir']!r} is also tenant "
                                f"{names[folders.index(folder)]!r}'s folder (each tenant has its own)")
        names.append(row["tenant"])
        folders.append(folder)
        _number(source, f"tenants[{index}].floor_frac", row.get("floor_frac", 0.0), 0.0, 1.0)
        _number(source, f"tenants[{index}].ceiling_frac", row.get("ceiling_frac", 1.0), 0.0, 1.0, low_open=True)
        for _, key, _, _ in COLOCATION_FIGURES:
            if key in row and row[key] is None:     # null: a figure the replay could not measure (NaN)
                row[key] = float("nan")
            elif key in row:
                _number(source, f"tenants[{index}].{key}", row[key], 0.0)
    return rows


def unlisted_tenant_folders(hw_dir: str | Path, rows: list[dict]) -> list[str]:
    """The folders under ``hw_dir/tenants`` (where ``python -m hwbackend.replay.colocate`` writes each tenant's
    run) that no row of the summary's ``tenants`` names in its ``dir``, as ``tenants/NAME``, sorted; empty without a
    ``tenants`` folder."""
    root = Path(hw_dir)
    listed = {(root / row["dir"]).resolve() for row in rows}
    folder = root / "tenants"
    if not folder.is_dir():
        return []
    return sorted(f"tenants/{path.name}" for path in folder.iterdir() if path.is_dir() and path.resolve() not in listed)


def load_colocated(hw_dir: str | Path):
    """The run's tenants (:class:`sim.cluster.colocate.Tenant`, traces rebuilt from the requests replayed), its
    :class:`sim.cluster.colocate.Sharing`, the hardware tenants' :class:`RunResult` and the summary's rows.

    Raises:
        RunInputError: a summary field of the wrong type or value (sharing, split, trim delay, compute, a tenant
            row's name, directory, fractions or figures: :func:`_sharing`, :func:`_tenant_rows`); a tenant
            directory that :func:`load_hw_run` refuses (its message, naming the file).
        FileNotFoundError: a tenant directory or file is missing.
    """
    from hwbackend.calibration.run_files import load_hw_run
    from hwbackend.calibration.validate import trace_of_run
    from sim.cluster.colocate import Tenant

    root = Path(hw_dir)
    source = root / "summary.json"
    summary = json.loads(source.read_text())
    sharing = _sharing(source, summary.get("sharing"))
    rows = _tenant_rows(source, summary["tenants"])
    tenants, hw_runs = [], []
    for row in rows:
        hw, config = load_hw_run(root / row["dir"])
        trace = trace_of_run(root / row["dir"], hw.requests)
        tenants.append(Tenant(row["tenant"], config, trace, floor_frac=float(row.get("floor_frac", 0.0)),
                              ceiling_frac=float(row.get("ceiling_frac", 1.0))))
        hw_runs.append(hw)
    if sharing.split is not None and len(sharing.split) != len(tenants):
        raise RunInputError(f"{source}: field sharing.split has {len(sharing.split)} shares for {len(tenants)} "
                            "tenants")
    return tenants, sharing, hw_runs, rows


def validate_colocated(hw_dir: str | Path, profile: str | None = None, out_dir: str | Path | None = None,
                       shown_hw_dir: str | Path | None = None) -> ColocatedValidation:
    """Simulate the co-located run's tenants together and compare each with its hardware records; writes
    ``validation.md`` and ``errors.csv`` into ``out_dir`` when given.

    Raises:
        RunInputError / FileNotFoundError: as :func:`load_colocated`; ProfileError: a bad ``profile``.
    """
    from hwbackend.calibration.validate import (check_profile, check_targets, coverage_notes, error_table,
                                                markdown_table)
    from sim.cluster.colocate import simulate_colocated

    check_profile(profile)
    tenants, sharing, hw_runs, rows = load_colocated(hw_dir)
    run = simulate_colocated(tenants, sharing, profile)
    tables = []
    for hw, sim, row, stats in zip(hw_runs, run.results, rows, run.stats):
        table = error_table(hw, sim)
        extra = [(name, "total", unit, float(row.get(key, float("nan"))) / scale, float(stats[key]) / scale)
                 for name, key, unit, scale in COLOCATION_FIGURES]
        extra_frame = pd.DataFrame(extra, columns=["metric", "stat", "unit", "hw", "sim"])
        extra_frame["error"] = extra_frame["sim"] / extra_frame["hw"].where(extra_frame["hw"] != 0) - 1
        tables.append(pd.concat([table, extra_frame], ignore_index=True))
    notes = [coverage_notes(profile, Path(hw_dir) / row["dir"], tenant.config) for row, tenant in zip(rows, tenants)]
    result = ColocatedValidation([t.name for t in tenants], tables, hw_runs, run.results, sharing, notes,
                                 unlisted_tenant_folders(hw_dir, rows))
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        result.frame().to_csv(out / "errors.csv", index=False)
        parts = [f"# co-located run, {sharing.mode} sharing: simulator vs hardware\n",
                 f"hardware run: `{shown_hw_dir or hw_dir}`; profile: `{profile or 'built-in'}`\n"]
        if result.unlisted_warning():
            parts.append(f"warning: {result.unlisted_warning()}\n")
        for name, table, sim, tenant_notes in zip(result.names, tables, run.results, notes):
            missed = check_targets(table)
            shown = [f"compute model: {sim.config['compute_model']}"] if isinstance(sim.config.get("compute_model"),
                                                                                     str) else []
            noted = "".join(f"{line}\n\n" for line in shown + tenant_notes)
            parts.append(f"## {name} ({sim.config['label']})\n\n{noted}{markdown_table(table)}\n\ntargets missed: "
                         f"{'; '.join(missed) or 'none'}\n")
        (out / "validation.md").write_text("\n".join(parts))
    return result


def print_colocated(result: ColocatedValidation) -> None:
    """The per-tenant tables on stdout."""
    from hwbackend.calibration.validate import check_targets, markdown_table

    count = len(result.names)
    print(f"co-located run, {result.sharing.mode} sharing, {count} tenant{'' if count == 1 else 's'}")
    for name, table, hw, sim, notes in zip(result.names, result.tables, result.hw, result.sim, result.notes):
        print(f"\n{name} ({len(hw.requests)} requests, {len(hw.iterations)} hw iterations)")
        if isinstance(sim.config.get("compute_model"), str):
            print(f"compute model: {sim.config['compute_model']}")
        for line in notes:
            print(line)
        print(markdown_table(table))
        print("targets missed: " + ("; ".join(check_targets(table)) or "none"))


def command(args) -> int:
    """``kvsim validate --hw-run DIR`` when ``DIR`` holds a co-located run (:func:`is_colocated_run`): ``--out``
    checked as every kvsim result directory (:class:`analysis.output.OutputDir`) and written as a whole; the
    tables printed (:func:`print_colocated`).

    Raises:
        ValueError / OSError: as :func:`validate_colocated`, with one line naming the file, field and value.
    """
    from analysis.output import OutputDir, command_inputs

    if args.out:
        out = OutputDir(args.out, getattr(args, "force", False), inputs=command_inputs(args))
        with out.writing() as stage:
            result = validate_colocated(args.hw_run, args.profile, stage, shown_hw_dir=args.hw_run)
    else:
        result = validate_colocated(args.hw_run, args.profile)
    if result.unlisted_warning():
        import sys
        print(f"kvsim: warning: {result.unlisted_warning()}", file=sys.stderr)
    print_colocated(result)
    return 0
