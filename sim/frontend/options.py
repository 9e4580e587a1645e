"""Building a :class:`sim.setup.config.SimConfig` from command-line options: the options every command that
simulates shares (:func:`add_config_args`) and the configuration they describe (:func:`config_from_args`),
with a ``--policy`` spec applied (:func:`policy_overrides`, keys in :mod:`sim.frontend.policy_spec`)."""
from __future__ import annotations

import argparse

from sim.frontend.argtypes import int_at_least, positive_float, size_arg
from sim.units import CLOCK_EXACT_US, US_PER_MS


def _milliseconds(text: str) -> float:
    """A finite number of milliseconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {text!r}") from None
    if not 0 <= value <= CLOCK_EXACT_US / US_PER_MS:
        raise argparse.ArgumentTypeError(f"must be a finite number of milliseconds >= 0 and at most "
                                         f"{CLOCK_EXACT_US / US_PER_MS:.6g} (the clock's exact range), got {text!r}")
    return value


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """Options shared by every command that builds a :class:`sim.setup.config.SimConfig`."""
    from sim.setup.catalog import DTYPE_BYTES, gpu_names, model_names
    from sim.setup.engines import ENGINES
    parser.add_argument("--model", default="llama-3-8b",
                        help=f"model: a catalogue name ({', '.join(model_names())}), a Hugging Face config.json "
                             "(e.g. models/mixtral-8x7b.json) or a model TOML (docs/models.md)")
    parser.add_argument("--gpu", default="h200",
                        help=f"GPU: a catalogue name ({', '.join(gpu_names())}) or a GPU TOML (docs/models.md)")
    parser.add_argument("--tp", type=int_at_least(1), default=1, help="tensor-parallel degree (divides KV heads)")
    parser.add_argument("--pp", type=int_at_least(1), default=1,
                        help="pipeline-parallel stages (layers split as vLLM does; GPUs per replica = tp x pp)")
    parser.add_argument("--weight-dtype", choices=tuple(DTYPE_BYTES), default=None,
                        help="dtype of the linear layers' weights (default: the model's, e.g. fp8 for DeepSeek-V3)")
    parser.add_argument("--kv-dtype", choices=tuple(DTYPE_BYTES), default=None,
                        help="dtype of the KV cache (default: the activation dtype, bf16)")
    parser.add_argument("--usd-per-gpu-hour", type=positive_float, default=None,
                        help="price per GPU-hour for cost figures (default: the GPU's catalogue price)")
    parser.add_argument("--page-size", type=size_arg, default="2MiB",
                        help="vAttention page size per K/V sub-tensor, e.g. 2MiB, 256KiB (< 2MiB needs a modified "
                             "driver)")
    parser.add_argument("--max-batch", type=int_at_least(1), default=None,
                        help="request slots B (max concurrent requests; an --engine preset sets its own) (default: 256)")
    parser.add_argument("--scheduler", choices=("sarathi", "vllm"), default=None,
                        help="sarathi: chunked prefill with a token budget; vllm: prefill-first "
                             "(an --engine preset sets its own) (default: sarathi)")
    parser.add_argument("--token-budget", type=int_at_least(1), default=None,
                        help="tokens per iteration (chunked prefill; an --engine preset sets its own) (default: 2048)")
    parser.add_argument("--engine", choices=ENGINES, default=None,
                        help="serving engine whose own defaults to take (scheduler, token budget, max_num_seqs, "
                             "policy and block size, prefix caching, CUDA graphs, front-end cost), each from the "
                             "engine's code (sim/setup/engines.py); explicit flags and --policy keys override it "
                             "(default: none, kvsim's own defaults)")
    parser.add_argument("--frontend-overhead-ms", type=_milliseconds, default=None,
                        help="per-request front-end cost in milliseconds (API server, tokenisation, detokenisation) "
                             "added to TTFT and E2E, not to iterations (docs/serving-semantics.md) "
                             "(default: 0, or the --engine preset's: vllm-v1 10, sglang 10, vattention 0)")
    parser.add_argument("--max-context", type=int_at_least(2), default=None,
                        help="tokens per slot L_max; longer requests are clipped; more than the model's native "
                             "context is refused unless --allow-long-context (default: the model's native context)")
    parser.add_argument("--allow-long-context", action="store_true",
                        help="accept a --max-context beyond the model's native context (like vLLM's "
                             "VLLM_ALLOW_LONG_MAX_MODEL_LEN; the model was not trained for it); recorded in "
                             "config.json as allow_long_context")
    parser.add_argument("--sync-mapping", action="store_true", help="map on the critical path (no background mapper)")
    parser.add_argument("--no-deferred-reclaim", action="store_true",
                        help="unmap a finished request's pages at once instead of keeping them on its slot")
    parser.add_argument("--memory-util", type=positive_float, default=0.9,
                        help="share of GPU memory for weights + KV cache (vLLM gpu_memory_utilization)")
    parser.add_argument("--preemption", choices=("recompute", "swap"), default="recompute",
                        help="when memory runs out: recompute (drop KV) or swap (copy KV to host over PCIe)")
    parser.add_argument("--host-swap", type=size_arg, default="4GiB",
                        help="host memory for swapped KV (vLLM swap_space)")
    parser.add_argument("--seed", type=int_at_least(0), default=0, help="seed of the run's random generator")
    parser.add_argument("--kv-tier", type=_kv_tier, action="append", default=None, metavar="KIND:SIZE[,...]",
                        help="a prefix-cache tier below HBM, repeatable, from HBM down: dram:SIZE or ssd:SIZE with "
                             "optional bw=, read_bw=, write_bw=, latency= (defaults: dram 55 GB/s PCIe Gen5, ssd 13/6.6 "
                             "GB/s NVMe Gen5; docs/tiers.md); needs prefix=on (default: HBM only)")
    parser.add_argument("--kv-tier-write", choices=("write-back", "write-through"), default="write-back",
                        help="when pages reach the first tier: on HBM eviction (write-back, a critical-path copy) or "
                             "when computed (write-through, asynchronous)")
    parser.add_argument("--kv-tier-load", choices=("sync", "layerwise", "auto"), default="sync",
                        help="tier hits: loaded before the iteration, overlapped layer by layer, or loaded only when "
                             "faster than recomputing (auto)")


def _kv_tier(text: str):
    """A ``--kv-tier`` value (:func:`sim.memory.tiers.parse_kv_tier`)."""
    from sim.memory.tiers import parse_kv_tier
    try:
        return parse_kv_tier(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"tier {text!r}: ")) from None


RESERVABLE_VA_BYTES = 64 * 1024 ** 4
"""Virtual addresses one process reserved on an H200 (cuMemAddressReserve of 64 TiB succeeded in ~11 us, 128 TiB
failed: ../shared/reference/domain.md, measurements); the emulated driver's default limit too."""
DEFAULT_MAX_BATCH = 256   # vLLM's max_num_seqs default


