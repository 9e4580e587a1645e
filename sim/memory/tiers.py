"""KV cache tiers below HBM for the prefix cache: host DRAM and SSD (``kv_tiers``).

The HBM prefix cache (:class:`sim.memory.prefix.PrefixCachingPolicy`) evicts entries (one cache page each: a
vAttention page group or a paged block); with tiers, an evicted entry is *demoted* to the first tier below
HBM instead of being lost, a full tier demotes its own least recently used entry to the next one, and the
last tier drops it. A later prompt whose cached run in HBM stops at page ``k`` looks pages ``k, k+1, ...`` up
in the tiers (contiguous, within the same ``prompt - 1`` cap as the HBM hit) and *loads* them back into fresh
HBM pages, which the request then donates to the HBM cache as it would pages it computed::

    prompt pages:  0      1      2      3      4      5 ...
                   [HBM]  [HBM]  [DRAM] [DRAM] [SSD]  computed ...
                   <- mapped -> <--- loaded over the link --->

Write policies (when a page reaches the first tier):

* ``write-back`` (default): on eviction from HBM. The copy must finish before the page group is reused, so
  its link time is charged to the next iteration's critical path: SGLang HiCache ``write_back``
  (``python/sglang/srt/mem_cache/hiradix_cache.py``: ``evict`` calls ``write_backup(node, write_back=True)``
  and then ``writing_check(write_back=True)``, which waits for the copies).
* ``write-through``: when the page is donated to the HBM cache (computed), copied off the critical path; an
  eviction then moves nothing. SGLang HiCache ``write_through`` (same file: ``write_through_threshold = 1``,
  every node is backed up on insertion); vLLM's CPU offloading connector
  (``vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py``: stores every computed block after
  the forward pass, asynchronously) and LMCache's vLLM connector (stores on ``save_kv_layer`` / ``wait_for_save``)
  behave as write-through.

Load policies (``load=``, how a tier hit is read back):

* ``sync``: the whole load before the iteration computes, on its critical path (LMCache's connector with
  ``use_layerwise: false``: ``start_load_kv`` retrieves every hit block before the forward pass);
* ``layerwise``: layer by layer, overlapped with the iteration's compute (vLLM's KV-connector interface
  ``wait_for_layer_load`` per layer, ``vllm/distributed/kv_transfer/kv_connector/v1/base.py``; LMCache
  ``use_layerwise: true``): the iteration takes ``max(compute, load) + load / num_layers`` (the first layer's
  load is not hidden);
* ``auto``: per request, load only when the load is faster than recomputing those tokens (estimated with the
  run's compute model), else recompute them: the compute-or-load choice of Cake (Jin et al., "Compute Or Load
  KV Cache? Why Not Both?", arXiv:2410.03065), made whole per request (kvsim's simplification: no split).

Tier defaults (``dram:SIZE`` / ``ssd:SIZE``), per direction:

* ``dram``: pinned host memory over PCIe Gen5 x16, **55 GB/s** each way, 10 us per transfer (the ``pcie`` link
  of :mod:`sim.timing.kvlink`: 64 GB/s raw per direction, ~55 GB/s achieved for pinned copies, PCI-SIG PCIe 5.0;
  latency: estimate). A profile with a ``host_copy`` section (``hwbackend/beyond/host_copy_bench.py``, measured
  on the GPU) replaces these defaults (:func:`with_host_copy_profile`).
* ``ssd``: one PCIe Gen5 NVMe drive, **13 GB/s read, 6.6 GB/s write** (Samsung PM1743 specifications, as
  announced by Samsung in December 2021: sequential read 13,000 MB/s, write 6,600 MB/s), 100 us per transfer
  (estimate: one NVMe command round trip plus a flash read, ~50-100 us). SSD traffic passes through host memory;
  the drive is the slower stage, so its rates bound the transfer.

A tier holds whole cache pages of ``tokens_per_page x kv_bytes_per_token`` bytes (the KV the page holds, not
its padding); its capacity in pages is ``capacity_bytes // page_bytes``. The store keeps no time: it counts
bytes and link time per tier, and the engine charges the critical-path part (:class:`sim.core.engine.Simulator`).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sim.units import US_PER_S, parse_duration_us, parse_size_bytes

TIER_KINDS = ("dram", "ssd")
WRITE_POLICIES = ("write-back", "write-through")
LOAD_POLICIES = ("sync", "layerwise", "auto")
DEFAULT_SOURCE = "default"

_DEFAULTS = {   # kind -> (read bytes/s, write bytes/s, latency us, source); module docstring for the sources
    "dram": (55e9, 55e9, 10.0, "PCIe Gen5 x16, ~55 GB/s achieved per direction (PCI-SIG PCIe 5.0; sim.timing.kvlink "
                               "'pcie'); latency: estimate"),
    "ssd": (13e9, 6.6e9, 100.0, "Samsung PM1743 PCIe Gen5 NVMe: 13,000 MB/s read, 6,600 MB/s write (Samsung, "
                                "Dec 2021); latency: estimate"),
}


@dataclass(frozen=True)
class TierSpec:
    """One KV tier below HBM.

    Attributes:
        kind: ``dram`` or ``ssd``.
        capacity_bytes: bytes of KV the tier holds.
        read_bytes_per_s: tier -> GPU rate (bytes/s), the load path.
        write_bytes_per_s: GPU -> tier rate (bytes/s), the store path.
        latency_us: fixed cost of one transfer (us), paid once per load or store batch.
        source: where the rates come from (``default: ...`` until a profile or the user sets them).
        given: which of ``read_bw``, ``write_bw``, ``latency`` the spec set (``bw`` sets both rates); a
            calibration profile's measured host-copy figures replace only the others
            (:func:`with_host_copy_profile`).
    """

    kind: str
    capacity_bytes: int
    read_bytes_per_s: float
    write_bytes_per_s: float
    latency_us: float
    source: str = DEFAULT_SOURCE
    given: tuple = ()

    def read_us(self, num_bytes: float) -> float:
        """Latency plus wire time (us) of one load of ``num_bytes`` (0 for nothing)."""
        return self.latency_us + num_bytes / self.read_bytes_per_s * US_PER_S if num_bytes else 0.0

    def write_us(self, num_bytes: float) -> float:
        """Latency plus wire time (us) of one store of ``num_bytes`` (0 for nothing)."""
        return self.latency_us + num_bytes / self.write_bytes_per_s * US_PER_S if num_bytes else 0.0


def parse_kv_tier(text: str) -> TierSpec:
    """A tier spec (a ``kv_tiers`` entry): ``KIND:SIZE[,bw=RATE][,read_bw=RATE][,write_bw=RATE][,latency=DURATION]``, e.g.
    ``dram:256GiB``, ``ssd:2TB,read_bw=7GB/s,write_bw=4GB/s,latency=80us`` (``bw`` sets both directions).

    Raises:
        ValueError: one line naming the spec and what is wrong (the front end adds its flag).
    """
    from sim.timing.kvlink import parse_bandwidth_bytes_per_s
    kind, _, rest = text.partition(":")
    kind = kind.strip().lower()
    if kind not in TIER_KINDS:
        raise ValueError(f"tier {text!r}: unknown tier {kind!r}; choose one of {', '.join(TIER_KINDS)}")
    from sim.units import comma_items

    size_text, *items = comma_items(rest, f"tier {text!r}") or [""]
    try:
        capacity = parse_size_bytes(size_text)
    except ValueError as exc:
        raise ValueError(f"tier {text!r}: size: {exc}") from None
    from sim.timing.kvlink import MAX_LINK_LATENCY_US, MIN_LINK_BYTES_PER_S
    read, write, latency, source = _DEFAULTS[kind]
    values: dict[str, float] = {}
    for item in items:                  # none empty (comma_items)
        key, _, value = (s.strip() for s in item.partition("="))
        if key in values:
            raise ValueError(f"tier {text!r}: key {key!r} given twice")
        try:
            if key in ("bw", "read_bw", "write_bw"):
                values[key] = parse_bandwidth_bytes_per_s(value)
                if values[key] < MIN_LINK_BYTES_PER_S:
                    raise ValueError(f"{key}={value}: below 1 MB/s, no DRAM or SSD link is that slow (a load of "
                                     "a long prompt's KV would pass what the microsecond clock holds exactly)")
            elif key == "latency":
                values[key] = 0.0 if value.strip("0.").lower() in ("", "us", "ms", "s") else parse_duration_us(value)
                if values[key] > MAX_LINK_LATENCY_US:
                    raise ValueError(f"latency={value}: above 1 s, no DRAM or SSD transfer waits that long")
            else:
                raise ValueError(f"unknown key {key!r}; valid keys: bw, read_bw, write_bw, latency")
        except ValueError as exc:
            raise ValueError(f"tier {text!r}: {exc}") from None
    # the direction keys win over bw whatever the order (bw=5GB/s,read_bw=1GB/s and read_bw=1GB/s,bw=5GB/s agree)
    read = values.get("read_bw", values.get("bw", read))
    write = values.get("write_bw", values.get("bw", write))
    latency = values.get("latency", latency)
    given = tuple(key for key, keys in (("read_bw", ("read_bw", "bw")), ("write_bw", ("write_bw", "bw")),
                                        ("latency", ("latency",))) if any(k in values for k in keys))
    return TierSpec(kind, capacity, read, write, latency, "user-given" if given else f"{DEFAULT_SOURCE}: {source}",
                    given)


def check_tiers(tiers: Sequence[TierSpec]) -> str | None:
    """Why an ordered tier list is refused (None if it is fine): each kind at most once, DRAM above SSD."""
    kinds = [tier.kind for tier in tiers]
    if len(set(kinds)) != len(kinds):
        return f"kv_tiers: each tier at most once, got {', '.join(kinds)}"
    if kinds != sorted(kinds, key=TIER_KINDS.index):
        return "kv_tiers: give dram before ssd (tiers are ordered from HBM down)"
    return None


def with_host_copy_profile(tiers: Sequence[TierSpec], profile: dict) -> tuple[TierSpec, ...]:
    """The tiers with a DRAM tier at its defaults taking the profile's measured host-copy rates: section
    ``host_copy`` with ``h2d_bytes_per_s``, ``d2h_bytes_per_s`` and ``latency_us`` (written by
    ``hwbackend/beyond/host_copy_bench.py``); the others unchanged."""
    section = profile.get("host_copy") or {}
    if not section or not all(k in section for k in ("h2d_bytes_per_s", "d2h_bytes_per_s", "latency_us")):
        return tuple(tiers)
    measured = {"read_bw": ("read_bytes_per_s", "h2d_bytes_per_s"), "write_bw": ("write_bytes_per_s", "d2h_bytes_per_s"),
                "latency": ("latency_us", "latency_us")}
    out = []
    for tier in tiers:
        taken = [key for key in measured if key not in tier.given]
        if tier.kind != "dram" or not taken:
            out.append(tier)
            continue
        profiled = f"profile host_copy ({section.get('source', 'measured')})"
        source = (profiled if not tier.given else
                  f"user-given {', '.join(tier.given)}; {', '.join(taken)} from the {profiled}")
        out.append(replace(tier, source=source, **{measured[key][0]: float(section[measured[key][1]]) for key in taken}))
    return tuple(out)


class TierStore:
    """The tiers' contents (LRU per tier) and their traffic. Accounting only: no clock.

    Args:
        tiers: the tiers from HBM down (:func:`check_tiers`).
        page_bytes: bytes of one cache page (tokens per page x KV bytes per token).
        tokens_per_page: tokens of one cache page.
        write_policy: ``write-back`` or ``write-through`` (module docstring).

    Conservation (per tier): ``inserted - removed == resident <= capacity_pages``, and a key is in at most one
    tier below HBM (a demotion moves it).
    """

    def __init__(self, tiers: Sequence[TierSpec], page_bytes: int, tokens_per_page: int,
                 write_policy: str = "write-back"):
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"tier write policy {write_policy!r}: choose one of {', '.join(WRITE_POLICIES)}")
        self.tiers = tuple(tiers)
        self.page_bytes, self.tokens_per_page, self.write_policy = page_bytes, tokens_per_page, write_policy
        self.capacity_pages = [tier.capacity_bytes // page_bytes for tier in self.tiers]
        self.contents: list[OrderedDict[tuple, None]] = [OrderedDict() for _ in self.tiers]
        self.where: dict[tuple, int] = {}              # key -> its tier
        self.pending_critical_us = 0.0                 # write-back stores owed by the next iteration
        self.hbm_demotions = 0                         # pages HBM evicted into the tiers (or already there)
        names = ("hit_tokens", "miss_tokens", "promotions", "demotions", "inserted", "removed", "dropped",
                 "bytes_read", "bytes_written", "read_us", "write_us", "lookups")
        self.stats = [dict.fromkeys(names, 0) for _ in self.tiers]
        for stat in self.stats:
            stat["read_us"] = stat["write_us"] = 0.0

    # ---- contents --------------------------------------------------------------------------------------
    def occupancy_pages(self) -> list[int]:
        """Pages resident per tier."""
        return [len(c) for c in self.contents]

    def _insert(self, key: tuple, tier: int) -> float:
        """Put ``key`` in ``tier`` (most recently used), demoting the tier's LRU page when full; returns the
        link time (us) of the store into ``tier`` (a cascade below it is host-side, counted but not returned:
        it does not hold the GPU page)."""
        if self.capacity_pages[tier] == 0:
            self.stats[tier]["dropped"] += 1
            return 0.0
        time_us = self._count_write(tier, 1)
        contents = self.contents[tier]
        if len(contents) >= self.capacity_pages[tier]:
            victim, _ = contents.popitem(last=False)
            del self.where[victim]
            self.stats[tier]["removed"] += 1
            if tier + 1 < len(self.tiers):
                self.stats[tier]["demotions"] += 1
                self._insert(victim, tier + 1)
            else:
                self.stats[tier]["dropped"] += 1
        contents[key] = None
        self.where[key] = tier
        self.stats[tier]["inserted"] += 1
        return time_us

    def _count_write(self, tier: int, pages: int) -> float:
        size = pages * self.page_bytes
        time_us = self.tiers[tier].write_us(size)
        self.stats[tier]["bytes_written"] += size
        self.stats[tier]["write_us"] += time_us
        return time_us

    def touch(self, key: tuple) -> None:
        """Mark a resident key most recently used in its tier."""
        tier = self.where.get(key)
        if tier is not None:
            self.contents[tier].move_to_end(key)

    # ---- HBM events --------------------------------------------------------------------------------------
    def on_evict(self, key: tuple) -> None:
        """HBM evicted ``key``: write-back demotes it to the first tier (critical-path copy); write-through
        has it there already (or lost it to a lower tier or a drop), so only its recency changes."""
        self.hbm_demotions += 1
        if key in self.where:
            self.touch(key)
            return
        if self.write_policy == "write-back":
            self.pending_critical_us += self._insert(key, 0)

    def on_donate(self, key: tuple) -> None:
        """HBM cached a new page (computed or loaded): write-through stores it in the first tier now, off the
        critical path (asynchronous store after the forward pass)."""
        if self.write_policy != "write-through":
            return
        if key in self.where:
            self.touch(key)
            return
        self._insert(key, 0)

    # ---- lookups and loads --------------------------------------------------------------------------------
    def find(self, keys: Sequence[tuple]) -> list[tuple[tuple, int]]:
        """The leading run of ``keys`` resident in some tier, each with its tier (stops at the first miss)."""
        found = []
        for key in keys:
            tier = self.where.get(key)
            if tier is None:
                break
            found.append((key, tier))
        return found

    def load_us(self, found: Sequence[tuple[tuple, int]]) -> float:
        """Link time (us) of loading ``found``: one transfer per tier (latency once), the tiers in turn."""
        pages = self._pages_per_tier(found)
        return sum(self.tiers[t].read_us(n * self.page_bytes) for t, n in enumerate(pages) if n)

    def _pages_per_tier(self, found: Sequence[tuple[tuple, int]]) -> list[int]:
        pages = [0] * len(self.tiers)
        for _, tier in found:
            pages[tier] += 1
        return pages

    def commit_load(self, found: Sequence[tuple[tuple, int]], looked_up_pages: int) -> float:
        """Count a load that happened (the admission succeeded): promotions, bytes and time per tier, hits and
        misses in tokens; the loaded keys stay in their tier (inclusive), most recently used. Returns the
        load's link time (us). ``looked_up_pages``: pages past the HBM hit that were looked up."""
        pages = self._pages_per_tier(found)
        total_us = 0.0
        reaching = looked_up_pages
        for tier, count in enumerate(pages):
            stat = self.stats[tier]
            if reaching <= 0:
                break
            stat["lookups"] += 1
            stat["hit_tokens"] += count * self.tokens_per_page
            reaching -= count
            stat["miss_tokens"] += reaching * self.tokens_per_page
            if count:
                size = count * self.page_bytes
                time_us = self.tiers[tier].read_us(size)
                stat["promotions"] += count
                stat["bytes_read"] += size
                stat["read_us"] += time_us
                total_us += time_us
        for key, _ in found:
            self.touch(key)
        return total_us

    def take_critical_us(self) -> float:
        """The write-back store time owed by the next iteration (then 0)."""
        pending, self.pending_critical_us = self.pending_critical_us, 0.0
        return pending

    def conservation_error(self) -> int:
        """Sum over tiers of ``|inserted - removed - resident|`` plus keys outside their recorded tier and pages
        beyond capacity: 0 when the store is consistent."""
        error = 0
        for tier, contents in enumerate(self.contents):
            stat = self.stats[tier]
            error += abs(stat["inserted"] - stat["removed"] - len(contents))
            error += max(0, len(contents) - self.capacity_pages[tier])
            error += sum(1 for key in contents if self.where.get(key) != tier)
        return error + abs(len(self.where) - sum(len(c) for c in self.contents))

    def summary(self) -> dict:
        """Per-tier figures for ``summary.json``: ``tier_<kind>_<figure>`` (times in ms)."""
        out = {}
        for tier, stat in zip(self.tiers, self.stats):
            prefix = f"tier_{tier.kind}_"
            for name, value in stat.items():
                if name.endswith("_us"):
                    out[prefix + name.removesuffix("_us") + "_ms"] = value / 1000.0
                else:
                    out[prefix + name] = int(value)
            out[prefix + "capacity_bytes"] = int(tier.capacity_bytes)
            out[prefix + "resident_pages"] = len(self.contents[self.tiers.index(tier)])
            out[prefix + "source"] = tier.source
        out["tier_hbm_demotions"] = self.hbm_demotions
        return out


def tier_keys(policy, hash_ids: Sequence[int], prompt_tokens: int, start_page: int) -> list[tuple]:
    """The cache keys of a prompt's pages from ``start_page`` up to the cap of an HBM hit (``prompt - 1``
    tokens, whole pages inside the prompt's full hash blocks: :meth:`PrefixCachingPolicy.lookup`)."""
    per_page, block = policy.config.tokens_per_page, policy.block_tokens
    full_blocks = min(len(hash_ids), prompt_tokens // block)
    cap_pages = min(full_blocks * block, prompt_tokens - 1) // per_page
    if start_page >= cap_pages:
        return []
    chain = policy.block_chain(hash_ids[:full_blocks])
    return [policy.page_key(chain, page) for page in range(start_page, cap_pages)]


__all__ = ["LOAD_POLICIES", "TIER_KINDS", "WRITE_POLICIES", "TierSpec", "TierStore", "check_tiers",
           "parse_kv_tier", "tier_keys", "with_host_copy_profile"]
