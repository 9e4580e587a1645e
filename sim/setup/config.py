"""Run configuration: one frozen, validated dataclass; derived sizes are properties."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cached_property

from sim.setup.catalog import DTYPE_BYTES, GPUSpec, ModelSpec, get_gpu, get_model
from sim.setup.specs import FieldError
from sim.timing.latency import DRIVER_GRANULARITY_BYTES, modified_driver_note, modified_driver_page_us
from sim.memory.hybrid_sizing import HybridSizing, window_alloc_error
from sim.memory.vattention import knob_range_error
from sim.timing.paged_kernels import PAGED_KERNELS, PagedFactors, resolve_paged_factors
from sim.units import MIB, format_bytes

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


def _tier_error(config) -> tuple[str, ...] | None:
    """Why the KV tier and eviction settings are refused (sim.memory.tiers, sim.memory.eviction): the message and
    the fields it names, or None."""
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
        return ("kv_tiers hold prefix-cache pages: turn the prefix cache on (prefix_caching: the policy key prefix=on "
                "of vattention or paged)", "kv_tiers", "prefix_caching")
    problem = check_tiers(config.kv_tiers)
    return (problem, "kv_tiers") if problem else None


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


@dataclass(frozen=True)
class SimConfig:
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
            block-level prefix caching; not available for ``static``.
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
        engine: the engine preset (:data:`sim.setup.engines.ENGINES`) the run's defaults came from (``vllm-v1``, ``sglang``, ``vattention``;
            ``None``: kvsim's own defaults); recorded only, the preset's values are in the other fields
            (:mod:`sim.setup.engines`).
        frontend_overhead_us: per-request cost outside the model (API server, tokenisation, detokenisation), us,
            added to each request's first-token and completion times, so to TTFT and E2E, but to no iteration
            (docs/serving-semantics.md); 0 by default, an engine preset's otherwise.
        window_alloc: window-aware allocation for hybrid models (:mod:`sim.memory.hybrid`, docs/hybrid.md):
            ``off`` (every layer holds every token, as before), vattention ``unmap`` / ``recycle`` (pages below a
            window are unmapped, or moved to the new end), paged ``free`` (vLLM v1's hybrid KV-cache manager).
        cuda_graph_decodes: decodes as CUDA graphs (the compute model's ``decode_graphs``) when not ``None``; ``None``:
            the compute model's default (eager) or a profile's fitted value.
        kv_tiers: the prefix cache's tiers below HBM, from HBM down (:class:`sim.memory.tiers.TierSpec`,
            the command line's kv-tier option); ``()``: HBM only. Needs ``prefix_caching``.
        tier_write_policy / tier_load_policy: ``write-back`` | ``write-through`` and ``sync`` | ``layerwise`` |
            ``auto`` (:mod:`sim.memory.tiers`).
        prefix_evict: the HBM prefix cache's eviction policy, ``lru`` (vLLM v1, default), ``radix-leaf``
            (SGLang) or ``page`` (:mod:`sim.memory.eviction`; policy key ``evict=``).
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

    def __post_init__(self) -> None:
        tier_error = _tier_error(self)
        if tier_error:
            raise ConfigError(*tier_error)
        if not (isinstance(self.frontend_overhead_us, (int, float)) and 0 <= self.frontend_overhead_us < float("inf")):
            raise ConfigError(f"frontend_overhead_us={self.frontend_overhead_us!r}: must be a finite number of "
                              "microseconds >= 0", "frontend_overhead_us")
        for name, value in (("weight_dtype", self.weight_dtype), ("kv_dtype", self.kv_dtype)):
            if value is not None and value not in DTYPE_BYTES:
                raise ConfigError(f"{name}={value}: choose one of {', '.join(DTYPE_BYTES)}", name)
        if self.usd_per_gpu_hour is not None and not 0 < self.usd_per_gpu_hour < float("inf"):
            raise ConfigError(f"usd_per_gpu_hour={self.usd_per_gpu_hour}: must be > 0", "usd_per_gpu_hour")
        if not isinstance(self.pp, int) or self.pp < 1:
            raise ConfigError(f"pp={self.pp}: must be >= 1", "pp")
        self.full_model_spec.pipeline_layers(self.pp)      # raises CatalogError for more stages than layers
        if self.prefix_caching and self.policy == "static":
            raise ConfigError("prefix caching (prefix_caching) needs the vattention or paged policy, not static "
                              "reservation", "prefix_caching")
        knob_error = knob_range_error(self)            # the policy's own ranges, refused before any run
        if knob_error:
            raise ConfigError(knob_error, knob_error.partition("=")[0])
        if self.prefix_block_tokens < 1:
            raise ConfigError(f"prefix_block_tokens={self.prefix_block_tokens}: must be >= 1 token", "prefix_block_tokens")
        if self.kv_layout not in KV_LAYOUTS:
            raise ConfigError(f"kv_layout={self.kv_layout}: choose one of {', '.join(KV_LAYOUTS)}", "kv_layout")
        if self.zero_on_reuse not in ZERO_MODES:
            raise ConfigError(f"zero_on_reuse={self.zero_on_reuse}: choose one of {', '.join(ZERO_MODES)}",
                              "zero_on_reuse")
        if self.policy not in POLICIES:
            raise ConfigError(f"policy={self.policy}: choose one of {', '.join(POLICIES)}", "policy")
        if self.preemption not in PREEMPTION_MODES:
            raise ConfigError(f"preemption={self.preemption}: choose one of {', '.join(PREEMPTION_MODES)}",
                              "preemption")
        if self.block_size_tokens < 1:
            raise ConfigError(f"block_size_tokens={self.block_size_tokens}: must be >= 1 token", "block_size_tokens")
        if self.max_len_tokens is not None and not 2 <= self.max_len_tokens <= self.slot_max_tokens:
            raise ConfigError(f"max_len_tokens={self.max_len_tokens}: must lie in [2, {self.slot_max_tokens}] tokens "
                              "(the static reservation)", "max_len_tokens")
        if self.layout_attention_factor <= 0:
            raise ConfigError(f"layout_attention_factor={self.layout_attention_factor}: must be > 0",
                              "layout_attention_factor")
        for name, least in (("paged_attention_factor", 1), ("block_table_base_us", 0), ("block_table_per_block_us", 0)):
            if getattr(self, name) < least:
                raise ConfigError(f"{name}={getattr(self, name)}: must be >= {least}", name)
        paged_error = self._paged_kernel_error()
        if paged_error:
            raise ConfigError(paged_error, paged_error.partition("=")[0])
        self.model_spec.check_tp(self.tp)
        hybrid_error = window_alloc_error(self)
        if hybrid_error:
            raise ConfigError(hybrid_error)
        page = self.page_size_bytes
        if page < MIN_PAGE_SIZE_BYTES or page & (page - 1):
            raise ConfigError(f"page_size_bytes={page} B: must be a power of two >= 64KiB", "page_size_bytes")
        driver_error = self._vmm_driver_error()
        if driver_error:
            raise ConfigError(driver_error, "vmm_driver", "page_size_bytes", "batched_set_access")
        if self.uses_vmm and self.tokens_per_page < 1:
            per_token = self.model_spec.sub_tensor_bytes_per_token(self.tp) * (
                self.model_spec.num_layers if self.kv_layout == "cross-layer" else 1)
            raise ConfigError(f"page_size_bytes={format_bytes(page).replace(' ', '')} holds no token of {self.model} in "
                              f"the {self.kv_layout} layout ({per_token} B per token per tensor)", "page_size_bytes")
        if self.scheduler not in SCHEDULERS:
            raise ConfigError(f"scheduler={self.scheduler}: choose one of {', '.join(SCHEDULERS)}", "scheduler")
        if self.admission is not None and self.admission not in ADMISSION_RULES:
            raise ConfigError(f"admission={self.admission}: choose one of {', '.join(ADMISSION_RULES)}", "admission")
        for name in ("max_batch_slots", "token_budget"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be >= 1", name)
        if self.scheduler == "vllm" and self.token_budget < self.max_batch_slots:
            raise ConfigError(vllm_budget_error(self.token_budget, self.max_batch_slots), "scheduler", "token_budget",
                              "max_batch_slots")
        if self.max_context_tokens is not None and self.max_context_tokens < 2:
            raise ConfigError(f"max_context_tokens={self.max_context_tokens}: must be >= 2 tokens", "max_context_tokens")
        native = self.model_spec.max_context_tokens
        if self.max_context_tokens is not None and self.max_context_tokens > native and not self.allow_long_context:
            raise ConfigError(f"max_context_tokens={self.max_context_tokens}: beyond {self.model}'s native context of "
                              f"{native:,} tokens; set allow_long_context to simulate it anyway", "max_context_tokens",
                              "allow_long_context")
        if not 0 < self.memory_util_frac <= 1:
            raise ConfigError(f"memory_util_frac={self.memory_util_frac}: must lie in (0, 1]", "memory_util_frac")
        if self.kv_budget_bytes < self.page_group_bytes:
            raise ConfigError(
                f"memory_util_frac={self.memory_util_frac}: {self.model}'s weights at tp={self.tp} "
                f"({format_bytes(self.model_spec.weight_bytes(self.tp))}) leave {format_bytes(max(self.kv_budget_bytes, 0))} "
                f"for KV cache on {self.gpu}: not one page group ({format_bytes(self.page_group_bytes)}); raise "
                "memory_util_frac or tp", "memory_util_frac", "tp")

    def _paged_kernel_error(self) -> str | None:
        """The message for an unknown paged kernel or a phase factor that is not a finite number >= 1 (named
        by the SimConfig field, which :func:`sim.frontend.policy_spec.policy_config_error` renames to the spec's key)."""
        if self.paged_kernel is not None and self.paged_kernel not in PAGED_KERNELS:
            return (f"paged_kernel={self.paged_kernel}: unknown kernel {self.paged_kernel!r}; choose one of "
                    f"{', '.join(PAGED_KERNELS)}")
        for name in ("paged_attention_factor", "paged_prefill_factor", "paged_decode_factor"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and 1 <= value < float("inf")):
                return (f"{name}={value}: must be a finite number >= 1 (paged / contiguous attention time: a "
                        "paged kernel is never faster than the contiguous one)")
        return None

    def _vmm_driver_error(self) -> str | None:
        """The message for an unknown ``vmm_driver``, for vAttention pages below 2 MiB on the stock driver, and
        for batched set-access on the modified driver (which grants access without cuMemSetAccess)."""
        if self.vmm_driver is not None and self.vmm_driver not in VMM_DRIVERS:
            return f"vmm_driver={self.vmm_driver}: choose one of {', '.join(VMM_DRIVERS)}"
        if not self.needs_modified_driver:
            return None
        page = format_bytes(self.page_size_bytes).replace(" ", "")
        if self.vmm_driver == "stock":
            return (f"page_size_bytes={page} with vmm_driver=stock: the stock CUDA VMM API allocates 2 MiB pages at "
                    "least (cuMemCreate of 64 KiB or 256 KiB fails with CUDA_ERROR_INVALID_VALUE, domain.md); "
                    "use pages of 2 MiB or more, or vmm_driver=modified (vAttention's modified NVIDIA UVM driver)")
        if self.batched_set_access:
            return (f"batched_set_access=on with page_size_bytes={page}: pages below 2 MiB go through vAttention's "
                    "modified driver, which maps without a cuMemSetAccess per page: there is nothing to batch")
        return None

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
    def full_model_spec(self) -> ModelSpec:
        """The whole model (catalogue name or file), with the ``weight_dtype`` / ``kv_dtype`` overrides."""
        spec = get_model(self.model)
        if self.weight_dtype is not None:
            spec = replace(spec, dtype_bytes=DTYPE_BYTES[self.weight_dtype])
        if self.kv_dtype is not None:
            spec = replace(spec, kv_dtype_bytes=DTYPE_BYTES[self.kv_dtype])
        return spec

    @cached_property
    def stage_specs(self) -> list[ModelSpec]:
        """The model as each pipeline stage holds it (one entry without pipeline parallelism)."""
        return self.full_model_spec.pipeline_stages(self.pp)

    @cached_property
    def model_spec(self) -> ModelSpec:
        """The model as one worker holds it: the whole model, or with ``pp > 1`` the pipeline stage whose
        memory holds the fewest allocation units (the one that sizes the pool; every stage holds the same
        tokens, as each holds all requests' KV for its own layers)."""
        stages = self.stage_specs
        if len(stages) == 1:
            return stages[0]
        return min(stages, key=lambda stage: self._stage_pool(stage))

    def _stage_pool(self, stage: ModelSpec) -> int:
        """Allocation units one stage's worker holds: ``(memory_util x HBM - its weights) // unit bytes``
        (a vAttention page group of the stage's sub-tensors, a paged block or a static reservation)."""
        if self.policy == "vattention":
            tensors = (1 if stage.uses_mla else 2) if self.kv_layout == "cross-layer" else stage.num_sub_tensors()
            unit = tensors * self.page_size_bytes
        else:
            tokens = (self.block_size_tokens if self.policy == "paged"
                      else self.max_len_tokens or self.max_context_tokens or stage.max_context_tokens)
            unit = tokens * stage.kv_bytes_per_token(self.tp)
        return (int(self.memory_util_frac * self.gpu_spec.hbm_bytes) - stage.weight_bytes(self.tp)) // unit

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
                         "the policy key window=unmap of vattention or window=free of paged, docs/hybrid.md)")
        if (spec.linear_layers or spec.chunked_attention_layers) and not self.hybrid_alloc:
            notes.append(f"{self.model}: {spec.linear_layers} Mamba/linear and {spec.chunked_attention_layers} chunked-local "
                         f"of {spec.num_layers} layers are held as full attention layers (window=off; window-aware "
                         "allocation: docs/hybrid.md)")
        return notes

    @cached_property
    def slot_max_tokens(self) -> int:
        """L_max: tokens one slot can hold."""
        return self.max_context_tokens or self.model_spec.max_context_tokens

    @cached_property
    def tokens_per_page(self) -> int:
        """Tokens per allocation unit: vAttention page, PagedAttention block, or static reservation."""
        if self.policy == "paged":
            return self.hybrid.paged_block_tokens if self.hybrid_alloc else self.block_size_tokens
        if self.policy == "static":
            return self.max_len_tokens or self.slot_max_tokens
        per_page = self.model_spec.tokens_per_page(self.page_size_bytes, self.tp)
        return per_page // self.model_spec.num_layers if self.kv_layout == "cross-layer" else per_page

    @cached_property
    def num_sub_tensors(self) -> int:
        """2N', per-layer K and V tensors per worker."""
        if self.kv_layout == "cross-layer":
            return 1 if self.model_spec.uses_mla else 2
        return self.model_spec.num_sub_tensors()

    @cached_property
    def page_group_bytes(self) -> int:
        """Physical bytes of one allocation unit: a vAttention page group ``2N' * G``; a paged block or a
        static reservation ``tokens * kv_bytes_per_token``."""
        if self.hybrid_alloc:
            return self.hybrid.unit_bytes
        if self.policy == "vattention":
            return self.num_sub_tensors * self.page_size_bytes
        return self.tokens_per_page * self.model_spec.kv_bytes_per_token(self.tp)

    @cached_property
    def kv_budget_bytes(self) -> int:
        """Bytes per worker for the KV page pool: ``memory_util_frac * HBM - weights``."""
        return int(self.memory_util_frac * self.gpu_spec.hbm_bytes) - self.model_spec.weight_bytes(self.tp)

    @cached_property
    def pool_page_groups(self) -> int:
        """Allocation units of the pool (hybrid: units of :attr:`hybrid`, after the per-slot state reservation)."""
        if self.hybrid_alloc:
            return max(0, self.kv_budget_bytes - self.hybrid.state_reserved_bytes) // self.page_group_bytes
        return self.kv_budget_bytes // self.page_group_bytes

    @cached_property
    def layer_groups(self):
        """The model's layer groups on one worker (:func:`sim.memory.layer_groups.layer_groups`)."""
        from sim.memory.layer_groups import layer_groups
        return layer_groups(self.model_spec, self.tp)

    @cached_property
    def hybrid_alloc(self) -> bool:
        """Window-aware allocation is on and the model has groups other than one full-attention group."""
        from sim.memory.layer_groups import is_hybrid
        return self.window_alloc != "off" and is_hybrid(self.layer_groups)

    @cached_property
    def hybrid(self) -> HybridSizing:
        """Units and per-group sizes of window-aware allocation (:class:`sim.memory.hybrid_sizing.HybridSizing`)."""
        return HybridSizing.of(self)

    @property
    def group_units(self) -> tuple[int, ...]:
        """Units one page group of each layer group costs (0: none from the pool)."""
        return self.hybrid.group_units

    @property
    def group_sub_tensors(self) -> tuple[int, ...]:
        """VMM pages one page group of each pool-drawing layer group maps (vAttention: ``2 N_g``, MLA ``N_g``)."""
        return self.hybrid.group_sub_tensors

    @cached_property
    def max_pages_per_slot(self) -> int:
        """Allocation units one slot can hold: ``ceil(L_max / tokens_per_page)``; static reservation holds
        exactly one unit of ``max_len`` tokens per request (a request that outgrows it is rejected at arrival,
        never given a second unit)."""
        if self.policy == "static":
            return 1
        return -(-self.slot_max_tokens // self.tokens_per_page)

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
            return f"static max_len={self.tokens_per_page}"
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
        """A validated copy with some fields replaced (raises ConfigError for bad values)."""
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
