"""Memory-policy specs: ``NAME[:key=value,...]`` -> :class:`sim.setup.config.SimConfig` overrides.

A policy is written ``NAME[:key=value,key=value,...]`` (``kvsim simulate --policy``, ``kvsim compare --policy``)::

    vattention:page=2MiB            vattention:page=256KiB,sync      vattention:deferred=off
    vattention:create=ondemand      vattention:lookahead=0,eager=0   paged:block=16   static:max_len=4096
    vattention:layout=cross-layer   vattention:batched=on            vattention:zero=on-reuse
    paged:admission=chunk           vattention:prefix=on             paged:kernel=fa2-paged
    paged:kernel=vllm-v0,prefill_factor=1.1                          vattention:page=64KiB,driver=modified
    paged:prefix=on,evict=radix-leaf
    vattention:window=unmap         vattention:window=recycle        paged:window=free

:data:`POLICY_KEYS` maps each policy's keys to the SimConfig field they set and the parser of the value
(meanings and defaults: :class:`sim.setup.config.SimConfig`; ``kvsim compare --help`` lists them).
"""
from __future__ import annotations

from sim.setup.config import POLICIES, VMM_DRIVERS, ConfigError
from sim.setup.config_checks import (MAX_ATTENTION_FACTOR, MAX_BLOCK_TABLE_BASE_US,
                                      MAX_BLOCK_TABLE_PER_BLOCK_US)
from sim.timing.paged_kernels import PAGED_KERNELS
from sim.units import parse_size_bytes

_ON_OFF = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}


def _on_off(value: str) -> bool:
    if value.lower() not in _ON_OFF:
        raise ValueError(f"expected on/off, got {value!r}")
    return _ON_OFF[value.lower()]


def _choice(*choices: str):
    def parse(value: str) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return value
    return parse


def _kernel(value: str) -> str:
    if value not in PAGED_KERNELS:
        raise ValueError(f"unknown kernel {value!r}; choose one of {', '.join(PAGED_KERNELS)}")
    return value


def _factor(value: str) -> float:
    """An attention-time factor: a finite number >= 1."""
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"expected a number >= 1 (paged / contiguous attention time), got {value!r}") from None
    if not 1 <= number <= MAX_ATTENTION_FACTOR:
        raise ValueError(f"must lie in [1, {MAX_ATTENTION_FACTOR:g}] (paged / contiguous attention time), "
                         f"got {value!r}")
    return number


# key -> (SimConfig field, parser)
_COMMON = {"preemption": ("preemption", _choice("recompute", "swap")),
           "preempt": ("preemption", _choice("recompute", "swap")),     # deprecated spelling of preemption=
           "prefix": ("prefix_caching", _on_off),
           "zero": ("zero_on_reuse", _choice("off", "on-reuse", "on-free")),
           "admission": ("admission", _choice("whole-prompt", "chunk")),
           "evict": ("prefix_evict", _choice("lru", "radix-leaf", "page"))}
POLICY_KEYS: dict[str, dict] = {
    "vattention": {
        "page": ("page_size_bytes", parse_size_bytes),
        "sync": ("sync_mapping", lambda v: True if v == "" else _on_off(v)),
        "mapping": ("sync_mapping", lambda v: _choice("sync", "async")(v) == "sync"),
        "deferred": ("deferred_reclaim", _on_off),
        "lookahead": ("eager_lookahead_steps", int),
        "eager": ("eager_page_groups", int),
        "eager_slots": ("eager_idle_slots", int),
        "watermark": ("low_watermark_frac", float),
        "create": ("create_on_demand", lambda v: _choice("startup", "ondemand")(v) == "ondemand"),
        "layout": ("kv_layout", _choice("per-layer", "cross-layer")),
        "layout_factor": ("layout_attention_factor", float),
        "batched": ("batched_set_access", _on_off),
        "driver": ("vmm_driver", _choice(*VMM_DRIVERS)),
        "window": ("window_alloc", _choice("off", "unmap", "recycle")),
        **_COMMON},
    "paged": {
        "block": ("block_size_tokens", int), "factor": ("paged_attention_factor", _factor),
        "kernel": ("paged_kernel", _kernel), "prefill_factor": ("paged_prefill_factor", _factor),
        "decode_factor": ("paged_decode_factor", _factor),
        "bt_base_us": ("block_table_base_us", float), "bt_per_block_us": ("block_table_per_block_us", float),
        "window": ("window_alloc", _choice("off", "free")),
        **_COMMON},
    "static": {"max_len": ("max_len_tokens", int), "window": ("window_alloc", _choice("off", "reserve")), **_COMMON},
}


