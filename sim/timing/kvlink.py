"""The link that carries KV caches from prefill to decode instances (disaggregated serving, :mod:`sim.cluster.disagg`).

A transfer of ``B`` bytes over ``k`` parallel links of ``bandwidth`` bytes/s each (one per GPU: with tensor
parallelism every sender GPU holds its own shard of the KV heads and sends it over its own link, so a transfer
uses ``k = min(tp_prefill, tp_decode)`` links) takes::

    transfer_us = latency_us + B / (k * bandwidth) * 1e6

Presets (:data:`LINKS`, by name), datasheet figures, one direction, per GPU:

* ``nvlink``: NVLink 4 as on H100 / H200 SXM (HGX boards), 900 GB/s total = **450 GB/s per direction**
  (NVIDIA H100 and H200 Tensor Core GPU datasheets, "NVLink: 900GB/s"; NVIDIA NVLink product page, "fourth
  generation ... 900 GB/s"); prefill and decode GPUs within one NVLink domain (one node). Latency 5 us: this
  project's estimate of a GPU-to-GPU copy's fixed cost (launch plus synchronisation), not a datasheet figure.
* ``ib``: InfiniBand NDR, **400 Gb/s = 50 GB/s per port** (NVIDIA ConnectX-7 datasheet: "up to 400Gb/s";
  DGX H100 / H200 systems carry one ConnectX-7 port per GPU for the compute fabric, NVIDIA DGX H100 user guide).
  Latency 10 us: this project's estimate of one RDMA transfer's set-up and completion (a verbs round trip is
  a few microseconds; transfer engines such as NIXL or Mooncake's add descriptor handling), not a datasheet figure.
* ``pcie``: PCIe Gen5 x16, 32 GT/s x 16 lanes, 128b/130b = **64 GB/s per direction raw, ~55 GB/s achievable**
  (PCI-SIG PCIe 5.0 specification; H100 PCIe datasheet "PCIe Gen5: 128GB/s" bidirectional); the preset uses
  55 GB/s. Latency 10 us (as ``ib``: a DMA copy's launch and completion; estimate).

A custom link is ``BANDWIDTH[,LATENCY]``: bandwidth with a unit (``GB/s``, ``GiB/s``, ``MB/s``, ``TB/s``,
``Gb/s``; decimal units are 1e9 B, binary 2**30 B; ``Gb/s`` is gigabits), latency a duration (``us``, ``ms``,
``s``; default 0), e.g. ``25GB/s,20us`` or ``200Gb/s``.

Layer-wise streaming (Splitwise, Patel et al., ISCA'24, section 4.3: "we transfer the KV-cache of each layer
as soon as it is computed, overlapping it with the prompt computation of the next layer"): each chunk of a
prefill produces its KV layer by layer, evenly over the chunk's compute time, and the link sends the layers
FIFO as they become ready (:func:`streamed_finish_us`). Without streaming the whole KV is sent once the
prefill is done (DistServe, Zhong et al., OSDI'24: the decoding instance pulls the KV after the prefill).
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from sim.setup.specs import FieldError
from sim.units import GIB, US_PER_S, parse_duration_us


@dataclass(frozen=True)
class KvLink:
    """One direction of the link between a prefill GPU and a decode GPU.

    Attributes:
        name: preset name or the text it was parsed from.
        bandwidth_bytes_per_s: bytes per second per link, one direction.
        latency_us: fixed cost of one transfer (us), paid once per request.
        source: where the figures come from.
    """

    name: str
    bandwidth_bytes_per_s: float
    latency_us: float
    source: str

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0 or self.bandwidth_bytes_per_s != self.bandwidth_bytes_per_s:
            raise FieldError(f"kv_link={self.name!r}: bandwidth must be > 0 bytes/s", "kv_link")
        if not self.latency_us >= 0:
            raise FieldError(f"kv_link={self.name!r}: latency must be >= 0 us", "kv_link")

    def bytes_per_us(self, links: int = 1) -> float:
        """Bytes per microsecond over ``links`` parallel links."""
        return links * self.bandwidth_bytes_per_s / US_PER_S

    def send_us(self, num_bytes: float, links: int = 1) -> float:
        """Time on the wire (us) of ``num_bytes`` over ``links`` parallel links, without the latency."""
        return num_bytes / self.bytes_per_us(links)

    def transfer_us(self, num_bytes: float, links: int = 1) -> float:
        """Latency plus time on the wire (us) of one transfer of ``num_bytes`` over ``links`` links."""
        return self.latency_us + self.send_us(num_bytes, links)

    def describe(self) -> str:
        """``ib (50 GB/s per direction per GPU, 10 us)``."""
        rate = self.bandwidth_bytes_per_s / 1e9
        return f"{self.name} ({rate:g} GB/s per direction per GPU, {self.latency_us:g} us)"


LINKS: dict[str, KvLink] = {
    "nvlink": KvLink("nvlink", 450e9, 5.0, "NVLink 4 (H100/H200 SXM): 900 GB/s total, 450 GB/s per direction "
                                         "(NVIDIA H100/H200 datasheets); latency: estimate"),
    "ib": KvLink("ib", 50e9, 10.0, "InfiniBand NDR 400 Gb/s per port, one ConnectX-7 per GPU (NVIDIA ConnectX-7 "
                                   "datasheet, DGX H100 user guide); latency: estimate"),
    "pcie": KvLink("pcie", 55e9, 10.0, "PCIe Gen5 x16: 64 GB/s per direction raw, ~55 GB/s achievable (PCI-SIG "
                                       "PCIe 5.0); latency: estimate"),
}
"""KV link presets by name (module docstring for the sources)."""

_RATE_UNITS = {"b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12, "kib/s": 1024.0,
               "mib/s": 1024.0 ** 2, "gib/s": float(GIB), "tib/s": 1024.0 * GIB}
_BITS = {"gbit/s": 1e9 / 8, "gbps": 1e9 / 8, "mbit/s": 1e6 / 8, "mbps": 1e6 / 8, "tbit/s": 1e12 / 8}
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z/]+)\s*$")


def parse_bandwidth_bytes_per_s(text: str) -> float:
    """``"50GB/s"`` -> 5e10, ``"400Gb/s"`` -> 5e10, ``"64GiB/s"``: a capital ``B`` is bytes, a lower-case ``b`` bits
    (``400gb/s`` = ``400Gb/s``; also ``Gbit/s``, ``Gbps``).

    Raises:
        ValueError: naming the text when it is not a positive rate with a unit.
    """
    match = _RATE.match(text)
    if not match:
        raise ValueError(f"not a bandwidth: {text!r} (examples: 50GB/s, 400Gb/s, 64GiB/s)")
    value, unit = float(match.group(1)), match.group(2)
    if unit.lower() in _BITS:
        scale = _BITS[unit.lower()]
    elif unit.endswith("b/s") and unit.lower() in _RATE_UNITS:   # a lower-case b: bits, whatever the prefix's case
        scale = _RATE_UNITS[unit.lower()] / 8                    # (400gb/s read as 400 GB/s: helper-58)
    elif unit.lower() in _RATE_UNITS:
        scale = _RATE_UNITS[unit.lower()]
    else:
        raise ValueError(f"not a bandwidth: {text!r} (examples: 50GB/s, 400Gb/s, 64GiB/s)")
    if not 0 < value * scale < float("inf"):
        raise ValueError(f"bandwidth must be > 0 and finite, got {text!r}")
    return value * scale


MIN_LINK_BYTES_PER_S = 1e6
"""Slowest link accepted (1 MB/s, well below 1 Gb Ethernet's 125 MB/s): 16 GiB of KV (128K tokens of Llama-3-8B)
then takes at most ~1.7e10 us, far inside the 2**53 us the simulator's float clock holds exactly."""
MAX_LINK_LATENCY_US = 1e6
"""Longest link latency accepted (1 s)."""


def parse_kv_link(text: str) -> KvLink:
    """A KV link as written: a preset name (:data:`LINKS`) or ``BANDWIDTH[,LATENCY]``.

    Raises:
        FieldError: one line naming the field ``kv_link`` and the value (a command line names its flag).
    """
    name = text.strip().lower()
    if name in LINKS:
        return LINKS[name]
    rate_text, _, latency_text = text.partition(",")
    try:
        rate = parse_bandwidth_bytes_per_s(rate_text)
        latency_us = 0.0
        if latency_text.strip():
            stripped = latency_text.strip()
            latency_us = 0.0 if re.fullmatch(r"0+(\.0*)?\s*(us|ms|s)?", stripped) else parse_duration_us(stripped)
    except ValueError as exc:
        raise FieldError(f"kv_link={text!r}: {exc}; or one of {', '.join(LINKS)}", "kv_link") from None
    if not MIN_LINK_BYTES_PER_S <= rate or latency_us > MAX_LINK_LATENCY_US:
        raise FieldError(f"kv_link={text!r}: a bandwidth below 1 MB/s or a latency above 1 s puts a transfer of a long "
                         "prompt's KV beyond what the microsecond clock holds exactly; no datacenter link is that slow",
                         "kv_link")
    return KvLink(text.strip(), rate, latency_us, "user-given")


def streamed_finish_us(start_us: float, chunks: Iterable[tuple[float, float, int]], bytes_per_token: float,
                       num_layers: int, bytes_per_us: float) -> tuple[float, float]:
    """When a layer-wise streamed KV transfer starts and ends (both us, the latency not included).

    The link becomes usable at ``start_us`` (the decode side's pages are mapped and the link is free). Chunk
    ``(compute_start_us, compute_end_us, tokens)`` of the prefill produces ``tokens * bytes_per_token`` bytes,
    ``1 / num_layers`` of them at the end of each of ``num_layers`` equal slices of its compute time; the link
    sends the layers in order, one after the other, at ``bytes_per_us``. For one chunk with layer slices of
    ``d`` us, layer sends of ``s`` us, layer 0 ready at ``a`` and the link free at ``f``, the FIFO pipe ends at
    ``max(f + N s, a + N s, a + (N - 1) d + s)`` (the slowest of: link-bound from ``f``, link-bound from the
    first layer, compute-bound with the last layer's send). With all chunks already computed before
    ``start_us`` this is ``start_us + bytes / bytes_per_us``: the transfer after the prefill.

    Returns:
        ``(first_byte_us, last_byte_us)``; ``(start_us, start_us)`` when there is nothing to send.
    """
    finish, first = start_us, None
    for compute_start_us, compute_end_us, tokens in chunks:
        if tokens <= 0:
            continue
        slice_us = (compute_end_us - compute_start_us) / num_layers
        send_us = tokens * bytes_per_token / num_layers / bytes_per_us
        ready_us = compute_start_us + slice_us
        if first is None:
            first = max(start_us, ready_us)
        finish = max(finish + num_layers * send_us, ready_us + num_layers * send_us,
                     ready_us + (num_layers - 1) * slice_us + send_us)
    return (start_us if first is None else first), finish


__all__ = ["KvLink", "LINKS", "parse_bandwidth_bytes_per_s", "parse_kv_link", "streamed_finish_us"]