def check_slots(config, given: str = "--max-batch") -> None:
    """``--max-batch`` within what the GPU can hold: vAttention reserves, for every slot, ``max_pages_per_slot``
    pages of ``G`` bytes in each of its ``2N'`` K/V tensors (tensor ``[B, L_max, H', D]`` per layer; domain.md),
    so ``B`` slots need ``B x 2N' x pages x G`` of virtual addresses per worker; and no policy ever runs more
    requests at once than its pool has allocation units (every running request holds at least one page group,
    block or reservation), so slots beyond ``max(units, 256)`` can hold nothing (and cost time per slot).

    ``given``: where the slot count came from, for the message (``--max-batch``, or an ``--engine`` preset's).

    Raises:
        ConfigError: naming ``given``, the bound and why (and ``--max-batch`` as the fix).
    """
    from sim.setup.config import ConfigError
    from sim.units import format_bytes
    slots = config.max_batch_slots
    if config.uses_vmm:
        per_slot = config.num_sub_tensors * config.max_pages_per_slot * config.page_size_bytes
        if per_slot > RESERVABLE_VA_BYTES:     # not one slot: the context length is the fault, not the count
            raise ConfigError(f"--max-context {config.slot_max_tokens:,}: one vAttention slot of that many tokens "
                              f"reserves {format_bytes(per_slot)} of virtual addresses ({config.num_sub_tensors} K/V "
                              f"tensors x {config.max_pages_per_slot:,} pages of {format_bytes(config.page_size_bytes)}"
                              f"), beyond the {format_bytes(RESERVABLE_VA_BYTES)} a GPU process can reserve (H200, "
                              f"measured); lower --max-context")
        if slots * per_slot > RESERVABLE_VA_BYTES:
            raise ConfigError(f"{given} {slots:,}: vAttention reserves {format_bytes(per_slot)} of virtual "
                              f"addresses per slot ({config.num_sub_tensors} K/V tensors x {config.max_pages_per_slot}"
                              f" pages of {format_bytes(config.page_size_bytes)}), {format_bytes(slots * per_slot)} in "
                              f"all, beyond the {format_bytes(RESERVABLE_VA_BYTES)} a GPU process can reserve (H200, "
                              f"measured); at most {RESERVABLE_VA_BYTES // per_slot:,} slots")
    units = config.pool_page_groups
    if slots > max(units, DEFAULT_MAX_BATCH):
        unit = {"vattention": "page groups", "paged": "blocks", "static": "reservations"}.get(config.policy, "units")
        raise ConfigError(f"{given} {slots:,}: the {config.policy} pool holds {units:,} {unit}, one at least per "
                          f"running request, so no more than {units:,} requests ever run at once; choose --max-batch "
                          f"<= {max(units, DEFAULT_MAX_BATCH):,}")


