"""The checks of :class:`sim.setup.config.SimConfig` (run by its ``__post_init__``), its name tables and
:class:`ConfigError`; all re-exported by :mod:`sim.setup.config`."""
from __future__ import annotations

from sim.setup.catalog import DTYPE_BYTES
from sim.setup.specs import FieldError
from sim.memory.hybrid_sizing import window_alloc_error
from sim.memory.vattention import knob_range_error
from sim.timing.paged_kernels import PAGED_KERNELS
from sim.units import CLOCK_EXACT_US, format_bytes

SCHEDULERS = ("sarathi", "vllm")
POLICIES = ("vattention", "paged", "static")
KV_LAYOUTS = ("per-layer", "cross-layer")
ZERO_MODES = ("off", "on-reuse", "on-free")
PREEMPTION_MODES = ("recompute", "swap")
ADMISSION_RULES = ("whole-prompt", "chunk")   # meanings: sim.core.scheduler.ADMISSION_RULES
MIN_PAGE_SIZE_BYTES = 64 * 1024
VMM_DRIVERS = ("stock", "modified")  # meanings: SimConfig.vmm_driver


class ConfigError(FieldError):
    """An impossible configuration; the message names the field and the value (``token_budget=0: must be >= 1``)
    and ``fields`` lists the fields it names (:class:`sim.setup.specs.FieldError`), so that a command line names
    its flag instead (:func:`sim.frontend.flags.flag_message`) and a policy spec its key
    (:func:`sim.frontend.policy_spec.policy_config_error`)."""


MAX_ATTENTION_FACTOR = 100.0
"""Largest attention-time multiplier accepted (paged kernel, strided layout): the published ones lie in 1.0-2.8
(vAttention, ASPLOS'25, Figure 2; :mod:`sim.timing.paged_kernels`); 1e308 overflowed the run to NaN latencies."""
MAX_BLOCK_TABLE_BASE_US = 1e6
"""Largest block-table CPU time per iteration accepted (us): a second; vLLM's is ~50 us (``SimConfig``)."""
MAX_BLOCK_TABLE_PER_BLOCK_US = 1e3
"""Largest block-table CPU time per block accepted (us); vLLM's is ~0.02 us."""


def _tier_error(config) -> tuple[str, ...] | None:
    """Why the KV tier and eviction settings are refused (sim.memory.tiers, sim.memory.eviction): the message and
    the fields it names, or None. The defaults pass without importing either module (start-up, issue 32)."""
    if (config.prefix_evict, config.tier_write_policy, config.tier_load_policy, config.kv_tiers) == \
            ("lru", "write-back", "sync", ()):
        return None
    from sim.memory.eviction import EVICTION_POLICIES
    from sim.memory.tiers import LOAD_POLICIES, WRITE_POLICIES, check_tiers
    if config.prefix_evict not in EVICTION_POLICIES:
        return f"prefix_evict={config.prefix_evict!r}: choose one of {', '.join(EVICTION_POLICIES)}", "prefix_evict"
    if config.tier_write_policy not in WRITE_POLICIES:
        return (f"tier_write_policy={config.tier_write_policy!r}: choose one of {', '.join(WRITE_POLICIES)}",
                "tier_write_policy")
    if config.tier_load_policy not in LOAD_POLICIES:
        return (f"tier_load_policy={config.tier_load_policy!r}: choose one of {', '.join(LOAD_POLICIES)}",
                "tier_load_policy")
    if config.kv_tiers and not config.prefix_caching:
        return ("KV tiers (kv_tiers) hold prefix-cache pages: turn the prefix cache on (prefix_caching: the policy key "
                "prefix=on of vattention or paged)", "kv_tiers", "prefix_caching")
    problem = check_tiers(config.kv_tiers)
    if problem:
        return problem, "kv_tiers"
    page_bytes = config.tokens_per_page * config.model_spec.kv_bytes_per_token(config.tp)   # one cached page
    for tier in config.kv_tiers:
        if tier.capacity_bytes < page_bytes:
            return (f"kv_tiers: the {tier.kind} tier holds {tier.capacity_bytes:,} bytes, less than one cache page "
                    f"({page_bytes:,} bytes: {config.tokens_per_page} tokens of {config.model}): it could store "
                    "nothing", "kv_tiers")
    return None


