"""VMM operation latency model: per-call latency distributions, sampled from one seeded generator.

Built-in defaults are the H200 measurements of domain.md ("CUDA VMM call latency, NVIDIA H200", driver
580.159.04, 1000 calls each). A calibration profile (``kvsim calibrate``, format in
``docs/profile-format.md``) replaces them: where it holds raw samples they are resampled with replacement
(bootstrap); otherwise a distribution is rebuilt from its quantiles by piecewise-linear interpolation of the
inverse CDF through the measured p50, p90 and p99 (see :meth:`CallDistribution.from_quantiles`), shaped so
that its mean equals the measured mean. The p50/p90/p99 and the mean are thus preserved.

Page sizes of 2 MiB and more that were not measured use the nearest measured size (in log2): domain.md shows
per-call latency nearly independent of page size (2 MiB vs 32 MiB).

Pages below 2 MiB cannot be made with the stock CUDA VMM API (its granularity is 2 MiB; cuMemCreate of 64 or
256 KiB fails, domain.md). vAttention's 64/128/256 KiB pages went through its modified NVIDIA UVM driver
(``vMemCreate`` / ``vMemMap``; microsoft/vattention ``nvidia-vattn-uvm-driver``), which maps a page without a
cuMemSetAccess call. Those sizes are costed from the paper's measured allocation bandwidth
(:data:`MODIFIED_DRIVER_MAP_BYTES_PER_S`), never from the 2 MiB stock calls: see :func:`modified_driver_page_us`.
"""
from __future__ import annotations

import json
import math
from importlib import resources
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path

import numpy as np

from sim.timing.draws import BufferedDraws
from sim.timing.compute import (SCALAR_FIELDS, TABLE_FIELDS, ComputeFieldError, check_compute_field, finite_number,
                                show_value)
from sim.units import KIB, MIB, format_bytes

DRIVER_GRANULARITY_BYTES = 2 * MIB
"""The stock CUDA VMM API's allocation granularity (minimum = recommended = 2 MiB, measured on the H200,
domain.md): smaller pages need vAttention's modified driver."""

MODIFIED_DRIVER_MAP_BYTES_PER_S: dict[int, float] = {64 * KIB: 7.6e9}
"""Page size -> physical-memory allocation bandwidth (bytes/s) of vAttention's modified NVIDIA UVM driver (A100,
driver 545.23.06 modified; vAttention, Prabhu et al., ASPLOS'25, section 7.3, its table of allocation bandwidth
by page size: 7.6 GB/s with 64 KB pages, as quoted in issue 28). Modified driver, not the stock CUDA API.
Sizes below 2 MiB without an entry take the per-page time of the nearest entry (log2): a driver call's cost
nearly independent of the page size, as the stock calls show for 2 vs 32 MiB (domain.md)."""

VMM_CALLS = ("cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease")

# domain.md, H200 table: call -> page size -> (p50, p90, p99, mean) in microseconds.
H200_DOMAIN_US: dict[str, dict[int, tuple[float, float, float, float]]] = {
    "cuMemCreate": {2 * MIB: (18.5, 23.8, 40.3, 21.2), 32 * MIB: (27.7, 34.2, 49.1, 26.4)},
    "cuMemMap": {2 * MIB: (5.0, 9.1, 15.7, 6.0), 32 * MIB: (4.9, 6.3, 10.3, 5.0)},
    "cuMemSetAccess": {2 * MIB: (49.6, 64.6, 421.7, 57.7), 32 * MIB: (48.1, 63.5, 80.2, 50.2)},
    "cuMemUnmap": {2 * MIB: (32.7, 40.5, 274.8, 39.9), 32 * MIB: (33.6, 42.2, 90.4, 35.8)},
    "cuMemRelease": {2 * MIB: (22.8, 26.9, 49.7, 26.2), 32 * MIB: (47.8, 54.0, 74.6, 48.9)},
}


