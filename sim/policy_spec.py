"""Memory-policy specs: ``NAME[:key=value,...]`` -> :class:`sim.config.SimConfig` overrides.

A policy is written ``NAME[:key=value,key=value,...]`` (``kvsim simulate --policy``, ``kvsim compare --policy``)::

    vattention:page=2MiB            vattention:page=256KiB,sync      vattention:deferred=off
    vattention:create=ondemand      vattention:lookahead=0,eager=0   paged:block=16   static:max_len=4096
    vattention:layout=cross-layer   vattention:batched=on            vattention:zero=on-reuse
    paged:admission=chunk           vattention:prefix=on
    vattention:window=unmap         vattention:window=recycle        paged:window=free

:data:`POLICY_KEYS` maps each policy's keys to the SimConfig field they set and the parser of the value
(meanings and defaults: :class:`sim.config.SimConfig`; ``kvsim compare --help`` lists them).
"""
from __future__ import annotations

from sim.config import POLICIES, ConfigError
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


# key -> (SimConfig field, parser)
_COMMON = {"preempt": ("preemption", _choice("recompute", "swap")),
           "prefix": ("prefix_caching", _on_off),
           "zero": ("zero_on_reuse", _choice("off", "on-reuse", "on-free")),
           "admission": ("admission", _choice("whole-prompt", "chunk"))}
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
        "window": ("window_alloc", _choice("off", "unmap", "recycle")),
        **_COMMON},
    "paged": {
        "block": ("block_size_tokens", int), "factor": ("paged_attention_factor", float),
        "bt_base_us": ("block_table_base_us", float), "bt_per_block_us": ("block_table_per_block_us", float),
        "window": ("window_alloc", _choice("off", "free")),
        **_COMMON},
    "static": {"max_len": ("max_len_tokens", int), **_COMMON},
}


def policy_config_error(spec: str, exc: Exception) -> ConfigError:
    """``exc`` (a configuration error met while applying ``spec``) as one error that names the spec; a page
    size the spec set is named by its key (``page=``), not by the ``--page-size`` flag the user did not pass."""
    message = str(exc)
    if spec in message:
        return ConfigError(message)
    if "page=" in spec:
        message = message.replace("--page-size ", "page=")
    name = spec.partition(":")[0].strip().lower()
    for key, (field_name, *_) in POLICY_KEYS.get(name, {}).items():   # SimConfig's field=... as the spec's key=...
        if f"{key}=" in spec:
            message = message.replace(f"{field_name}=", f"{key}=")
    return ConfigError(f"policy {spec!r}: {message}")


def parse_policy(spec: str) -> dict:
    """``"vattention:page=256KiB,sync"`` -> SimConfig overrides ``{"policy": ..., "page_size_bytes": ...}``.

    Raises:
        ConfigError: naming the spec, the key and the valid keys or values.
    """
    name, _, rest = spec.partition(":")
    name = name.strip().lower()
    if name not in POLICY_KEYS:
        raise ConfigError(f"policy {spec!r}: unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
    overrides: dict = {"policy": name}
    seen: dict[str, str] = {}    # SimConfig field -> the key that set it (sync and mapping set one field)
    for item in filter(None, (part.strip() for part in rest.split(","))):
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
            raise ConfigError(f"policy {spec!r}: {key}={value!r}: {exc}") from None
    return overrides
