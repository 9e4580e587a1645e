"""Parameter sweeps: the Cartesian grid of simulate (or capacity) runs, one JSON file per point.

A grid axis is any ``kvsim simulate`` option (``page_size``, ``policy``, ``max_batch``, ``scheduler``,
``token_budget``, ``sync_mapping``, ``deferred_reclaim``, ``memory_util``, ``rate_scale``, ``num_requests``,
``tp``, ``pp``, ``gpu``, ``model``, ``seed``, ``trace``, ...) or any :class:`sim.setup.config.SimConfig` field
(``eager_lookahead_steps``, ``block_size_tokens``, ...)::

    --grid page_size=64KiB,256KiB,2MiB --grid policy=vattention,paged:block=16 --grid max_batch=128,256

In a ``policy`` axis a comma starts a new spec only before a policy name, so
``policy=vattention:page=256KiB,sync,paged`` is two specs: ``vattention:page=256KiB,sync`` and ``paged``.

Output directory layout (``kvsim sweep --out DIR``)::

    DIR/points/<key>.json   one finished point: its grid values, status, error and summary; <key> is a
                            hash of the job, the point and every base option, so a rerun skips it
    DIR/sweep.parquet/.csv  one row per point in grid order (axis columns, status, error, summary keys)
    DIR/sweep.html          a self-contained plotly figure of the main metrics
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sim.setup.config import POLICIES, SimConfig
from sim.results.json_text import nan_for_null, strict_json_text

JOBS = ("simulate", "capacity")
# options of the parsed command line that do not change a point's result
_NOT_SETTINGS = {"command", "func", "grid", "job", "executor", "ray_address", "workers", "out", "quiet", "force",
                 "given_options"}
_HASHED_WHEN_SET = {"slo_attainment"}   # options added later: left out of a point's key while unset, so that
                                        # sweeps written before them keep their keys (and resume)
_ALIASES = {"page": "page_size", "batch": "max_batch", "max_batch_slots": "max_batch", "budget": "token_budget",
            "page_size_bytes": "page_size", "memory_util_frac": "memory_util"}
_ON_OFF = {"on": True, "true": True, "1": True, "yes": True, "off": False, "false": False, "0": False, "no": False}


@functools.lru_cache(maxsize=1)
def _reference_parser() -> argparse.ArgumentParser:
    """A parser holding every simulate option, to look up an axis's destination and value type."""
    from sim.frontend.options import add_config_args
    from traces.workload import add_trace_args
    parser = argparse.ArgumentParser(add_help=False)
    add_trace_args(parser)
    add_config_args(parser)
    parser.add_argument("--policy", default=None)
    parser.add_argument("--profile", default=None)
    from sim.frontend.disagg_options import add_disagg_args
    add_disagg_args(parser)               # pd, kv_link, kv_stream, prefill/decode policy and tp (issue 22)
    return parser


@dataclass(frozen=True)
class Axis:
    """How a grid axis applies: to a command-line option (``dest``) or to a SimConfig field."""

    name: str
    dest: str | None = None       # argparse destination
    field: str | None = None      # SimConfig field (when not a command-line option)
    invert: bool = False          # the option is the negation (deferred_reclaim -> --no-deferred-reclaim)

    def parse(self, text: str):
        """The typed value of ``text`` for this axis (raises ValueError naming the axis and value)."""
        try:
            return self._parse(text.strip())
        except (ValueError, argparse.ArgumentTypeError) as exc:
            raise ValueError(f"--grid {self.name}={text!r}: {exc}") from None

    def _parse(self, text: str):
        if self.dest is None:
            return _parse_field(self.field, text)
        action = next(a for a in _reference_parser()._actions if a.dest == self.dest)
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            if text.lower() not in _ON_OFF:
                raise ValueError("expected on/off")
            return _ON_OFF[text.lower()] != self.invert
        if isinstance(action, argparse._AppendAction):   # a repeatable option (--kv-tier): "a+b" stacks, none: off
            if text.lower() == "none":
                return None
            return [action.type(part.strip()) if action.type else part.strip() for part in text.split("+")]
        value = action.type(text) if action.type else text
        if action.choices and value not in action.choices:
            raise ValueError(f"choose one of {', '.join(map(str, action.choices))}")
        return value


