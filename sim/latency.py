"""VMM operation latency model: per-call latency distributions, sampled from one seeded generator.

Built-in defaults are the H200 measurements of domain.md ("CUDA VMM call latency, NVIDIA H200", driver
580.159.04, 1000 calls each). A calibration profile (``kvsim calibrate``, format in
``docs/profile-format.md``) replaces them: where it holds raw samples they are resampled with replacement
(bootstrap); otherwise a distribution is rebuilt from its quantiles by piecewise-linear interpolation of the
inverse CDF through the measured p50, p90 and p99 (see :meth:`CallDistribution.from_quantiles`), shaped so
that its mean equals the measured mean. The p50/p90/p99 and the mean are thus preserved.

Page sizes that were not measured use the nearest measured size (in log2): domain.md shows per-call
latency nearly independent of page size (2 MiB vs 32 MiB), which is the stated assumption for the
sub-2-MiB what-if sizes.
"""
from __future__ import annotations

import json
import math
from importlib import resources
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from sim.units import MIB

VMM_CALLS = ("cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease")

# domain.md, H200 table: call -> page size -> (p50, p90, p99, mean) in microseconds.
H200_DOMAIN_US: dict[str, dict[int, tuple[float, float, float, float]]] = {
    "cuMemCreate": {2 * MIB: (18.5, 23.8, 40.3, 21.2), 32 * MIB: (27.7, 34.2, 49.1, 26.4)},
    "cuMemMap": {2 * MIB: (5.0, 9.1, 15.7, 6.0), 32 * MIB: (4.9, 6.3, 10.3, 5.0)},
    "cuMemSetAccess": {2 * MIB: (49.6, 64.6, 421.7, 57.7), 32 * MIB: (48.1, 63.5, 80.2, 50.2)},
    "cuMemUnmap": {2 * MIB: (32.7, 40.5, 274.8, 39.9), 32 * MIB: (33.6, 42.2, 90.4, 35.8)},
    "cuMemRelease": {2 * MIB: (22.8, 26.9, 49.7, 26.2), 32 * MIB: (47.8, 54.0, 74.6, 48.9)},
}