def modified_driver_page_us(page_size_bytes: int) -> float:
    """Time (us) the modified driver takes to map one page of ``page_size_bytes`` (< 2 MiB):
    ``size / bandwidth`` of the nearest :data:`MODIFIED_DRIVER_MAP_BYTES_PER_S` entry, scaled to keep that
    entry's per-page time (64 KiB / 7.6 GB/s = 8.62 us per page, at every size below 2 MiB until more sizes
    are entered). Unmapping, creating and releasing a page on that driver are costed at the same time per page
    (an assumption: the paper gives no figure for them)."""
    size = min(MODIFIED_DRIVER_MAP_BYTES_PER_S,
               key=lambda s: (abs(math.log2(s) - math.log2(page_size_bytes)), s))
    return size / MODIFIED_DRIVER_MAP_BYTES_PER_S[size] * 1e6


def modified_driver_note(page_size_bytes: int) -> str:
    """The run-header note of a page size below 2 MiB (printed as ``kvsim: note:``)."""
    page_us = modified_driver_page_us(page_size_bytes)
    rate = page_size_bytes / page_us / 1e3
    return (f"page size {format_bytes(page_size_bytes)}: mapped as by vAttention's modified NVIDIA UVM driver, not "
            f"the stock CUDA VMM API (no cuMemSetAccess per page; {page_us:.2f} us per page = {rate:.1f} GB/s, "
            "from the paper's 7.6 GB/s at 64 KB, ASPLOS'25 section 7.3; unmap/create/release costed alike)")


class ProfileError(ValueError):
    """A calibration profile that cannot be read; the message names the file and the field, as
    ``profile PATH: field a.b.c <problem>, got <value as JSON>``."""


@dataclass(frozen=True)
class CallDistribution:
    """Latency distribution of one driver call at one page size (microseconds).

    Either ``samples_us`` (resampled with replacement) or an inverse-CDF table
    ``(probabilities, values_us)`` (piecewise-linear) is used.
    """

    samples_us: np.ndarray | None = None
    probabilities: np.ndarray | None = None
    values_us: np.ndarray | None = None

    @classmethod
    def from_quantiles(cls, p50: float, p90: float, p99: float, mean: float) -> "CallDistribution":
        """Build the piecewise-linear inverse CDF described in the module docstring.

        Knots: (0, 0.8 p50), (0.5, p50), (0.9, p90), (0.98, v), (0.99, p99), (1, top). ``v`` in [p90, p99]
        and then ``top >= p99`` are solved so that the mean equals ``mean`` (a heavy but rare tail, as the
        measured p99/mean ratios show); if the mean is below what ``v = p90, top = p99`` gives, those are used.
        """
        probs = np.array([0.0, 0.5, 0.9, 0.98, 0.99, 1.0])

        def mean_of(v: float, top: float) -> float:
            knots = np.array([0.8 * p50, p50, p90, v, p99, top])
            return float(np.sum(np.diff(probs) * (knots[:-1] + knots[1:]) / 2))

        base = mean_of(0.0, p99)  # mean is linear in v with slope 0.045 and in top with slope 0.005
        v = min(max((mean - base) / 0.045, p90), p99)
        top = max(p99, p99 + (mean - mean_of(v, p99)) / 0.005)
        return cls(probabilities=probs, values_us=np.array([0.8 * p50, p50, p90, v, p99, top]))

    def sample_us(self, count: int, rng: np.random.Generator | BufferedDraws) -> np.ndarray:
        """Draw ``count`` latencies (us) from ``rng`` (the same values from a generator or its
        :class:`BufferedDraws`)."""
        if isinstance(rng, BufferedDraws):
            if self.samples_us is not None:
                return self.samples_us[rng.integers(len(self.samples_us), count)]
            return np.interp(rng.random(count), self.probabilities, self.values_us)
        if self.samples_us is not None:
            return self.samples_us[rng.integers(0, len(self.samples_us), count)]
        return np.interp(rng.random(count), self.probabilities, self.values_us)

    def total_us(self, count: int, rng: np.random.Generator | BufferedDraws) -> float:
        """Sum of ``count >= 1`` draws (us): the one value itself for ``count == 1`` (no reduction), else
        numpy's sum of :meth:`sample_us`. One resampled draw from :class:`BufferedDraws` is read from a list,
        without numpy."""
        if count == 1 and self.samples_us is not None and isinstance(rng, BufferedDraws):
            return self._samples_list[rng.integer(len(self._samples_list))]
        draws = self.sample_us(count, rng)
        return float(draws[0]) if count == 1 else float(draws.sum())

    @cached_property
    def _samples_list(self) -> list[float]:
        return self.samples_us.tolist()

    def mean_us(self) -> float:
        """Expected latency (us)."""
        if self.samples_us is not None:
            return float(self.samples_us.mean())
        widths = np.diff(self.probabilities)
        return float(np.sum(widths * (self.values_us[:-1] + self.values_us[1:]) / 2))