def _parse_field(name: str, text: str):
    default = SimConfig.__dataclass_fields__[name].default
    if name.endswith("_bytes"):
        from sim.units import parse_size_bytes
        return parse_size_bytes(text)
    if isinstance(default, bool):
        if text.lower() not in _ON_OFF:
            raise ValueError("expected on/off")
        return _ON_OFF[text.lower()]
    if isinstance(default, (int, float)):
        return type(default)(text)
    return None if text.lower() == "none" else (int(text) if default is None and text.isdigit() else text)


def resolve_axis(name: str) -> Axis:
    """The :class:`Axis` for a grid axis name (dashes or underscores).

    Raises:
        ValueError: for an unknown name, listing the valid ones.
    """
    key = name.strip().replace("-", "_").lower()
    key = _ALIASES.get(key, key)
    if key == "deferred_reclaim":
        return Axis(name, dest="no_deferred_reclaim", invert=True)
    dests = {a.dest for a in _reference_parser()._actions}
    if key in dests:
        return Axis(name, dest=key)
    if key in SimConfig.__dataclass_fields__:
        return Axis(name, field=key)
    options = sorted((dests | {"deferred_reclaim"}) - {"help"})
    fields = sorted(set(SimConfig.__dataclass_fields__) - set(options) - {"explicit_fields"})
    raise ValueError(f"--grid: unknown axis {name!r}; valid axes: the simulate options {', '.join(options)}; "
                     f"and the SimConfig fields {', '.join(fields)}")


def _split_values(axis: str, text: str) -> list[str]:
    """An axis's values: split at commas, except that in a ``policy`` axis a comma starts a new value only before
    a policy name, and in a ``kv_tier`` axis only before a tier kind (``dram``, ``ssd``) or ``none``, so that the
    values keep their own ``key=value`` options (``kv_tier=dram:1GiB,bw=10GB/s,ssd:4GiB``: two values); in a ``policy``
    axis an item that is not a key of the spec before it starts a value (``policy=paged,bogus``: two values, the
    second refused by name)."""
    from sim.memory.tiers import TIER_KINDS

    items = [item.strip() for item in text.split(",")]
    axis = _ALIASES.get(axis, axis)
    if axis not in ("policy", "kv_tier"):
        return [item for item in items if item]
    starts = set(POLICIES) if axis == "policy" else {*TIER_KINDS, "none"}
    specs: list[str] = []
    for item in filter(None, items):
        # in a policy axis a bare item continues the spec before it only as one of its keys (the spec still
        # parses); else it starts a value, so a misspelt name (policy=paged,bogus) is refused as 'bogus'
        if (item.partition(":")[0].strip().lower() in starts or not specs
                or (axis == "policy" and "=" not in item and not _parses_as_policy(specs[-1] + "," + item))):
            specs.append(item)
        else:
            specs[-1] += "," + item
    return specs


def _parses_as_policy(spec: str) -> bool:
    from sim.frontend.policy_spec import parse_policy
    try:
        parse_policy(spec)
    except ValueError:
        return False
    return True