def vllm_budget_error(token_budget: int, max_batch_slots: int) -> str:
    """The refusal of a ``vllm`` scheduler whose token budget is below its request slots, naming both fields
    (the fields of the :class:`ConfigError` raised with it: ``scheduler``, ``token_budget``, ``max_batch_slots``). vLLM refuses ``max_num_batched_tokens < max_num_seqs`` ("must be greater than or equal to
    max_num_seqs": ``SchedulerConfig.verify_max_model_len``, vllm/config/scheduler.py, commit 01230b4): each
    scheduled sequence takes at least one token of the step's budget. kvsim's defaults (2048 tokens, 256 slots)
    pass."""
    return (f"scheduler=vllm: token_budget={token_budget} (vLLM's max_num_batched_tokens) is below "
            f"max_batch_slots={max_batch_slots} (vLLM's max_num_seqs); vLLM refuses this "
            f"(max_num_batched_tokens must be >= max_num_seqs): raise token_budget to {max_batch_slots} or more, "
            f"or lower max_batch_slots to {token_budget} or less")


def field_type_error(config) -> tuple[str, str] | None:
    """The first field whose value is not of its annotated kind, as ``(message, field)``, or None: ``int`` a whole
    number (numpy's too; not a bool, not a float such as ``2048.0``), ``float`` a real number (not a bool),
    ``bool`` a bool (not the string ``"False"``, which Python reads as true), ``str`` a string, ``tuple`` a
    tuple; ``X | None`` also ``None``. A value of the wrong kind would otherwise run with another meaning or fail
    deep inside the simulation."""
    from dataclasses import fields

    for item in fields(config):
        kind, value = str(item.type), getattr(config, item.name)
        base = kind.removesuffix(" | None")
        if base not in _KINDS or (value is None and base != kind):
            continue
        accepts, want = _KINDS[base]
        if value is None or not accepts(value):
            return f"{item.name}={value!r}: must be {want}, not {type(value).__name__}", item.name
    return None


def _is_bool(value) -> bool:
    import numpy as np
    return isinstance(value, (bool, np.bool_))


def _is_integral(value) -> bool:
    import numbers
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def _is_real(value) -> bool:
    import numbers
    return isinstance(value, numbers.Real) and not _is_bool(value)


_KINDS = {"int": (_is_integral, "a whole number"), "float": (_is_real, "a number"),
          "bool": (_is_bool, "true or false (a bool)"), "str": (lambda v: isinstance(v, str), "a name (a string)"),
          "tuple": (lambda v: isinstance(v, tuple), "a tuple")}
"""Annotation -> (accepts a value, what it must be) for :func:`field_type_error`."""