def config_from_args(args: argparse.Namespace, **overrides):
    """Build the :class:`SimConfig` from parsed options (raises ConfigError / CatalogError on bad values;
    :func:`check_slots` bounds ``--max-batch``)."""
    config = _config_from_args(args, **overrides)
    engine = getattr(args, "engine", None)
    preset = engine and getattr(args, "max_batch", None) is None and "max_batch_slots" not in overrides
    check_slots(config, f"--engine {engine}'s max batch" if preset else "--max-batch")
    return config


VMM_ONLY_FLAGS = (("sync_mapping", "--sync-mapping"), ("no_deferred_reclaim", "--no-deferred-reclaim"))
"""Switches of vAttention's page mapping (``(args attribute, flag)``): with another policy they change nothing
(``SimConfig.has_async_mapper`` and ``sim.memory.build_policy`` read them for vAttention only;
:func:`ignored_flag_notes`)."""


def ignored_flag_notes(args: argparse.Namespace, config) -> list[str]:
    """One note per vAttention-only flag given with a policy that maps no pages (``paged``, ``static``: also
    ``--page-size``), per tier policy flag set without a ``--kv-tier``, and for ``--host-swap`` without swap
    preemption: the flag changes nothing there, which a user would otherwise not learn (the run is the same without
    it). ``args.given_options``: the long options written on the command line (``cli.main``)."""
    notes = []
    if not config.kv_tiers:
        for attr, flag, default in (("kv_tier_write", "--kv-tier-write", "write-back"),
                                    ("kv_tier_load", "--kv-tier-load", "sync")):
            if getattr(args, attr, default) != default:
                notes.append(f"{flag} {getattr(args, attr)} sets how KV tiers are used; no --kv-tier is given, so it "
                             "changes nothing in this run")
    given = getattr(args, "given_options", ())
    if config.preemption != "swap" and "--host-swap" in given:
        notes.append(f"--host-swap sizes the host memory swapped-out KV goes to; preemption is {config.preemption}, "
                     "so nothing is swapped in this run (--preemption swap swaps)")
    if config.uses_vmm:
        return notes
    if "--page-size" in given:
        notes.append(f"--page-size sets vAttention's page size; the {config.policy} policy maps no pages, so it "
                     "changes nothing in this run" + (" (its block size is paged:block=N)" if config.policy == "paged"
                                                      else ""))
    for attr, flag in VMM_ONLY_FLAGS:
        if getattr(args, attr, False) is True:
            notes.append(f"{flag} sets vAttention's page mapping; the {config.policy} policy maps no pages, so it "
                         "changes nothing in this run")
    return notes