@dataclass
class VmmLatencyModel:
    """Per-call latency distributions keyed by call name and page size in bytes.

    Attributes:
        table: ``{call: {page_size_bytes: CallDistribution}}``.
        source: where the figures come from (printed in run configurations).
        modified_driver_below_2mib: pages below 2 MiB cost the modified driver's time per page
            (:func:`modified_driver_page_us`); ``False`` only for synthetic models whose calls are meant to
            cost the same at every page size (``tests/helpers.constant_vmm``).
    """

    table: dict[str, dict[int, CallDistribution]]
    source: str
    growth: dict[int, tuple[int, CallDistribution]] = field(default_factory=dict)
    batched_ratio: float = 1.95 / 2.59   # domain.md: 64 maps + one set-access over the range vs 64 x (map + set-access)
    in_loop_scale: float = 1.0           # growth inside a serving loop / isolated growth (profile vmm_in_loop)
    tp_worker_scale: dict[int, float] = field(default_factory=dict)  # tp -> per-worker slowdown (profile vmm_tp)
    modified_driver_below_2mib: bool = True  # False: sub-2 MiB pages draw the table's calls (synthetic test models)
    _nearest: dict = field(default_factory=dict, repr=False)

    @classmethod
    def h200_defaults(cls) -> "VmmLatencyModel":
        """The H200 figures of domain.md (quantile reconstruction)."""
        table = {call: {size: CallDistribution.from_quantiles(*q) for size, q in sizes.items()}
                 for call, sizes in H200_DOMAIN_US.items()}
        return cls(table=table, source="domain.md H200 table (driver 580.159.04)")

    @classmethod
    def builtin(cls) -> "VmmLatencyModel":
        """The built-in default: the committed H200 calibration profile (``profiles/h200.json``, measured
        with ``kvsim calibrate``), or domain.md's table if that file is not installed."""
        try:
            path = resources.files("profiles").joinpath("h200.json")
            if path.is_file():
                with resources.as_file(path) as real_path:
                    model = cls.from_profile(real_path)
                model.source = "built-in default (profiles/h200.json vmm section)"
                return model
        except ModuleNotFoundError:
            pass
        return cls.h200_defaults()

    @classmethod
    def from_profile(cls, path: str | Path) -> "VmmLatencyModel":
        """Read the ``vmm`` section (and ``page_group_growth`` and ``vmm_tp``, if present) of a calibration profile.

        Raises:
            ProfileError: naming the file and the missing or malformed field.
        """
        data = read_profile(path)  # checked by check_profile: every field below has its type and range
        vmm = data["vmm"]
        table = {call: {int(size): _distribution(path, f"vmm.{call}.{size}", entry) for size, entry in vmm[call].items()}
                 for call in VMM_CALLS}
        growth, ratios = {}, []
        for name, entry in (data.get("page_group_growth") or {}).items():
            sync = _distribution(path, f"page_group_growth.{name}.sync_us", entry["sync_us"])
            growth[int(entry["page_size_bytes"])] = (int(entry["num_sub_tensors"]), sync)
            if "batched_set_access_us" in entry:
                where = f"page_group_growth.{name}.batched_set_access_us"
                batched = _mean_us(entry["batched_set_access_us"], _distribution(path, where, entry["batched_set_access_us"]))
                serial = _mean_us(entry["sync_us"], sync)
                if serial > 0:
                    ratios.append(batched / serial)
        model = cls(table=table, source=f"profile {Path(path).name}", growth=growth)
        scales = (data.get("vmm_tp") or {}).get("worker_scale") or {}
        model.tp_worker_scale = {int(tp): float(scale) for tp, scale in scales.items()}
        if ratios:
            model.batched_ratio = float(np.mean(ratios))
        return model

    def page_group_map_us(self, page_groups: int, num_sub_tensors: int, page_size_bytes: int,
                          rng: np.random.Generator) -> float:
        """Time (us) to map ``page_groups`` page groups of ``num_sub_tensors`` pages each.

        Where the profile measured whole page-group growths at this page size, each group is one draw
        from that distribution, scaled by ``num_sub_tensors / measured sub-tensors`` (the calls of a growth
        are serial). This matters: on the project's H200 a measured growth costs ~1.55x the sum of the
        isolated per-call medians (profiles/README.md). Otherwise: ``num_sub_tensors`` independent draws of
        cuMemMap + cuMemSetAccess per group, times :meth:`growth_scale`. Both times ``in_loop_scale``
        (1 unless :func:`sim.core.runner.load_models` applies a profile's ``vmm_in_loop.growth_scale``). Pages below
        2 MiB: ``page_groups * num_sub_tensors`` pages of the modified driver (:func:`modified_driver_page_us`,
        deterministic: the paper gives a bandwidth, not a distribution).
        """
        if page_groups <= 0:
            return 0.0
        if page_size_bytes < DRIVER_GRANULARITY_BYTES and self.modified_driver_below_2mib:   # module docstring
            return page_groups * num_sub_tensors * modified_driver_page_us(page_size_bytes)
        if page_size_bytes in self.growth:
            measured_tensors, distribution = self.growth[page_size_bytes]
            total = distribution.total_us(page_groups, rng)   # one draw: the same float, without a reduction
            return total * num_sub_tensors / measured_tensors * self.in_loop_scale
        calls = page_groups * num_sub_tensors
        per_call_us = (self.total_us("cuMemMap", page_size_bytes, calls, rng)
                       + self.total_us("cuMemSetAccess", page_size_bytes, calls, rng))
        return per_call_us * self.growth_scale(page_size_bytes) * self.in_loop_scale

    def growth_scale(self, page_size_bytes: int) -> float:
        """Measured growth / sum of isolated per-call means, at the measured page size nearest (log2) to
        ``page_size_bytes``; 1 without growth measurements. Applied to page sizes of 2 MiB or more whose growth
        was not measured, so that e.g. 4 MiB pages are not made cheaper than the calibrated 2 MiB ones by the
        per-call microbenchmark's optimism."""
        if not self.growth:
            return 1.0
        size = min(self.growth, key=lambda s: (abs(math.log2(s) - math.log2(page_size_bytes)), s))
        tensors, distribution = self.growth[size]
        per_call = (self.distribution("cuMemMap", size).mean_us()
                    + self.distribution("cuMemSetAccess", size).mean_us())
        return distribution.mean_us() / (tensors * per_call) if per_call > 0 else 1.0

    def distribution(self, call: str, page_size_bytes: int) -> CallDistribution:
        """The distribution of ``call`` at the measured page size nearest to ``page_size_bytes`` (log2)."""
        key = (call, page_size_bytes)
        if key not in self._nearest:
            sizes = self.table[call]
            best = min(sizes, key=lambda s: (abs(math.log2(s) - math.log2(page_size_bytes)), s))
            self._nearest[key] = sizes[best]
        return self._nearest[key]

    def total_us(self, call: str, page_size_bytes: int, count: int, rng: np.random.Generator) -> float:
        """Sum of ``count`` independent latencies of ``call`` (us); 0 for ``count == 0``. Below 2 MiB: ``count``
        pages of the modified driver (:func:`modified_driver_page_us`), no draw."""
        if count <= 0:
            return 0.0
        if page_size_bytes < DRIVER_GRANULARITY_BYTES and self.modified_driver_below_2mib:
            return count * modified_driver_page_us(page_size_bytes)
        return self.distribution(call, page_size_bytes).total_us(count, rng)