def check_config(config) -> None:
    """Refuse an impossible :class:`sim.setup.config.SimConfig` (``config``: the instance being built).

    Raises:
        ConfigError: the first field out of its range or choices, or a combination that cannot run; the
            message names the field(s) and the value (``exc.fields`` lists them).
        CatalogError: a ``tp`` that does not divide the model's heads, or more pipeline stages than layers.
    """
    type_error = field_type_error(config)
    if type_error:
        raise ConfigError(*type_error)
    if config.seed < 0:
        raise ConfigError(f"seed={config.seed}: must be >= 0 (numpy's generator takes non-negative seeds)", "seed")
    tier_error = _tier_error(config)
    if tier_error:
        raise ConfigError(*tier_error)
    if not (isinstance(config.frontend_overhead_us, (int, float))
            and 0 <= config.frontend_overhead_us <= CLOCK_EXACT_US):
        raise ConfigError(f"frontend_overhead_us={config.frontend_overhead_us!r}: must be a number of microseconds "
                          f">= 0 and at most {CLOCK_EXACT_US:.6g} (the clock's exact range, 2**53 ticks of 100 ns)",
                          "frontend_overhead_us")
    for name, value in (("weight_dtype", config.weight_dtype), ("kv_dtype", config.kv_dtype)):
        if value is not None and value not in DTYPE_BYTES:
            raise ConfigError(f"{name}={value}: choose one of {', '.join(DTYPE_BYTES)}", name)
    if config.usd_per_gpu_hour is not None and not 0 < config.usd_per_gpu_hour < float("inf"):
        raise ConfigError(f"usd_per_gpu_hour={config.usd_per_gpu_hour}: must be > 0", "usd_per_gpu_hour")
    if not isinstance(config.null_blocks, int) or isinstance(config.null_blocks, bool) or config.null_blocks < 0:
        raise ConfigError(f"null_blocks={config.null_blocks!r}: a whole number of units >= 0", "null_blocks")
    if not isinstance(config.pp, int) or config.pp < 1:
        raise ConfigError(f"pp={config.pp}: must be >= 1", "pp")
    config.full_model_spec.pipeline_layers(config.pp)      # raises CatalogError for more stages than layers
    if config.prefix_caching and config.policy == "static":
        preset = (f" (the engine={config.engine} preset turns prefix caching on: add prefix=off to the policy, "
                  "e.g. static:prefix=off)" if getattr(config, "engine", None) else "")
        raise ConfigError("prefix caching (prefix_caching) needs the vattention or paged policy, not static "
                          f"reservation{preset}", "prefix_caching", *(("engine",) if preset else ()))
    knob_error = knob_range_error(config)            # the policy's own ranges, refused before any run
    if knob_error:
        raise ConfigError(knob_error, knob_error.partition("=")[0])
    if config.prefix_block_tokens < 1:
        raise ConfigError(f"prefix_block_tokens={config.prefix_block_tokens}: must be >= 1 token", "prefix_block_tokens")
    if config.kv_layout not in KV_LAYOUTS:
        raise ConfigError(f"kv_layout={config.kv_layout}: choose one of {', '.join(KV_LAYOUTS)}", "kv_layout")
    if config.zero_on_reuse not in ZERO_MODES:
        raise ConfigError(f"zero_on_reuse={config.zero_on_reuse}: choose one of {', '.join(ZERO_MODES)}",
                          "zero_on_reuse")
    if config.policy not in POLICIES:
        raise ConfigError(f"policy={config.policy}: choose one of {', '.join(POLICIES)}", "policy")
    if config.preemption not in PREEMPTION_MODES:
        raise ConfigError(f"preemption={config.preemption}: choose one of {', '.join(PREEMPTION_MODES)}",
                          "preemption")
    if config.block_size_tokens < 1:
        raise ConfigError(f"block_size_tokens={config.block_size_tokens}: must be >= 1 token", "block_size_tokens")
    if config.policy == "paged" and config.block_size_tokens > config.slot_max_tokens:
        raise ConfigError(f"block_size_tokens={config.block_size_tokens} (policy key block=): must lie in [1, "
                          f"{config.slot_max_tokens}] tokens, the slot length (max_context_tokens="
                          f"{config.slot_max_tokens}) (a block longer than the slot only adds tail waste; vLLM's "
                          "blocks are 8-128 tokens): lower block= or raise the context", "block_size_tokens",
                          "max_context_tokens")
    if config.max_len_tokens is not None and not 2 <= config.max_len_tokens <= config.slot_max_tokens:
        raise ConfigError(f"max_len_tokens={config.max_len_tokens}: must lie in [2, {config.slot_max_tokens}] tokens "
                          "(the static reservation)", "max_len_tokens")
    if not 0 < config.layout_attention_factor <= MAX_ATTENTION_FACTOR:         # (NaN fails too)
        raise ConfigError(f"layout_attention_factor={config.layout_attention_factor}: must lie in (0, "
                          f"{MAX_ATTENTION_FACTOR:g}] (an attention-time multiplier)", "layout_attention_factor")
    for name, least, most in (("paged_attention_factor", 1, MAX_ATTENTION_FACTOR),
                              ("block_table_base_us", 0, MAX_BLOCK_TABLE_BASE_US),
                              ("block_table_per_block_us", 0, MAX_BLOCK_TABLE_PER_BLOCK_US)):
        if not least <= getattr(config, name) <= most:                         # (NaN fails too: it hung the run)
            raise ConfigError(f"{name}={getattr(config, name)}: must lie in [{least}, {most:g}]", name)
    paged_error = paged_kernel_error(config)
    if paged_error:
        raise ConfigError(paged_error, paged_error.partition("=")[0])
    config.model_spec.check_tp(config.tp)
    hybrid_error = window_alloc_error(config)
    if hybrid_error:
        raise ConfigError(hybrid_error)
    page = config.page_size_bytes
    if page < MIN_PAGE_SIZE_BYTES or page & (page - 1):
        import math
        nearest = 1 << max(16, round(math.log2(page))) if page > 0 else MIN_PAGE_SIZE_BYTES
        hint = (f" (decimal units: {page:,} B is not {format_bytes(nearest)}; write "
                f"{format_bytes(nearest).replace(' ', '')})" if page > 0 and page % 1000 == 0 else "")
        raise ConfigError(f"page_size_bytes={page} B: must be a power of two >= 64KiB{hint}", "page_size_bytes")
    driver_error = vmm_driver_error(config)
    if driver_error:
        raise ConfigError(driver_error, "vmm_driver", "page_size_bytes", "batched_set_access")
    if config.uses_vmm and config.tokens_per_page < 1:
        per_token = config.model_spec.sub_tensor_bytes_per_token(config.tp) * (
            config.model_spec.num_layers if config.kv_layout == "cross-layer" else 1)
        raise ConfigError(f"page_size_bytes={format_bytes(page).replace(' ', '')} holds no token of {config.model} in "
                          f"the {config.kv_layout} layout ({per_token} B per token per tensor)", "page_size_bytes")
    if config.scheduler not in SCHEDULERS:
        raise ConfigError(f"scheduler={config.scheduler}: choose one of {', '.join(SCHEDULERS)}", "scheduler")
    if config.admission is not None and config.admission not in ADMISSION_RULES:
        raise ConfigError(f"admission={config.admission}: choose one of {', '.join(ADMISSION_RULES)}", "admission")
    for name in ("max_batch_slots", "token_budget"):
        if getattr(config, name) < 1:
            raise ConfigError(f"{name}={getattr(config, name)}: must be >= 1", name)
    if config.scheduler == "vllm" and config.token_budget < config.max_batch_slots:
        raise ConfigError(vllm_budget_error(config.token_budget, config.max_batch_slots), "scheduler", "token_budget",
                          "max_batch_slots")
    if config.max_context_tokens is not None and config.max_context_tokens < 2:
        raise ConfigError(f"max_context_tokens={config.max_context_tokens}: must be >= 2 tokens", "max_context_tokens")
    native = config.model_spec.max_context_tokens
    if config.max_context_tokens is not None and config.max_context_tokens > native and not config.allow_long_context:
        raise ConfigError(f"max_context_tokens={config.max_context_tokens}: beyond {config.model}'s native context of "
                          f"{native:,} tokens; set allow_long_context to simulate it anyway", "max_context_tokens",
                          "allow_long_context")
    if not 0 < config.memory_util_frac <= 1:
        raise ConfigError(f"memory_util_frac={config.memory_util_frac}: must lie in (0, 1]", "memory_util_frac")
    if config.kv_budget_bytes < config.page_group_bytes:
        weights, hbm = config.model_spec.weight_bytes(config.tp), config.gpu_spec.hbm_bytes
        unit, unit_field, unit_value = {
            "paged": ("block", "block_size_tokens", config.block_size_tokens),
            "static": ("reservation", "max_len_tokens", config.max_len_tokens)}.get(
            config.policy, ("page group", "page_size_bytes", format_bytes(config.page_size_bytes).replace(" ", "")))
        if unit_field == "max_len_tokens" and unit_value is None:   # a reservation of the whole slot: the context
            unit_field, unit_value = "max_context_tokens", config.slot_max_tokens
        left = (f"{config.model}'s weights at tp={config.tp} ({format_bytes(weights)}) leave "
                f"{format_bytes(max(config.kv_budget_bytes, 0))} for KV cache on {config.gpu}: not one {unit} "
                f"({format_bytes(config.page_group_bytes)})")
        if weights >= hbm:             # no memory_util_frac helps
            raise ConfigError(f"tp={config.tp}: {left}; the weights alone need more than the GPU's "
                              f"{format_bytes(hbm)}: raise tp (or pp)", "tp", "memory_util_frac")
        if weights + config.page_group_bytes > hbm:     # the unit is too large even for the whole memory
            raise ConfigError(f"{unit_field}={unit_value}: {left}, and one {unit} is more than the "
                              f"{format_bytes(hbm - weights)} the weights leave of the whole {format_bytes(hbm)}: "
                              f"use a smaller {unit} or raise tp", unit_field, "tp")
        raise ConfigError(f"memory_util_frac={config.memory_util_frac}: {left}; raise memory_util_frac or tp",
                          "memory_util_frac", "tp")