class ProfileError(ValueError):
    """A calibration profile that cannot be read; the message names the file and the field."""


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

    def sample_us(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """Draw ``count`` latencies (us) from ``rng``."""
        if self.samples_us is not None:
            return self.samples_us[rng.integers(0, len(self.samples_us), count)]
        return np.interp(rng.random(count), self.probabilities, self.values_us)

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
    """

    table: dict[str, dict[int, CallDistribution]]
    source: str
    growth: dict[int, tuple[int, CallDistribution]] = field(default_factory=dict)
    batched_ratio: float = 1.95 / 2.59   # domain.md: 64 maps + one set-access over the range vs 64 x (map + set-access)
    in_loop_scale: float = 1.0           # growth inside a serving loop / isolated growth (profile vmm_in_loop)
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
        """Read the ``vmm`` section (and ``page_group_growth``, if present) of a calibration profile.

        Raises:
            ProfileError: naming the file and the missing or malformed field.
        """
        data = read_profile(path)
        vmm = data.get("vmm")
        if not isinstance(vmm, dict):
            raise ProfileError(f"{path}: no 'vmm' section")
        table: dict[str, dict[int, CallDistribution]] = {}
        for call in VMM_CALLS:
            if call not in vmm:
                raise ProfileError(f"{path}: field vmm.{call} is missing")
            table[call] = {int(size): _distribution(path, f"vmm.{call}.{size}", entry)
                           for size, entry in vmm[call].items()}
        growth = {}
        for model, entry in (data.get("page_group_growth") or {}).items():
            try:
                growth[int(entry["page_size_bytes"])] = (
                    int(entry["num_sub_tensors"]), _distribution(path, f"page_group_growth.{model}.sync_us", entry["sync_us"]))
            except (KeyError, TypeError, ValueError):
                raise ProfileError(f"{path}: page_group_growth.{model} needs page_size_bytes, num_sub_tensors "
                                   "and sync_us") from None
        ratios = [float(entry["batched_set_access_us"]["quantiles_us"]["mean"]) / float(entry["sync_us"]["quantiles_us"]["mean"])
                  for entry in (data.get("page_group_growth") or {}).values()
                  if isinstance(entry.get("batched_set_access_us"), dict) and "quantiles_us" in entry["batched_set_access_us"]]
        model = cls(table=table, source=f"profile {Path(path).name}", growth=growth)
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
        (1 unless :func:`analysis.runner.load_models` applies a profile's ``vmm_in_loop.growth_scale``).
        """
        if page_groups <= 0:
            return 0.0
        if page_size_bytes in self.growth:
            measured_tensors, distribution = self.growth[page_size_bytes]
            return (float(distribution.sample_us(page_groups, rng).sum()) * num_sub_tensors / measured_tensors
                    * self.in_loop_scale)
        calls = page_groups * num_sub_tensors
        per_call_us = (self.total_us("cuMemMap", page_size_bytes, calls, rng)
                       + self.total_us("cuMemSetAccess", page_size_bytes, calls, rng))
        return per_call_us * self.growth_scale(page_size_bytes) * self.in_loop_scale

    def growth_scale(self, page_size_bytes: int) -> float:
        """Measured growth / sum of isolated per-call means, at the measured page size nearest (log2) to
        ``page_size_bytes``; 1 without growth measurements. Applied to page sizes whose growth was not
        measured, so that e.g. 256 KiB what-if pages are not made cheaper than the calibrated 2 MiB ones by
        the per-call microbenchmark's optimism."""
        if not self.growth:
            return 1.0
        size = min(self.growth, key=lambda s: (abs(math.log2(s) - math.log2(page_size_bytes)), s))
        tensors, distribution = self.growth[size]
        per_call = (self.distribution("cuMemMap", size).mean_us()
                    + self.distribution("cuMemSetAccess", size).mean_us())
        return distribution.mean_us() / (tensors * per_call)

    def distribution(self, call: str, page_size_bytes: int) -> CallDistribution:
        """The distribution of ``call`` at the measured page size nearest to ``page_size_bytes`` (log2)."""
        key = (call, page_size_bytes)
        if key not in self._nearest:
            sizes = self.table[call]
            best = min(sizes, key=lambda s: (abs(math.log2(s) - math.log2(page_size_bytes)), s))
            self._nearest[key] = sizes[best]
        return self._nearest[key]

    def total_us(self, call: str, page_size_bytes: int, count: int, rng: np.random.Generator) -> float:
        """Sum of ``count`` independent latencies of ``call`` (us); 0 for ``count == 0``."""
        if count <= 0:
            return 0.0
        return float(self.distribution(call, page_size_bytes).sample_us(count, rng).sum())


def read_profile(path: str | Path) -> dict:
    """Load a profile JSON file (parsed once per file version: a run reads its VMM, compute and measurement
    sections from it; treat the returned dict as read-only).

    Raises:
        ProfileError: if the file is missing, not JSON, or not of format ``kvsim-profile/1``.
    """
    try:
        mtime_ns = Path(path).stat().st_mtime_ns
    except FileNotFoundError:
        raise ProfileError(f"profile {path}: file not found") from None
    return _parse_profile(str(path), mtime_ns)


@lru_cache(maxsize=8)
def _parse_profile(path: str, mtime_ns: int) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ProfileError(f"profile {path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"profile {path}: not a JSON file ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != "kvsim-profile/1":
        raise ProfileError(f"profile {path}: field 'format' must be 'kvsim-profile/1'")
    return data


def _distribution(path, field_name: str, entry: dict) -> CallDistribution:
    samples = entry.get("samples_us") if isinstance(entry, dict) else None
    if samples:
        values = np.asarray(samples, dtype=float)
        if np.any(~np.isfinite(values)) or np.any(values < 0):
            raise ProfileError(f"{path}: {field_name}.samples_us holds a negative or non-finite value")
        return CallDistribution(samples_us=values)
    quantiles = entry.get("quantiles_us", {}) if isinstance(entry, dict) else {}
    try:
        return CallDistribution.from_quantiles(*(float(quantiles[k]) for k in ("p50", "p90", "p99", "mean")))
    except (KeyError, TypeError, ValueError):
        raise ProfileError(f"{path}: {field_name} needs samples_us or quantiles_us p50/p90/p99/mean") from None