def check_profile_option(path: str | Path | None) -> None:
    """A profile option checked before any work: a file is read (:func:`read_profile`); None (the GPU's
    default) and the keywords of :func:`sim.setup.catalog.is_profile_keyword` (the roofline) name no file.

    Raises:
        ProfileError: as :func:`read_profile`.
    """
    from sim.setup.catalog import is_profile_keyword

    if path is not None and not is_profile_keyword(path):
        read_profile(path)


def read_profile(path: str | Path) -> dict:
    """Load a profile JSON file (parsed once per file version: a run reads its VMM, compute and measurement
    sections from it; treat the returned dict as read-only).

    Raises:
        ProfileError: if the file is missing, not JSON, not of format ``kvsim-profile/1``, or holds a field the
            simulator reads with a wrong type or value (:func:`check_profile`).
    """
    if not str(path):
        raise ProfileError("profile '': the path is empty")
    try:
        status = Path(path).stat()
    except FileNotFoundError:
        raise ProfileError(f"profile {path}: file not found") from None
    import stat
    if not stat.S_ISREG(status.st_mode) and not stat.S_ISDIR(status.st_mode):   # (a directory: refused on read)
        raise ProfileError(f"profile {path}: not a regular file (a pipe or device would be read until it closes)")
    return _parse_profile(str(path), status.st_mtime_ns)


