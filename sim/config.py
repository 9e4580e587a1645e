"""Run configuration: one frozen, validated dataclass; derived sizes are properties."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property

from sim.catalog import GPUSpec, ModelSpec, get_gpu, get_model
from sim.units import MIB, format_bytes

SCHEDULERS = ("sarathi", "vllm")
MIN_PAGE_SIZE_BYTES = 64 * 1024
DRIVER_GRANULARITY_BYTES = 2 * MIB  # public VMM API granularity on H200 (domain.md)


class ConfigError(ValueError):
    """An impossible configuration; the message names the option and the value."""


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
        sync_mapping: map on the critical path only (no asynchronous mapper).
        deferred_reclaim: keep a finished request's pages on its slot.
        eager_lookahead_steps / eager_page_groups / eager_idle_slots / low_watermark_frac /
            admission_watermark_frac: see :class:`sim.memory.VAttentionConfig`.
        memory_util_frac: share of HBM the server may use (vLLM's gpu_memory_utilization default 0.9);
            the KV budget is ``memory_util_frac * HBM - weights``; the rest covers activations and context.
        seed: seed of the run's one random generator.
    """

    model: str = "llama-3-8b"
    gpu: str = "h200"
    tp: int = 1
    page_size_bytes: int = 2 * MIB
    max_batch_slots: int = 256
    scheduler: str = "sarathi"
    token_budget: int = 2048
    max_context_tokens: int | None = None
    sync_mapping: bool = False
    deferred_reclaim: bool = True
    eager_lookahead_steps: int = 9
    eager_page_groups: int = 2
    eager_idle_slots: int = 8
    low_watermark_frac: float = 0.05
    admission_watermark_frac: float = 0.01
    memory_util_frac: float = 0.9
    seed: int = 0

    def __post_init__(self) -> None:
        self.model_spec.check_tp(self.tp)
        page = self.page_size_bytes
        if page < MIN_PAGE_SIZE_BYTES or page & (page - 1):
            raise ConfigError(f"--page-size {page} B: must be a power of two >= 64KiB")
        if self.model_spec.tokens_per_page(page, self.tp) < 1:
            raise ConfigError(f"--page-size {format_bytes(page)} holds no token of {self.model} "
                              f"({self.model_spec.sub_tensor_bytes_per_token(self.tp)} B per token per sub-tensor)")
        if self.scheduler not in SCHEDULERS:
            raise ConfigError(f"--scheduler {self.scheduler!r}: choose one of {', '.join(SCHEDULERS)}")
        for name in ("max_batch_slots", "token_budget"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.max_context_tokens is not None and self.max_context_tokens < 2:
            raise ConfigError(f"--max-context must be >= 2 tokens, got {self.max_context_tokens}")
        if not 0 < self.memory_util_frac <= 1:
            raise ConfigError(f"--memory-util must lie in (0, 1], got {self.memory_util_frac}")
        if self.kv_budget_bytes < self.page_group_bytes:
            raise ConfigError(
                f"{self.model} (tp={self.tp}) weights {format_bytes(self.model_spec.weight_bytes(self.tp))} leave "
                f"{format_bytes(max(self.kv_budget_bytes, 0))} for KV cache on {self.gpu} at memory_util "
                f"{self.memory_util_frac}: not one page group ({format_bytes(self.page_group_bytes)}); raise --tp")

    @cached_property
    def model_spec(self) -> ModelSpec:
        return get_model(self.model)

    @cached_property
    def gpu_spec(self) -> GPUSpec:
        return get_gpu(self.gpu)

    @cached_property
    def slot_max_tokens(self) -> int:
        """L_max: tokens one slot can hold."""
        return self.max_context_tokens or self.model_spec.max_context_tokens

    @cached_property
    def tokens_per_page(self) -> int:
        return self.model_spec.tokens_per_page(self.page_size_bytes, self.tp)

    @cached_property
    def num_sub_tensors(self) -> int:
        """2N', per-layer K and V tensors per worker."""
        return self.model_spec.num_sub_tensors()

    @cached_property
    def page_group_bytes(self) -> int:
        """Physical bytes of one page group: ``2N' * G``."""
        return self.num_sub_tensors * self.page_size_bytes

    @cached_property
    def kv_budget_bytes(self) -> int:
        """Bytes per worker for the KV page pool: ``memory_util_frac * HBM - weights``."""
        return int(self.memory_util_frac * self.gpu_spec.hbm_bytes) - self.model_spec.weight_bytes(self.tp)

    @cached_property
    def pool_page_groups(self) -> int:
        return self.kv_budget_bytes // self.page_group_bytes

    @cached_property
    def max_pages_per_slot(self) -> int:
        return -(-self.slot_max_tokens // self.tokens_per_page)

    @property
    def needs_modified_driver(self) -> bool:
        """Pages under 2 MiB are below the public VMM granularity (domain.md): a what-if only."""
        return self.page_size_bytes < DRIVER_GRANULARITY_BYTES

    def to_dict(self) -> dict:
        """Plain dict of the settings plus the derived sizes (for ``config.json``)."""
        out = asdict(self)
        out.update(num_sub_tensors=self.num_sub_tensors, slot_max_tokens=self.slot_max_tokens, tokens_per_page=self.tokens_per_page,
                   pool_page_groups=self.pool_page_groups, page_group_bytes=self.page_group_bytes,
                   kv_budget_bytes=self.kv_budget_bytes, needs_modified_driver=self.needs_modified_driver)
        return out