def _config_from_args(args: argparse.Namespace, **overrides):
    from sim.setup.config import ConfigError, SimConfig
    values = dict(model=args.model, gpu=args.gpu, tp=args.tp, page_size_bytes=args.page_size,
                  max_context_tokens=args.max_context, sync_mapping=args.sync_mapping,
                  deferred_reclaim=not args.no_deferred_reclaim, memory_util_frac=args.memory_util, seed=args.seed,
                  preemption=args.preemption, host_swap_bytes=args.host_swap,
                  allow_long_context=bool(getattr(args, "allow_long_context", False)),
                  pp=getattr(args, "pp", 1), weight_dtype=getattr(args, "weight_dtype", None),
                  kv_dtype=getattr(args, "kv_dtype", None), usd_per_gpu_hour=getattr(args, "usd_per_gpu_hour", None))
    if getattr(args, "kv_tier", None):
        values.update(kv_tiers=tuple(args.kv_tier), tier_write_policy=args.kv_tier_write,
                      tier_load_policy=args.kv_tier_load)
    values.update(_engine_values(args))
    values.update(overrides)
    spec = getattr(args, "policy", None)
    if isinstance(spec, str):   # simulate --policy (compare takes a list)
        explicit = set(values.get("explicit_fields", ()))
        values.update(policy_overrides(spec, values, getattr(args, "given_options", ())))
        values["explicit_fields"] = tuple(sorted(explicit | set(values.get("explicit_fields", ()))))
        try:
            return SimConfig(**values)
        except ConfigError as exc:   # a value the spec set: name the spec and its key, not the flag
            from sim.frontend.policy_spec import policy_config_error
            raise policy_config_error(spec, exc) from None
    return SimConfig(**values)


_PRESET_FLAGS = {"scheduler": "scheduler", "token_budget": "token_budget", "max_batch_slots": "max_batch",
                 "frontend_overhead_us": "frontend_overhead_ms"}
"""SimConfig field -> the ``args`` attribute of the flag that overrides an ``--engine`` preset's value."""


def _engine_values(args: argparse.Namespace) -> dict:
    """The fields ``--engine`` and the flags it shares set: an explicit flag's value, else the preset's, else
    nothing (SimConfig's default). ``--frontend-overhead-ms`` is converted to us.

    Raises:
        CatalogError: an unknown ``--gpu`` (the preset depends on the GPU).
    """
    from sim.setup.catalog import get_gpu
    from sim.setup.engines import engine_preset
    engine = getattr(args, "engine", None)
    values = engine_preset(engine, get_gpu(args.gpu)) if engine else {}
    if engine:
        values["engine"] = engine
    for field_name, attr in _PRESET_FLAGS.items():
        explicit = getattr(args, attr, None)
        if explicit is not None:
            values[field_name] = explicit * 1000.0 if attr == "frontend_overhead_ms" else explicit
    return values


# SimConfig field -> (the flag that also sets it, its default) for conflict checks with --policy specs
_FLAG_OF_FIELD = {"page_size_bytes": ("--page-size", 2 * 1024 * 1024), "sync_mapping": ("--sync-mapping", False),
                  "deferred_reclaim": ("--no-deferred-reclaim", True), "preemption": ("--preemption", "recompute")}


def policy_flag_values(options: dict) -> dict:
    """The configuration fields of :data:`_FLAG_OF_FIELD` as a parsed command line (``vars(args)``, a sweep's base
    settings) sets them, for :func:`policy_overrides`' check."""
    return {"page_size_bytes": options.get("page_size", 2 * 1024 * 1024),
            "sync_mapping": bool(options.get("sync_mapping", False)),
            "deferred_reclaim": not options.get("no_deferred_reclaim", False),
            "preemption": options.get("preemption", "recompute")}


def policy_overrides(spec: str, values: dict, given_options: tuple = ()) -> dict:
    """The fields a ``--policy`` spec sets; a spec that contradicts an explicit flag is an error: a flag whose
    value in ``values`` differs from its default, or one written on the command line (``given_options``, the long
    options ``cli.main`` saw, e.g. ``--page-size 2MiB`` beside ``vattention:page=4MiB``).

    Raises:
        ConfigError: naming the spec and the flag.
    """
    from sim.frontend.policy_spec import parse_policy
    from sim.setup.config import ConfigError
    overrides = parse_policy(spec)
    for field_name, value in overrides.items():
        flag, default = _FLAG_OF_FIELD.get(field_name, (None, None))
        current = values.get(field_name, default)
        if flag and (current != default or flag in given_options) and current != value:
            raise ConfigError(f"policy {spec!r} contradicts {flag}; set it in one place")
    return overrides