def parse_grid(items: list[str]) -> dict[str, list[str]]:
    """``["page_size=64KiB,2MiB", "policy=vattention,paged"]`` -> ``{axis: [values]}`` in the given order;
    a repeated axis appends values. Every value is parsed once here, so a typo fails before anything runs.

    Raises:
        ValueError: for a malformed item, an unknown axis or a value its option rejects.
    """
    grid: dict[str, list[str]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--grid {item!r}: expected AXIS=V1,V2,... e.g. page_size=64KiB,2MiB")
        axis = name.strip().replace("-", "_").lower()
        resolved = resolve_axis(axis)
        parsed = _split_values(axis, values)
        if not parsed:
            raise ValueError(f"--grid {item!r}: no values")
        for value in parsed:
            resolved.parse(value)
            if resolved.dest == "policy":        # a misspelt policy or key fails here, before any point runs
                from sim.frontend.policy_spec import parse_policy
                try:
                    parse_policy(value)
                except ValueError as exc:
                    raise ValueError(f"--grid {axis}={value}: {exc}") from None
        grid.setdefault(axis, []).extend(v for v in parsed if v not in grid.get(axis, []))
    return grid


def _refuse_same_policies(specs: list[str]) -> None:
    """Refuse two values of a ``policy`` axis that spell one configuration (``paged`` and ``paged:block=16``: a key
    at its default), as ``kvsim compare`` does: the table would hold the same point twice under two labels. The
    values are compared with every key at :class:`sim.setup.config.SimConfig`'s default filled in (a base flag that
    sets one of their fields is refused by :func:`_check_axes_apart`); not under an ``--engine`` preset, whose
    defaults differ (``--engine sglang``: ``paged`` has 1-token blocks)."""
    from sim.frontend.policy_spec import parse_policy
    from sim.setup.config import SimConfig
    fields = SimConfig.__dataclass_fields__
    seen: dict = {}
    for spec in specs:
        overrides = {k: v for k, v in parse_policy(spec).items() if k != "explicit_fields"}
        key = tuple(sorted((k, v) for k, v in overrides.items() if v != fields[k].default or k == "policy"))
        if key in seen:
            raise ValueError(f"--grid policy={seen[key]},{spec}: {seen[key]!r} and {spec!r} are the same configuration "
                             "(a key at its default); give each once")
        seen[key] = spec


def expand_grid(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """The Cartesian product in row-major order (the last axis varies fastest)."""
    names = list(grid)
    return [dict(zip(names, combo)) for combo in itertools.product(*(grid[n] for n in names))]


@dataclass(frozen=True)
class PointJob:
    """Everything one worker needs to run a point (picklable; Ray or a process pool).

    Attributes:
        index: position in grid order.
        point: axis -> value as typed on the command line.
        base: the base options (``vars(args)`` without executor settings).
        job: ``simulate`` or ``capacity``.
        files: ``((axis, file key), ...)`` for the point's values that name a file (``gpu=my.toml``: its
            :func:`trace_file_key`), so that an edited file runs the point again.
    """

    index: int
    point: dict
    base: dict
    job: str = "simulate"
    files: tuple = ()

    @property
    def key(self) -> str:
        """Stable hash of job, point, base options and the contents of the files they name: the point's file name
        under ``points/``."""
        fields = {"job": self.job, "point": self.point, "base": self.base}
        if self.files:
            fields["files"] = [list(item) for item in self.files]
        text = json.dumps(fields, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def named_file_keys(values: dict) -> dict[str, str]:
    """``{name: trace_file_key}`` for the values that name an existing file (a GPU TOML, a model JSON, a
    profile, the trace)."""
    return {name: trace_file_key(Path(value)) for name, value in sorted(values.items())
            if isinstance(value, str) and value and Path(value).is_file()}


def base_settings(args: argparse.Namespace) -> dict:
    """The options of a parsed command line that change results (what the point key hashes), and, for each option
    naming a file (``--trace``, ``--gpu my.toml``, ``--model``, ``--profile``), ``<option>_file``: its resolved
    path, size and content digest (:func:`trace_file_key`), so that a stored point is
    reused only for the same file unchanged (the option's text alone matched an edited file, or another file of
    that relative name)."""
    settings = {k: v for k, v in sorted(vars(args).items()) if k not in _NOT_SETTINGS and not callable(v)
                and not (k in _HASHED_WHEN_SET and v is None)}
    settings.update({f"{name}_file": key for name, key in named_file_keys(settings).items()})
    return settings


TRACE_DIGEST_MAX_BYTES = 2 * 1024 ** 3
"""Trace files up to this size are keyed by their content's SHA-256 (~1 s per GB); larger ones by modification
time."""


def trace_file_key(path: Path) -> str:
    """``path:size:sha256`` of a trace file's content (an edit that keeps the size and restores the modification
    time is seen); a file beyond :data:`TRACE_DIGEST_MAX_BYTES` is keyed ``path:size:mtime_ns``."""
    stat = path.stat()
    if stat.st_size > TRACE_DIGEST_MAX_BYTES:
        return f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    with path.open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    return f"{path.resolve()}:{stat.st_size}:{digest}"


def make_jobs(grid: dict[str, list[str]], base: dict, job: str = "simulate",
              given_options: tuple = ()) -> list[PointJob]:
    """One :class:`PointJob` per grid point, in grid order. ``given_options``: the long options written on the
    command line (``cli.main``'s ``args.given_options``), so that an axis that replaces a flag given at its default
    value is refused too (:func:`_check_axes_apart`)."""
    if job not in JOBS:
        raise ValueError(f"--job {job!r}: choose one of {', '.join(JOBS)}")
    _check_axes_apart(grid, base, given_options)
    if "policy" in grid and base.get("engine") is None:
        _refuse_same_policies(grid["policy"])
    return [PointJob(i, point, base, job, tuple(named_file_keys(point).items()))
            for i, point in enumerate(expand_grid(grid))]


def _axis_field(axis: Axis) -> str:
    """The SimConfig field an axis sets (a command-line option's field where the option names it otherwise)."""
    if axis.field is not None:
        return axis.field
    from sim.frontend.flags import FIELD_DESTS
    by_dest = {dest: field for field, dest in FIELD_DESTS.items()}
    return by_dest.get(axis.dest, axis.dest)


def _check_axes_apart(grid: dict[str, list[str]], base: dict, given_options: tuple = ()) -> None:
    """Refuse a grid whose rows would be mislabelled or a flag silently dropped: an axis whose option the base
    command line also set (``--no-deferred-reclaim --grid deferred_reclaim=off,on``), two axes that set the same
    setting (``deferred_reclaim`` and ``no_deferred_reclaim``), or an axis that sets a field the base ``--policy`` spec
    (or a value of a ``policy`` axis) also sets, which the spec would override at every point
    (``--policy paged:block=32 --grid block_size_tokens=16,64``: both rows ``block=32``). A flag counts as set when
    its value differs from the default or it is among ``given_options`` (``--page-size 2MiB --grid
    page_size=2MiB,4MiB``; ``--page-size 2MiB --grid policy=vattention:page=4MiB``).

    Raises:
        ValueError: naming the axes, or the axis and the spec.
    """
    from sim.frontend.flags import parser_flags
    from sim.frontend.policy_spec import parse_policy

    fields: dict[str, str] = {}
    defaults = vars(_reference_parser().parse_args([]))     # each option's default, typed as parsed
    flags = parser_flags(_reference_parser())
    for name in grid:
        axis = resolve_axis(name)
        if axis.dest == "policy":
            if isinstance(base.get("policy"), str):     # every point would replace --policy: it never runs
                raise ValueError(f"--grid {name} sets the policy that --policy {base['policy']} also sets, and the "
                                 "axis would replace it at every point; add it to the axis "
                                 f"(--grid policy=...,{base['policy']}) or leave --policy out")
            continue
        if axis.dest is not None and axis.dest in base and (base[axis.dest] != defaults.get(axis.dest)
                                                            or flags.get(axis.dest) in given_options):
            flag = flags[axis.dest]              # the base command line set it: the axis would replace it
            raise ValueError(f"--grid {name} sets what {flag} also sets on the command line ({base[axis.dest]!r}), "
                             "and the axis would replace it at every point; set it in one place: the axis, or "
                             f"{flag}")
        field = _axis_field(axis)
        if field in fields:
            raise ValueError(f"--grid {fields[field]} and --grid {name} set the same setting ({field}); "
                             "give it one axis")
        fields[field] = name
    specs = [(f"--policy {base['policy']}", base["policy"])] if isinstance(base.get("policy"), str) else []
    specs += [(f"--grid policy={text}", text) for name, values in grid.items()
              if resolve_axis(name).dest == "policy" for text in values]
    for where, spec in specs:
        try:
            spec_fields = parse_policy(spec)
        except ValueError:
            continue                  # a bad spec is refused by the point itself, naming the spec
        for field, name in fields.items():
            if field in spec_fields:
                raise ValueError(f"--grid {name} sets {field}, which {where} also sets (to "
                                 f"{spec_fields[field]!r}), overriding the axis at every point; set it in one "
                                 "place: the axis, or the spec")
        if where.startswith("--grid"):      # a policy value against a flag of the base command line
            from sim.frontend.options import policy_overrides, policy_flag_values
            try:
                policy_overrides(spec, policy_flag_values(base), given_options)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None


def point_args(job: PointJob) -> tuple[argparse.Namespace, dict]:
    """The point's command-line namespace and its SimConfig overrides (fields without an option)."""
    args = argparse.Namespace(**job.base)
    overrides = {}
    for name, text in job.point.items():
        axis = resolve_axis(name)
        value = axis.parse(text)
        if axis.dest is None:
            overrides[axis.field] = value
        else:
            setattr(args, axis.dest, value)
    if overrides:                  # a field the grid sets is never replaced by a profile's measurement
        overrides["explicit_fields"] = tuple(sorted(overrides))
    return args, overrides


def point_file(out_dir: Path, job: PointJob) -> Path:
    return Path(out_dir) / "points" / f"{job.key}.json"


def save_point(out_dir: Path, record: dict) -> Path:
    """Write one finished point (atomically: a partial file never counts as done)."""
    path = Path(out_dir) / "points" / f"{record['key']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(strict_json_text(record, indent=1, default=str) + "\n")     # NaN as null
    temporary.replace(path)
    return path


def load_point(out_dir: Path, job: PointJob) -> dict | None:
    """The finished point's record, or None when it has none; a damaged record file (points are written atomically:
    edited or damaged on disk) is named in a warning and the point runs again (its file is then replaced)."""
    path = point_file(out_dir, job)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:      # (json.JSONDecodeError is a ValueError)
        record, problem = None, str(exc)
    else:
        problem = "" if isinstance(record, dict) and "status" in record else "not a point record"
    if problem:
        import sys
        print(f"kvsim: warning: {path}: not a readable sweep point ({problem}); the point runs again",
              file=sys.stderr)
        return None
    if record.get("job") == "simulate" and isinstance(record.get("result"), dict):
        record["result"] = nan_for_null(record["result"])     # a run summary: null stands for NaN
    return record


DESCRIBED_SETTINGS = ("model", "gpu", "tp", "engine", "trace", "num_requests", "slo")
"""Settings every sweep row names (unless an axis does): the model, GPU, tensor-parallel degree, engine preset,
trace, request count and SLOs of its point, from the point's options."""


def sweep_table(jobs: list[PointJob], records: dict[str, dict]) -> pd.DataFrame:
    """One row per point in grid order: axis values, status, error, label, the result keys, then the cost columns
    (:data:`analysis.planning.cost.COST_COLUMNS`: GPUs per replica, price, requests per $, passes the SLOs,
    cheapest passing)."""
    rows = []
    for job in jobs:
        record = records.get(job.key, {"status": "missing", "error": "not run"})
        row = {**job.point, "status": record["status"], "error": record.get("error", ""),
               "label": record.get("label", "")}
        args, _ = point_args(job)          # what the point ran, so that the table stands on its own
        for key in DESCRIBED_SETTINGS:
            value = getattr(args, key, None)
            if key not in row and value is not None:
                row[key] = value if isinstance(value, (int, float)) else str(value)
        # a nested dict (e.g. rejected_by_reason) is kept as JSON text: Parquet cannot store an empty struct
        row.update({k: json.dumps(v, sort_keys=True) if isinstance(v, dict) else v
                    for k, v in record.get("result", {}).items()})
        rows.append(row)
    from analysis.planning.cost import add_cost_columns     # GPUs, price, requests per $, cheapest passing
    return add_cost_columns(pd.DataFrame(rows), jobs, point_args)


def write_table(table: pd.DataFrame, out_dir: Path) -> list[Path]:
    """``sweep.parquet`` and ``sweep.csv`` under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table.to_parquet(out / "sweep.parquet", index=False)
    table.to_csv(out / "sweep.csv", index=False)
    return [out / "sweep.parquet", out / "sweep.csv"]


__all__ = ["Axis", "JOBS", "PointJob", "base_settings", "expand_grid", "load_point", "make_jobs", "parse_grid",
           "point_args", "resolve_axis", "save_point", "sweep_table", "write_table"]