def paged_kernel_error(config) -> str | None:
    """The message for an unknown paged kernel or a phase factor that is not a finite number >= 1 (named
    by the SimConfig field, which :func:`sim.frontend.policy_spec.policy_config_error` renames to the spec's key)."""
    if config.paged_kernel is not None and config.paged_kernel not in PAGED_KERNELS:
        return (f"paged_kernel={config.paged_kernel}: unknown kernel {config.paged_kernel!r}; choose one of "
                f"{', '.join(PAGED_KERNELS)}")
    for name in ("paged_attention_factor", "paged_prefill_factor", "paged_decode_factor"):
        value = getattr(config, name)
        if value is not None and not (isinstance(value, (int, float)) and 1 <= value <= MAX_ATTENTION_FACTOR):
            return (f"{name}={value}: must lie in [1, {MAX_ATTENTION_FACTOR:g}] (paged / contiguous attention time: a "
                    "paged kernel is never faster than the contiguous one)")
    return None


def vmm_driver_error(config) -> str | None:
    """The message for an unknown ``vmm_driver``, for vAttention pages below 2 MiB on the stock driver, and
    for batched set-access on the modified driver (which grants access without cuMemSetAccess)."""
    if config.vmm_driver is not None and config.vmm_driver not in VMM_DRIVERS:
        return f"vmm_driver={config.vmm_driver}: choose one of {', '.join(VMM_DRIVERS)}"
    if not config.needs_modified_driver:
        return None
    page = format_bytes(config.page_size_bytes).replace(" ", "")
    if config.vmm_driver == "stock":
        return (f"page_size_bytes={page} with vmm_driver=stock: the stock CUDA VMM API allocates 2 MiB pages at "
                "least (cuMemCreate of 64 KiB or 256 KiB fails with CUDA_ERROR_INVALID_VALUE, domain.md); "
                "use pages of 2 MiB or more, or vmm_driver=modified (vAttention's modified NVIDIA UVM driver)")
    if config.batched_set_access:
        return (f"batched_set_access=on with page_size_bytes={page}: pages below 2 MiB go through vAttention's "
                "modified driver, which maps without a cuMemSetAccess per page: there is nothing to batch")
    return None
