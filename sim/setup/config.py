"""Run configuration: one frozen, validated dataclass; derived sizes are properties."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from functools import cached_property

from sim.setup.catalog import GPUSpec, get_gpu
from sim.setup.config_checks import (ADMISSION_RULES, KV_LAYOUTS, MIN_PAGE_SIZE_BYTES, POLICIES,  # noqa: F401
                                     PREEMPTION_MODES, SCHEDULERS, VMM_DRIVERS, ZERO_MODES, ConfigError,
                                     check_config, vllm_budget_error)
from sim.setup.config_sizes import PoolSizing
from sim.timing.latency import DRIVER_GRANULARITY_BYTES, modified_driver_note, modified_driver_page_us
from sim.timing.paged_kernels import PagedFactors, resolve_paged_factors
from sim.units import MIB, format_bytes


@dataclass(frozen=True)
class SimConfig(PoolSizing):
    """Everything a simulate run depends on (besides the trace and the latency profile).

    Attributes:
        model / gpu: catalogue names.
        tp: tensor-parallel degree (each worker holds 1/tp of the KV heads and weights).
        page_size_bytes: G, vAttention page size per sub-tensor (power of two, >= 64 KiB; < 2 MiB needs a
            modified driver, see :attr:`needs_modified_driver`).
        max_batch_slots: B, request slots (vLLM's max_num_seqs default 256).
        scheduler: ``sarathi`` (chunked prefill with a token budget) or ``vllm`` (prefill-first).
        token_budget: tokens per iteration (Sarathi-Serve); for ``vllm`` the prefill batch limit.
        max_context_tokens: L_max of every slot; ``None`` = the model's context window.
        allow_long_context: accept a ``max_context_tokens`` beyond the model's native context window (refused
            otherwise; vLLM's ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``); ``config.json`` records it.
        sync_mapping: map on the critical path only (no asynchronous mapper).
        deferred_reclaim: keep a finished request's pages on its slot.
        eager_lookahead_steps / eager_page_groups / eager_idle_slots / low_watermark_frac /
            admission_watermark_frac: see :class:`sim.memory.VAttentionConfig`.
        memory_util_frac: share of HBM the server may use (vLLM's gpu_memory_utilization default 0.9);
            the KV budget is ``memory_util_frac * HBM - weights``; the rest covers activations and context.
        seed: seed of the run's one random generator.
        policy: memory manager: ``vattention``, ``paged`` (vLLM block manager) or ``static`` (Orca /
            FasterTransformer max-length reservation).
        block_size_tokens: PagedAttention block size (vLLM default 16).
        max_len_tokens: static reservation per request (``None`` = the slot length L_max).
        create_on_demand: vAttention creates physical handles on the mapping path (cuMemCreate per page)
            instead of taking them from a pool created at start-up.
        preemption: ``recompute`` (drop the KV, re-prefill later) or ``swap`` (copy it to host memory).
        host_swap_bytes: host memory available for swapped KV (vLLM swap_space default 4 GiB per GPU).
        block_table_base_us / block_table_per_block_us: PagedAttention's CPU time per iteration to prepare
            block tables, ``base + per_block * blocks in the batch`` (this project's estimate: a host-to-device
            copy of ~50 us plus ~20 ns per block id built in Python; vAttention ASPLOS'25 section 3.3.2
            describes the overhead; the hardware-validation issue is to measure it).
        paged_attention_factor: attention-time multiplier of the paged kernel: 1.23, the middle of the
            20-26% higher attention latency vLLM reports against FasterTransformer's kernel (Kwon et al.,
            SOSP'23, section 7.1; quoted in vAttention section 3.3.1), for both phases (``factor=``; a
            profile's ``paged_attention.factor`` replaces the default). Used when ``paged_kernel`` is ``None``.
        paged_kernel: the paged kernel whose per-phase factors apply (:data:`sim.timing.paged_kernels.PAGED_KERNELS`:
            ``vllm-sosp23``, ``vllm-v0``, ``fa2-paged``, ``flashinfer``; sources there); ``None``:
            ``paged_attention_factor`` for both phases.
        paged_prefill_factor / paged_decode_factor: replace one phase's factor (>= 1; ``None``: the kernel's,
            or ``paged_attention_factor``); the resolved factors are :attr:`paged_factors`.
        vmm_driver: how vAttention pages below 2 MiB are mapped: ``None`` or ``modified`` (vAttention's modified
            NVIDIA UVM driver: no cuMemSetAccess per page, the paper's measured bandwidth,
            :data:`sim.timing.latency.MODIFIED_DRIVER_MAP_BYTES_PER_S`); ``stock`` refuses them (the public CUDA VMM API
            allocates 2 MiB at least). Pages of 2 MiB and more always use the stock API's measured latencies.
        kv_layout: ``per-layer`` (vAttention: 2N' tensors ``[B, L_max, H', D]``, a page group is 2N' pages) or
            ``cross-layer`` (one K and one V tensor ``[B, L_max, N', H', D]``: a page holds every layer of a token
            range, a growth maps 2 pages, N' times more often).
        layout_attention_factor: attention-time multiplier of reading the strided per-layer view of the
            cross-layer layout (1.0 until measured; a calibration profile's ``layout`` section sets it).
        batched_set_access: a map op of k >= 2 adjacent pages per tensor maps them all and grants access with
            one cuMemSetAccess over the range (cost scaled by the measured batched/serial growth ratio).
        zero_on_reuse: multi-tenant isolation: ``off``; ``on-reuse`` clears a reused slot's stale pages and
            recycled pages when a request takes them (critical path); ``on-free`` clears them when the previous
            request frees them (background mapper; critical path with synchronous mapping).
        prefix_caching: share the physical pages of matching prompt prefixes (trace ``hash_ids``) between
            slots, keep them cached after their requests finish (LRU eviction); ``paged`` does vLLM-style
            block-level prefix caching; not available for ``static``. With window-aware allocation: ``paged``
            only (``window=free``), one block cache per layer group, vLLM v1's multi-group hit rule
            (:mod:`sim.memory.hybrid_prefix`, docs/hybrid.md); full and sliding groups only.
        prefix_block_tokens: tokens per hash block of the trace (Mooncake: 512).
        memset_bytes_per_s: bandwidth of clearing memory (zero-on-reuse) and, counting bytes read plus
            written, of copying it (copy-on-write); ``None``: the GPU's datasheet bandwidth x 4.3/4.8 (the
            H200's measured device-copy efficiency, domain.md); a profile's ``memory`` section sets it.
        copy_bytes_per_s: device-to-device copy rate counting bytes read plus written (copy-on-write of a
            partially shared page); ``None``: as for memset; a profile's ``memory`` section sets it.
        pp: pipeline-parallel stages: each holds a contiguous range of layers (vLLM's partition), their weights
            and their KV; the pool is sized for the stage that holds the fewest page groups
            (:attr:`model_spec`); the iteration time is :class:`sim.timing.pipeline.PipelineComputeModel`'s.
        weight_dtype / kv_dtype: ``bf16``, ``fp16``, ``fp32`` or ``fp8`` for the weights of the linear layers and
            for the KV cache (``None``: the model's own, KV in the activation dtype).
        usd_per_gpu_hour: price per GPU-hour replacing the GPU's catalogue price (``None``: the catalogue's).
        engine: the engine preset (:data:`sim.setup.engines.ENGINES`) the run's defaults came from (``None``: kvsim's
            own); recorded only, the preset's values are in the other fields.
        frontend_overhead_us: per-request cost outside the model (API server, tokenisation, detokenisation), us,
            added to each request's first-token and completion times, so to TTFT and E2E, but to no iteration
            (docs/serving-semantics.md); 0 by default, an engine preset's otherwise.
        window_alloc: window-aware allocation for hybrid models (:mod:`sim.memory.hybrid`, docs/hybrid.md):
            ``off`` (every layer holds every token, as before), vattention ``unmap`` / ``recycle`` (pages below a
            window are unmapped, or moved to the new end), paged ``free`` (vLLM v1's hybrid KV-cache manager),
            static ``reserve`` (one reservation per layer group at admission:
            :func:`sim.memory.hybrid_sizing.static_reserved_tokens`).
        cuda_graph_decodes: decodes as CUDA graphs (the compute model's ``decode_graphs``) when not ``None``; ``None``:
            the compute model's default (eager) or a profile's fitted value.
        kv_tiers: the prefix cache's tiers below HBM, from HBM down (:class:`sim.memory.tiers.TierSpec`,
            the command line's kv-tier option); ``()``: HBM only. Needs ``prefix_caching``.
        tier_write_policy / tier_load_policy: ``write-back`` | ``write-through`` and ``sync`` | ``layerwise`` |
            ``auto`` (:mod:`sim.memory.tiers`).
        prefix_evict: the HBM prefix cache's eviction policy, ``lru`` (vLLM v1, default), ``radix-leaf``
            (SGLang) or ``page`` (:mod:`sim.memory.eviction`; policy key ``evict=``).
        null_blocks: pool units never handed out (vLLM v1's null block: 1 under ``vllm-v1``, :mod:`sim.setup.engines`).
        explicit_fields: names of fields the user set (a policy spec's keys, a sweep axis of a field),
            sorted: a calibration profile's measurement never replaces them, even where the value written
            equals the default (``paged:factor=1.23`` stays 1.23; :func:`sim.core.runner.profile_config_overrides`).
    """

    model: str = "llama-3-8b"
    gpu: str = "h200"
    tp: int = 1
    page_size_bytes: int = 2 * MIB
    max_batch_slots: int = 256
    scheduler: str = "sarathi"
    token_budget: int = 2048
    max_context_tokens: int | None = None
    allow_long_context: bool = False
    sync_mapping: bool = False
    deferred_reclaim: bool = True
    eager_lookahead_steps: int = 9
    eager_page_groups: int = 2
    eager_idle_slots: int = 8
    low_watermark_frac: float = 0.05
    admission_watermark_frac: float = 0.01
    memory_util_frac: float = 0.9
    seed: int = 0
    policy: str = "vattention"
    block_size_tokens: int = 16
    max_len_tokens: int | None = None
    create_on_demand: bool = False
    preemption: str = "recompute"
    host_swap_bytes: int = 4 * 1024 * MIB
    block_table_base_us: float = 50.0
    block_table_per_block_us: float = 0.02
    paged_attention_factor: float = 1.23
    paged_kernel: str | None = None
    paged_prefill_factor: float | None = None
    paged_decode_factor: float | None = None
    vmm_driver: str | None = None
    kv_layout: str = "per-layer"
    layout_attention_factor: float = 1.0
    batched_set_access: bool = False
    zero_on_reuse: str = "off"
    prefix_caching: bool = False
    memset_bytes_per_s: float | None = None
    copy_bytes_per_s: float | None = None
    prefix_block_tokens: int = 512
    admission: str | None = None
    pp: int = 1
    weight_dtype: str | None = None
    kv_dtype: str | None = None
    usd_per_gpu_hour: float | None = None
    engine: str | None = None
    frontend_overhead_us: float = 0.0
    cuda_graph_decodes: bool | None = None
    kv_tiers: tuple = ()
    tier_write_policy: str = "write-back"
    tier_load_policy: str = "sync"
    prefix_evict: str = "lru"
    window_alloc: str = "off"
    null_blocks: int = 0
    explicit_fields: tuple = ()

    def __post_init__(self) -> None:
        """Refuse an impossible configuration (:func:`sim.setup.config_checks.check_config`).

        Raises:
            ConfigError: naming the field(s) and the value. CatalogError: from the model's own checks.
        """
        check_config(self)

    @cached_property
    def paged_factors(self) -> PagedFactors:
        """The paged kernel's attention-time factors in force (:func:`sim.timing.paged_kernels.resolve_paged_factors`)."""
        return resolve_paged_factors(self.paged_kernel, self.paged_attention_factor, self.paged_prefill_factor,
                                     self.paged_decode_factor)

    def paged_compute_fields(self) -> dict:
        """The compute-model fields (:class:`sim.timing.compute.RooflineComputeModel`) that carry the paged kernel's
        factors: one constant factor as ``paged_attention_factor`` (the model's form before per-phase
        factors, same floats), else ``paged_factors``."""
        factors = self.paged_factors
        if factors.is_constant:
            return {"paged_attention_factor": factors.prefill}
        return {"paged_factors": factors}

    @cached_property
    def gpu_spec(self) -> GPUSpec:
        spec = get_gpu(self.gpu)
        if self.usd_per_gpu_hour is not None:
            spec = replace(spec, usd_per_gpu_hour=self.usd_per_gpu_hour, price_source="--usd-per-gpu-hour")
        return spec

    @property
    def gpus_per_replica(self) -> int:
        """GPUs one replica occupies: ``tp x pp``."""
        return self.tp * self.pp

    @property
    def notes(self) -> list[str]:
        """Things a run should say about its configuration (printed as ``kvsim: note:`` lines)."""
        notes = []
        borrowed = self.gpu_spec.vmm_borrowed_from
        if self.uses_vmm and borrowed:
            notes.append(f"{self.gpu} has no measured VMM latency profile: the {borrowed.upper()}'s measured "
                         f"distributions are used (config.json vmm_profile_borrowed_from)")
        if self.needs_modified_driver:
            notes.append(modified_driver_note(self.page_size_bytes))
        if self.policy == "paged" and not self.paged_factors.is_constant:
            notes.append(f"paged attention ({self.paged_kernel or 'factor='}): {self.paged_factors.describe()}")
        spec = self.full_model_spec
        if (spec.sliding_window_tokens and spec.sliding_window_layers and self.slot_max_tokens > spec.sliding_window_tokens
                and not self.hybrid_alloc):
            notes.append(f"{self.model}: {spec.sliding_window_layers} of {spec.num_layers} layers use a "
                         f"{spec.sliding_window_tokens:,}-token sliding window; the simulated memory manager still "
                         "holds KV for every token of every layer (an upper bound; window-aware allocation: "
                         "the policy key window=unmap of vattention, window=free of paged or window=reserve of static, docs/hybrid.md)")
        if (spec.linear_layers or spec.chunked_attention_layers) and not self.hybrid_alloc:
            notes.append(f"{self.model}: {spec.linear_layers} Mamba/linear and {spec.chunked_attention_layers} chunked-local "
                         f"of {spec.num_layers} layers are held as full attention layers (window=off; window-aware "
                         "allocation: docs/hybrid.md)")
        if self.policy == "vattention":
            notes.extend(vattention_knob_notes(self))
        return notes

    @property
    def admission_rule(self) -> str:
        """The admission rule in force: :attr:`admission`, else the scheduler's default
        (:data:`sim.core.scheduler.SCHEDULERS`; both follow their engines' block managers: ``whole-prompt``)."""
        if self.admission is not None:
            return self.admission
        from sim.core.scheduler import SCHEDULERS as DISCIPLINES     # sim.core.scheduler imports sim.core.request only
        return DISCIPLINES[self.scheduler].default_admission

    @property
    def uses_vmm(self) -> bool:
        """Only vAttention maps pages through the CUDA VMM API (and pays its latency)."""
        return self.policy == "vattention"

    @property
    def has_async_mapper(self) -> bool:
        return self.uses_vmm and not self.sync_mapping

    @property
    def label(self) -> str:
        """Short description of the memory policy, e.g. ``vattention 2 MiB async``."""
        if self.policy == "paged":
            kernel = f" kernel={self.paged_kernel}" if self.paged_kernel else ""
            return f"paged block={self.block_size_tokens}{kernel}" + (" prefix-caching" if self.prefix_caching else "")
        if self.policy == "static":
            return f"static max_len={self.tokens_per_page}" + (" window=reserve" if self.hybrid_alloc else "")
        mode = "sync" if self.sync_mapping else "async"
        extras = [("" if self.deferred_reclaim else "no-deferred"), ("cross-layer" if self.kv_layout == "cross-layer" else ""),
                  ("batched-set-access" if self.batched_set_access else ""),
                  (f"zero-{self.zero_on_reuse}" if self.zero_on_reuse != "off" else ""),
                  ("prefix-sharing" if self.prefix_caching else ""),
                  ("modified-driver" if self.needs_modified_driver else "")]
        return " ".join([f"vattention {format_bytes(self.page_size_bytes)} {mode}", *filter(None, extras)])

    @property
    def needs_modified_driver(self) -> bool:
        """Pages under 2 MiB are below the public VMM granularity (domain.md): a what-if only."""
        return self.uses_vmm and self.page_size_bytes < DRIVER_GRANULARITY_BYTES

    def with_overrides(self, overrides: dict) -> "SimConfig":
        """A validated copy with some fields replaced (``overrides``: field name -> value).

        Raises:
            TypeError: ``overrides`` not a mapping. ConfigError: an unknown field, or a bad value.
        """
        if not isinstance(overrides, Mapping):
            raise TypeError(f"with_overrides: expected a mapping of field -> value (e.g. {{'policy': 'paged'}}), got "
                            f"{type(overrides).__name__} {overrides!r}")
        unknown = set(overrides) - set(self.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown settings {sorted(unknown)}")
        return replace(self, **overrides)

    def to_dict(self) -> dict:
        """Plain dict of the settings plus the derived sizes (for ``config.json``)."""
        out = asdict(self)
        out.update(num_sub_tensors=self.num_sub_tensors, slot_max_tokens=self.slot_max_tokens, tokens_per_page=self.tokens_per_page,
                   pool_page_groups=self.pool_page_groups, page_group_bytes=self.page_group_bytes,
                   kv_budget_bytes=self.kv_budget_bytes, needs_modified_driver=self.needs_modified_driver,
                   label=self.label, admission_rule=self.admission_rule)
        if self.policy == "paged":
            factors = self.paged_factors
            out.update(paged_prefill_factor_used=factors.prefill, paged_decode_factor_used=factors.decode,
                       paged_decode_factor_long=factors.decode_long)
        if self.needs_modified_driver:
            out.update(vmm_driver_used="modified (vAttention's modified NVIDIA UVM driver, not the stock CUDA API)",
                       modified_driver_map_us_per_page=modified_driver_page_us(self.page_size_bytes))
        out.update(self.derived_figures())
        if self.hybrid_alloc:             # window-aware allocation: the per-group sizes (docs/hybrid.md)
            out["layer_groups"] = self.hybrid.figures()
        return out

    def derived_figures(self) -> dict:
        """The model's and deployment's derived sizes for ``config.json`` (:meth:`ModelSpec.derived_figures`
        per worker; per pipeline stage with ``pp > 1``), the GPU price and the VMM profile's origin."""
        model = self.full_model_spec.derived_figures(self.tp)
        if self.pp > 1:
            model["pipeline_stages"] = [
                {"layers": stage.num_layers, "weight_bytes_per_worker": stage.weight_bytes(self.tp),
                 "kv_bytes_per_token_per_worker": stage.kv_bytes_per_token(self.tp),
                 "pool_units": self._stage_pool(stage)} for stage in self.stage_specs]
            model["pool_sized_by_stage"] = self.model_spec.stage_index
        gpu = self.gpu_spec
        return {"model_derived": model, "gpus_per_replica": self.gpus_per_replica,
                "usd_per_gpu_hour_used": gpu.usd_per_gpu_hour, "price_source": gpu.price_source,
                "vmm_profile_borrowed_from": gpu.vmm_borrowed_from if self.uses_vmm else None}


def vattention_knob_notes(config: SimConfig) -> list[str]:
    """Notes for a vAttention configuration's knobs that do less than they say: eager-allocation knobs set beyond
    what they can reach (``eager=`` beyond a slot's page groups, ``lookahead=`` beyond a slot's tokens,
    ``eager_slots=`` beyond the slots: they saturate, the run is the one at the bound:
    ``tests/test_eager_saturation.py``); eager and low-watermark keys set under synchronous mapping (no background
    mapper runs them); and a page that holds the whole slot (mapping is then whole-slot reservation)."""
    bounds = (("eager_page_groups", "eager", config.max_pages_per_slot, "page groups a slot holds"),
              ("eager_lookahead_steps", "lookahead", config.slot_max_tokens, "tokens a slot holds"),
              ("eager_idle_slots", "eager_slots", config.max_batch_slots, "slots"))
    notes = [f"{field}={value:,} (policy key {key}=) is more than the {bound:,} {what}: it acts as {key}={bound}"
             for field, key, bound, what in bounds if (value := getattr(config, field)) > bound]
    inert = [name for name in ("eager_page_groups", "eager_lookahead_steps", "eager_idle_slots", "low_watermark_frac")
             if name in config.explicit_fields]
    if config.sync_mapping and inert:      # (helper-62: the same run as without them, silently)
        notes.append(f"{', '.join(inert)} set with sync_mapping: there is no background mapper, so eager allocation "
                     "and the low watermark change nothing in this run")
    if config.tokens_per_page >= config.slot_max_tokens > 1:
        # (helper-63: 70B at tp 8 with 2 MiB pages ran as static reservation, saying only the eager note)
        from sim.units import format_bytes
        notes.append(f"one page of {format_bytes(config.page_size_bytes)} holds {config.tokens_per_page:,} tokens here "
                     f"(tp={config.tp}), the whole {config.slot_max_tokens:,}-token slot: every request maps its whole "
                     "slot at once, as a static reservation does (no on-demand growth); smaller pages "
                     "(page_size_bytes of 64 KiB to 1 MiB) restore it")
    return notes