# SimConfig checks whose messages name a quantity rather than a flag or key: field -> (is the value allowed, the
# rule as a spec's key=value is told it). The ranges are SimConfig.__post_init__'s.
_KEY_RULES = {
    "paged_attention_factor": (lambda v: 1 <= v <= MAX_ATTENTION_FACTOR,
                               f"must lie in [1, {MAX_ATTENTION_FACTOR:g}] (the paged kernel's attention time as a "
                               "multiple of a contiguous kernel's)"),
    "block_table_base_us": (lambda v: 0 <= v <= MAX_BLOCK_TABLE_BASE_US,
                            f"must lie in [0, {MAX_BLOCK_TABLE_BASE_US:g}] (microseconds)"),
    "block_table_per_block_us": (lambda v: 0 <= v <= MAX_BLOCK_TABLE_PER_BLOCK_US,
                                 f"must lie in [0, {MAX_BLOCK_TABLE_PER_BLOCK_US:g}] (microseconds)"),
    "layout_attention_factor": (lambda v: 0 < v <= MAX_ATTENTION_FACTOR,
                                f"must lie in (0, {MAX_ATTENTION_FACTOR:g}] (an attention-time multiplier)"),
    "block_size_tokens": (lambda v: v >= 1, "must be >= 1 token"),
}


def _spec_values(spec: str) -> dict[str, str]:
    """The spec's ``key -> value`` as written (``sync`` alone: an empty value)."""
    items = (part.strip() for part in spec.partition(":")[2].split(","))
    return {key.strip(): value.strip() for key, _, value in (item.partition("=") for item in items if item)}


def policy_config_error(spec: str, exc: Exception) -> ConfigError:
    """``exc`` (a configuration error met while applying ``spec``) as one error that names the spec and, where
    the check that failed is one of a key the spec set, that key as written (``factor=0.5: must be >= 1``),
    never SimConfig's internal field name (a page size the spec set is ``page=``, not the ``--page-size`` flag
    the user did not pass). The fields the spec did not set stay in the error's ``fields``, for the command line
    to name by their flags (:func:`sim.frontend.flags.flag_message`)."""
    message = str(exc)
    fields = list(getattr(exc, "fields", ()))
    if repr(spec) in message:       # already names the spec (quoted: a bare policy name may be in any message)
        return ConfigError(message, *fields)
    name = spec.partition(":")[0].strip().lower()
    written = _spec_values(spec)
    for key, (field_name, parse, *_) in POLICY_KEYS.get(name, {}).items():
        if key not in written:
            continue
        if field_name in _KEY_RULES:
            allowed, rule = _KEY_RULES[field_name]
            try:
                broken = not allowed(parse(written[key]))
            except (TypeError, ValueError):
                broken = False
            if broken:
                return ConfigError(f"policy {spec!r}: {key}={written[key]}: {rule}")
        message = message.replace(f"{field_name}=", f"{key}=")     # SimConfig's field=... as the spec's key=...
        fields = [other for other in fields if other != field_name]
    return ConfigError(f"policy {spec!r}: {message}", *fields)


def parse_policy(spec: str) -> dict:
    """``"vattention:page=256KiB,sync"`` -> SimConfig overrides ``{"policy": ..., "page_size_bytes": ...}``.

    Raises:
        ConfigError: naming the spec, the key and the valid keys or values.
    """
    from sim.units import comma_items

    if not isinstance(spec, str):
        raise TypeError(f"policy spec: expected a string such as 'vattention:page=256KiB', got {spec!r}")
    name, colon, rest = spec.partition(":")
    name = name.strip().lower()
    if name not in POLICY_KEYS:
        raise ConfigError(f"policy {spec!r}: unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
    overrides: dict = {"policy": name}
    seen: dict[str, str] = {}    # SimConfig field -> the key that set it (sync and mapping set one field)
    if colon and not rest.strip():
        raise ConfigError(f"policy {spec!r}: nothing after ':' (write {name}, or {name}:key=value,...)")
    try:
        items = comma_items(rest, f"policy {spec!r}")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for item in items:
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in POLICY_KEYS[name]:
            raise ConfigError(f"policy {spec!r}: unknown key {key!r} for {name}; "
                              f"valid keys: {', '.join(POLICY_KEYS[name])}")
        field_name, parse = POLICY_KEYS[name][key][:2]
        if field_name in seen:
            first = seen[field_name]
            raise ConfigError(f"policy {spec!r}: key {key!r} given twice" if first == key else
                              f"policy {spec!r}: keys {first!r} and {key!r} both set {field_name}; give one")
        seen[field_name] = key
        try:
            overrides[field_name] = parse(value.strip())
        except ValueError as exc:
            what = {int: "expected a whole number", float: "expected a number"}.get(parse)
            raise ConfigError(f"policy {spec!r}: {key}={value.strip()}: " +
                              (f"{what}, got {value.strip()!r}" if what else str(exc))) from None
    if "paged_kernel" in overrides and "paged_attention_factor" in overrides:
        raise ConfigError(f"policy {spec!r}: kernel= and factor= both set the paged attention factors; give "
                          "kernel= (prefill_factor= / decode_factor= replace one phase's) or factor= (both phases)")
    if seen:                       # what the user wrote is never replaced by a profile's measurement
        overrides["explicit_fields"] = tuple(sorted(seen))
    return overrides