@lru_cache(maxsize=8)
def _parse_profile(path: str, mtime_ns: int) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ProfileError(f"profile {path}: file not found") from None
    except OSError as exc:  # a directory, no permission
        raise ProfileError(f"profile {path}: cannot read it ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"profile {path}: not a JSON file ({exc})") from None
    except RecursionError:
        raise ProfileError(f"profile {path}: not a JSON file (nested too deeply)") from None
    if not isinstance(data, dict) or data.get("format") != "kvsim-profile/1":
        raise ProfileError(f"profile {path}: field 'format' must be 'kvsim-profile/1'")
    check_profile(data, path)
    return data


def _fail(path, field_name: str, problem: str, value=None, show: bool = True) -> ProfileError:
    got = f", got {show_value(value)}" if show else ""
    return ProfileError(f"profile {path}: field {field_name} {problem}{got}")


def _object(path, field_name: str, value, what: str = "an object") -> dict:
    if not isinstance(value, dict):
        raise _fail(path, field_name, f"must be {what}", value)
    return value


def _whole(path, field_name: str, value, what: str) -> int:
    """``value`` as an int > 0 (an integral float such as 2097152.0 is accepted; bool is not)."""
    number = finite_number(value)
    if number is None or number != int(number) or number <= 0:
        raise _fail(path, field_name, f"must be {what} (a whole number > 0)", value)
    return int(value)


def _positive(path, field_name: str, value, what: str, minimum: float = 0.0) -> float:
    """``value`` as a finite float > ``minimum`` (>= 1 where ``minimum`` is 1)."""
    number = finite_number(value)
    if number is None or (number < minimum if minimum else number <= 0):
        bound = f">= {minimum:g}" if minimum else "> 0"
        raise _fail(path, field_name, f"must be a finite number {bound} ({what})", value)
    return number


def _latency(path, field_name: str, value) -> float:
    number = finite_number(value)
    if number is None or number < 0:
        raise _fail(path, field_name, "must be a finite latency >= 0 (us)", value)
    return number


def _distribution(path, field_name: str, entry) -> CallDistribution:
    """The latency distribution of one ``{n, quantiles_us, samples_us}`` entry: its samples (resampled) if
    it has any, else its quantiles (:meth:`CallDistribution.from_quantiles`).

    Raises:
        ProfileError: an entry that is not an object; ``samples_us`` not a non-empty list of finite latencies
            >= 0; a present quantile that is not a finite latency >= 0; p50 > p90 or p90 > p99; neither
            samples nor all of p50, p90, p99, mean. The message names the field and the value.
    """
    _object(path, field_name, entry, "an object with samples_us or quantiles_us (us)")
    quantiles = entry.get("quantiles_us")
    if quantiles is not None:
        _object(path, f"{field_name}.quantiles_us", quantiles, "an object {p50, p90, p99, mean, ...} (us)")
        for key in ("p50", "p90", "p99", "mean", "min", "max"):
            if key in quantiles:
                _latency(path, f"{field_name}.quantiles_us.{key}", quantiles[key])
        ordered = [quantiles[k] for k in ("p50", "p90", "p99") if k in quantiles]
        if ordered != sorted(ordered):
            raise _fail(path, f"{field_name}.quantiles_us", "must have p50 <= p90 <= p99",
                        {k: quantiles[k] for k in ("p50", "p90", "p99") if k in quantiles})
    if "samples_us" in entry:
        samples = entry["samples_us"]
        if not isinstance(samples, list) or not samples:
            raise _fail(path, f"{field_name}.samples_us", "must be a non-empty list of latencies (us)", samples)
        try:  # fast path: plain numbers (a bool, string or null takes the slow path, which names it)
            values = (np.asarray(samples, dtype=float) if all(type(v) in (int, float) for v in samples)
                      else np.array([np.nan]))
        except OverflowError:
            values = np.array([np.nan])
        if not (np.all(np.isfinite(values)) and np.all(values >= 0)):
            for index, value in enumerate(samples):  # name the first bad one
                _latency(path, f"{field_name}.samples_us[{index}]", value)
        return CallDistribution(samples_us=values)
    missing = [k for k in ("p50", "p90", "p99", "mean") if k not in (quantiles or {})]
    if missing:
        raise _fail(path, field_name, f"needs samples_us or quantiles_us with p50, p90, p99 and mean "
                                      f"(missing {', '.join(missing)})", show=False)
    return CallDistribution.from_quantiles(*(float(quantiles[k]) for k in ("p50", "p90", "p99", "mean")))


def _mean_us(entry: dict, distribution: CallDistribution) -> float:
    """The measured mean (us) of an entry: ``quantiles_us.mean`` (over all ``n`` calls) where present, else the
    mean of its distribution."""
    mean = (entry.get("quantiles_us") or {}).get("mean")
    return float(mean) if mean is not None else distribution.mean_us()


def _compute_params(path, field_name: str, params, renamed: dict | None = None) -> dict:
    """Check a compute-model field section (:func:`sim.timing.compute.check_compute_field` per field, the two
    decode tables of one length); ``renamed`` maps profile keys to model fields (``tile_rows``)."""
    _object(path, field_name, params)
    renamed = renamed or {}
    known = sorted(set(SCALAR_FIELDS) - set(renamed.values()) | set(renamed)) + list(TABLE_FIELDS)
    for key, value in params.items():
        name = renamed.get(key, key)
        if key not in known:
            alias = [k for k, v in renamed.items() if v == key]
            problem = (f"is named {alias[0]} in this section" if alias
                       else f"is not a compute-model field (known: {', '.join(known)})")
            raise _fail(path, f"{field_name}.{key}", problem, show=False)
        try:
            check_compute_field(name, value)
        except ComputeFieldError as exc:  # exc.field is name, or name[index] for a table's element
            raise _fail(path, f"{field_name}.{key}{exc.field[len(name):]}", exc.problem, show=False) from None
    tables = [key for key in TABLE_FIELDS if key in params]
    if tables and len(tables) < 2:
        other = [key for key in TABLE_FIELDS if key not in params][0]
        raise _fail(path, f"{field_name}.{other}", f"is missing ({tables[0]} is given)", show=False)
    if tables and len(params[TABLE_FIELDS[0]]) != len(params[TABLE_FIELDS[1]]):
        raise _fail(path, f"{field_name}.{TABLE_FIELDS[1]}", f"must have one value per {TABLE_FIELDS[0]} entry "
                    f"({len(params[TABLE_FIELDS[0]])})", params[TABLE_FIELDS[1]])
    return params


def _name(path, where: str, section: dict) -> None:
    """An optional name field (``where``'s last part in ``section``): a non-empty string when present."""
    key = where.rpartition(".")[2]
    if key in section and not (isinstance(section[key], str) and section[key]):
        raise _fail(path, where, "must be a name (a string)", section[key])


def _names(path, where: str, section: dict) -> None:
    """An optional list of names (e.g. ``compute_in_loop.models``, the models a fit covers): a non-empty list of
    non-empty strings when present (a string would be matched by its substrings)."""
    key = where.rpartition(".")[2]
    if key not in section:
        return
    names = section[key]
    if not isinstance(names, list) or not names:
        raise _fail(path, where, "must be a list of names (e.g. [\"llama-3-8b\"])", names)
    for index, name in enumerate(names):
        if not (isinstance(name, str) and name):
            raise _fail(path, f"{where}[{index}]", "must be a name (a string)", name)


def check_profile(data: dict, path: str | Path) -> None:
    """Check every field the simulator reads from a profile (``docs/profile-format.md``), so that a bad one
    is reported when the file is read rather than as a traceback or a silently wrong run:

    * ``vmm`` (required) and ``vmm.<call>`` for each of :data:`VMM_CALLS`: objects keyed by page sizes in bytes
      (whole numbers > 0, at least one), each a latency distribution (:func:`_distribution`: finite
      latencies >= 0 in us, quantiles ordered);
    * ``page_group_growth.<model>``: ``page_size_bytes`` and ``num_sub_tensors`` (whole numbers > 0),
      ``sync_us`` and optional ``batched_set_access_us`` (distributions);
    * ``compute.roofline``, ``compute.tiled_roofline.params``, ``compute_in_loop.params``: compute-model
      fields in their physical ranges (:func:`sim.timing.compute.check_compute_field`), decode tables of one
      length; ``compute_in_loop.model`` (required with ``params``), ``.gpu`` (strings), ``.tp`` (whole > 0);
    * ``compute_in_loop.models`` / ``vmm_in_loop.models`` (the models a fit covers): lists of names;
      ``environment`` (an object) and ``environment.gpu_name`` / ``compute.gpu_name`` (strings: the GPU the
      compute sections were measured on);
    * ``vmm_in_loop``: ``growth_scale`` (> 0), ``model`` (string), ``page_size_bytes`` (whole > 0), all required;
      ``tp`` (whole > 0) optional;
    * ``vmm_tp.worker_scale``: an object {tensor-parallel degree (whole number >= 2): per-worker slowdown (>= 1:
      workers mapping at once are never faster than one alone)};
    * ``paged_attention.factor`` (>= 1), ``layout.cross_layer_attention_factor`` (> 0),
      ``memory.memset_bytes_per_s`` / ``copy_bytes_per_s`` (bytes/s, > 0);
    * ``host_copy.h2d_bytes_per_s`` / ``d2h_bytes_per_s`` (bytes/s, > 0) and ``host_copy.latency_us`` (>= 0).

    Sections other than ``vmm`` may be absent; unknown keys and informational fields (the rest of
    ``environment``, fit errors, grids, runs, ``vmm_under_load``) are not checked. Numbers must be finite (JSON's NaN and Infinity
    are refused); ``null`` is refused wherever a field is read.

    Raises:
        ProfileError: ``profile PATH: field a.b.c <problem>, got <value as JSON>`` for the first bad field.
    """
    if "vmm" not in data:
        raise _fail(path, "vmm", "is missing (the per-call VMM latencies that kvsim calibrate measures)", show=False)
    vmm = _object(path, "vmm", data["vmm"], "an object {call: {page size: latencies}}")
    for call in VMM_CALLS:
        if call not in vmm:
            raise _fail(path, f"vmm.{call}", "is missing", show=False)
        sizes = _object(path, f"vmm.{call}", vmm[call], "an object {page size in bytes: latencies}")
        if not sizes:
            raise _fail(path, f"vmm.{call}", "holds no page size", sizes)
        for size, entry in sizes.items():
            try:
                valid = int(size) > 0 and str(int(size)) == size.strip()
            except ValueError:
                valid = False
            if not valid:
                raise _fail(path, f"vmm.{call}", f"has a page-size key {show_value(size)}; keys are page sizes in "
                                                 "bytes, whole numbers > 0 (e.g. \"2097152\")", show=False)
            _distribution(path, f"vmm.{call}.{size}", entry)
    if "page_group_growth" in data:
        growth = _object(path, "page_group_growth", data["page_group_growth"], "an object {model: growth}")
        for name, entry in growth.items():
            where = f"page_group_growth.{name}"
            _object(path, where, entry)
            for key, what in (("page_size_bytes", "bytes"), ("num_sub_tensors", "a count")):
                if key not in entry:
                    raise _fail(path, f"{where}.{key}", "is missing", show=False)
                _whole(path, f"{where}.{key}", entry[key], what)
            if "sync_us" not in entry:
                raise _fail(path, f"{where}.sync_us", "is missing", show=False)
            _distribution(path, f"{where}.sync_us", entry["sync_us"])
            if "batched_set_access_us" in entry:
                _distribution(path, f"{where}.batched_set_access_us", entry["batched_set_access_us"])
    if "environment" in data:           # informational, but its gpu_name says where compute was measured
        environment = _object(path, "environment", data["environment"])
        _name(path, "environment.gpu_name", environment)
    if "compute" in data:
        compute = _object(path, "compute", data["compute"])
        _name(path, "compute.gpu_name", compute)
        if "roofline" in compute:
            _compute_params(path, "compute.roofline", compute["roofline"])
        if "tiled_roofline" in compute:
            tiled = _object(path, "compute.tiled_roofline", compute["tiled_roofline"])
            if "params" in tiled:
                _compute_params(path, "compute.tiled_roofline.params", tiled["params"], {"tile_rows": "mixed_tile_rows"})
    if "compute_in_loop" in data:
        in_loop = _object(path, "compute_in_loop", data["compute_in_loop"])
        if "params" not in in_loop and any(key in in_loop for key in ("model", "models", "gpu", "form")):
            # a fit's description without the fit: the run fell back to the roofline naming a wrong reason
            raise _fail(path, "compute_in_loop.params", "is missing (the fitted coefficients; the section names "
                                                         "a fit but holds none)", show=False)
        if "params" in in_loop:
            _compute_params(path, "compute_in_loop.params", in_loop["params"])
            if "model" not in in_loop:
                raise _fail(path, "compute_in_loop.model", "is missing (the model the fit is for, e.g. "
                                                           "\"llama-3-8b\")", show=False)
        for key in ("model", "gpu"):
            if key in in_loop and not (isinstance(in_loop[key], str) and in_loop[key]):
                raise _fail(path, f"compute_in_loop.{key}", "must be a name (a string)", in_loop[key])
        if "tp" in in_loop:
            _whole(path, "compute_in_loop.tp", in_loop["tp"], "the tensor-parallel degree")
        _names(path, "compute_in_loop.models", in_loop)
    if "vmm_in_loop" in data:
        scale = _object(path, "vmm_in_loop", data["vmm_in_loop"])
        for key in ("growth_scale", "model", "page_size_bytes"):
            if key not in scale:
                raise _fail(path, f"vmm_in_loop.{key}", "is missing", show=False)
        _positive(path, "vmm_in_loop.growth_scale", scale["growth_scale"], "in-loop / isolated growth time")
        if not (isinstance(scale["model"], str) and scale["model"]):
            raise _fail(path, "vmm_in_loop.model", "must be a name (a string)", scale["model"])
        _whole(path, "vmm_in_loop.page_size_bytes", scale["page_size_bytes"], "bytes")
        if "tp" in scale:
            _whole(path, "vmm_in_loop.tp", scale["tp"], "the tensor-parallel degree")
        _names(path, "vmm_in_loop.models", scale)
    if "vmm_tp" in data:
        tp_section = _object(path, "vmm_tp", data["vmm_tp"])
        if "worker_scale" not in tp_section:
            raise _fail(path, "vmm_tp.worker_scale", "is missing", show=False)
        scales = _object(path, "vmm_tp.worker_scale", tp_section["worker_scale"],
                         "an object {tensor-parallel degree: per-worker slowdown}")
        for degree, scale in scales.items():
            if not (degree.isdigit() and str(int(degree)) == degree and int(degree) >= 2):
                raise _fail(path, "vmm_tp.worker_scale", f"has a key {show_value(degree)}; keys are tensor-parallel "
                                                         "degrees, whole numbers >= 2 (e.g. \"2\")", show=False)
            _positive(path, f"vmm_tp.worker_scale.{degree}", scale, "with all workers mapping / one worker alone",
                      minimum=1.0)
    for section, key, what, minimum in (("paged_attention", "factor", "paged / contiguous attention time", 1.0),
                                        ("layout", "cross_layer_attention_factor", "an attention-time factor", 0.0),
                                        ("memory", "memset_bytes_per_s", "bytes/s", 0.0),
                                        ("memory", "copy_bytes_per_s", "bytes/s", 0.0)):
        if section in data:
            values = _object(path, section, data[section])
            if key in values:
                _positive(path, f"{section}.{key}", values[key], what, minimum)
    if "host_copy" in data:              # the DRAM tier's measured copy rates (sim.memory.tiers.with_host_copy_profile)
        host_copy = _object(path, "host_copy", data["host_copy"])
        for key in ("h2d_bytes_per_s", "d2h_bytes_per_s"):
            if key in host_copy:
                _positive(path, f"host_copy.{key}", host_copy[key], "bytes/s")
        if "latency_us" in host_copy:
            _latency(path, "host_copy.latency_us", host_copy["latency_us"])
