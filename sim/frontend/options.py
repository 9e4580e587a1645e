"""Building a :class:`sim.setup.config.SimConfig` from command-line options: the options every command that
simulates shares (:func:`add_config_args`) and the configuration they describe (:func:`config_from_args`),
with a ``--policy`` spec applied (:func:`policy_overrides`, keys in :mod:`sim.frontend.policy_spec`)."""
from __future__ import annotations

import argparse

from sim.frontend.argtypes import int_at_least, positive_float, size_arg


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """Options shared by every command that builds a :class:`sim.setup.config.SimConfig`."""
    from sim.setup.catalog import DTYPE_BYTES, gpu_names, model_names
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
    parser.add_argument("--max-batch", type=int_at_least(1), default=256, help="request slots B (max concurrent requests)")
    parser.add_argument("--scheduler", choices=("sarathi", "vllm"), default="sarathi",
                        help="sarathi: chunked prefill with a token budget; vllm: prefill-first")
    parser.add_argument("--token-budget", type=int_at_least(1), default=2048, help="tokens per iteration (chunked prefill)")
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


def config_from_args(args: argparse.Namespace, **overrides):
    """Build the :class:`SimConfig` from parsed options (raises ConfigError / CatalogError on bad values)."""
    from sim.setup.config import ConfigError, SimConfig
    from sim.frontend.policy_spec import policy_config_error
    values = dict(model=args.model, gpu=args.gpu, tp=args.tp, page_size_bytes=args.page_size,
                  max_batch_slots=args.max_batch, scheduler=args.scheduler, token_budget=args.token_budget,
                  max_context_tokens=args.max_context, sync_mapping=args.sync_mapping,
                  deferred_reclaim=not args.no_deferred_reclaim, memory_util_frac=args.memory_util, seed=args.seed,
                  preemption=args.preemption, host_swap_bytes=args.host_swap,
                  allow_long_context=bool(getattr(args, "allow_long_context", False)),
                  pp=getattr(args, "pp", 1), weight_dtype=getattr(args, "weight_dtype", None),
                  kv_dtype=getattr(args, "kv_dtype", None), usd_per_gpu_hour=getattr(args, "usd_per_gpu_hour", None))
    values.update(overrides)
    spec = getattr(args, "policy", None)
    if isinstance(spec, str):   # simulate --policy (compare takes a list)
        values.update(policy_overrides(spec, values))
        try:
            return SimConfig(**values)
        except ConfigError as exc:   # a value the spec set: name the spec and its key, not the flag
            raise policy_config_error(spec, exc) from None
    return SimConfig(**values)


# SimConfig field -> (the flag that also sets it, its default) for conflict checks with --policy specs
_FLAG_OF_FIELD = {"page_size_bytes": ("--page-size", 2 * 1024 * 1024), "sync_mapping": ("--sync-mapping", False),
                  "deferred_reclaim": ("--no-deferred-reclaim", True), "preemption": ("--preemption", "recompute")}


def policy_overrides(spec: str, values: dict) -> dict:
    """The fields a ``--policy`` spec sets; a spec that contradicts an explicit flag is an error.

    Raises:
        ConfigError: naming the spec and the flag.
    """
    from sim.frontend.policy_spec import parse_policy
    from sim.setup.config import ConfigError
    overrides = parse_policy(spec)
    for field_name, value in overrides.items():
        flag, default = _FLAG_OF_FIELD.get(field_name, (None, None))
        if flag and values.get(field_name, default) != default and values[field_name] != value:
            raise ConfigError(f"policy {spec!r} contradicts {flag}; set it in one place")
    return overrides
