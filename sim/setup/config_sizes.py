"""The derived sizes of :class:`sim.setup.config.SimConfig`: the model as a worker holds it, the allocation
unit and the pool (:class:`PoolSizing`, mixed into ``SimConfig``; it holds no fields and reads the config's)."""
from __future__ import annotations

from dataclasses import replace
from functools import cached_property

from sim.setup.catalog import DTYPE_BYTES, ModelSpec, get_model
from sim.memory.hybrid_sizing import HybridSizing


class PoolSizing:
    """Model, allocation-unit and pool sizes of a :class:`sim.setup.config.SimConfig` (which it is mixed into:
    ``self`` is that config); all cached, as the config is frozen."""

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
            units = max(0, self.kv_budget_bytes - self.hybrid.state_reserved_bytes) // self.page_group_bytes
        else:
            units = self.kv_budget_bytes // self.page_group_bytes
        return max(0, units - self.null_blocks)      # (vLLM v1's null block: SimConfig.null_blocks)

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
