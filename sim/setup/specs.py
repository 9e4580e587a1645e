"""Model and GPU shapes (:class:`ModelSpec`, :class:`GPUSpec`) and every size derived from them; entries come from
the catalogue (:mod:`sim.setup.catalog`, ``catalog.toml``) or a user's file (:mod:`sim.setup.model_files`).

Every derived size is a method computed from the public shapes, never typed twice. Sizes per worker: ``tp``
tensor-parallel workers shard heads, MLP widths, experts' widths and the vocabulary (Megatron / vLLM); a
pipeline stage (:meth:`ModelSpec.pipeline_stages`) holds a contiguous range of layers.

* Weights per worker ``weight_bytes(tp)``: linear layers at ``dtype_bytes`` per parameter (Q, K, V, O projections,
  or MLA's low-rank projections; the MLP, 3 matrices ``hidden x width`` when gated (SwiGLU), 2 when not; every
  expert of a MoE layer, its router and shared experts: all experts are resident) plus norms (2 per layer and the
  final one), the input embedding and the LM head at :attr:`ModelSpec.activation_bytes` (fp8 checkpoints keep
  them in bf16); tied embeddings are one table.
* KV bytes per token per layer ``kv_bytes_per_token_per_layer(tp)``: GQA/MHA ``2 x H' x D x P_kv`` (K and V,
  ``H' = num_kv_heads / tp``, domain.md "The problem"); MLA one latent of ``kv_lora_rank + qk_rope_head_dim``
  elements per token (what vLLM caches; replicated on every tensor-parallel worker). ``kv_bytes_per_token(tp)``
  sums the layers.
* Bytes per token in one K or V sub-tensor (vAttention's per-layer tensor) ``sub_tensor_bytes_per_token(tp)``;
  tokens per page ``floor(G / sub_tensor_bytes_per_token)`` (domain.md, "Mechanism").
* Compute per token (:mod:`sim.timing.compute`): ``active_linear_params(tp)``: dense layers, and in MoE layers the
  router, ``experts_per_token`` routed experts and the shared experts.

Sliding-window layers (``sliding_window_tokens``, ``sliding_window_layers``) hold at most the window's KV per
request: :meth:`ModelSpec.kv_bytes_for_tokens`; the simulated memory managers still map every token of every
layer (docs/models.md says what that does to a run).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from sim.setup.model_sizes import ModelSizes


class FieldError(ValueError):
    """A refused value of a configuration field, named by the field (``token_budget=0: must be >= 1``), never
    by a command-line flag: ``fields`` lists the fields the message names, the refused one first (empty when it
    names none), so that each front end can name its own flag or key for them
    (:func:`sim.frontend.flags.flag_message`)."""

    def __init__(self, message: str, *fields: str):
        super().__init__(message)
        self.fields = fields

    def __reduce__(self):          # keeps ``fields`` across processes (sweep and replica workers)
        return type(self), (str(self), *self.fields)


class CatalogError(FieldError):
    """An unknown model or GPU, an unreadable or inconsistent model/GPU file, or an impossible parallel degree;
    the message names the choices, or the file and field."""


DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
"""Bytes per element of the weight and KV dtypes accepted by ``SimConfig.weight_dtype`` / ``kv_dtype``."""


@dataclass(frozen=True)
class ModelSpec(ModelSizes):
    """Shape of a decoder-only transformer (public config). All sizes in elements unless named ``*_bytes``.

    Attributes:
        name: catalogue key (e.g. ``"llama-3-8b"``) or the file a user model was read from.
        num_layers: N, decoder layers (of this pipeline stage, for a stage view).
        hidden_size: model width.
        num_q_heads / num_kv_heads: attention heads (GQA when KV heads < Q heads).
        head_dim: D, elements per head (MLA: the query/key head, ``qk_nope_head_dim + qk_rope_head_dim``).
        ffn_size: MLP intermediate width of a dense layer.
        vocab_size: embedding rows.
        max_context_tokens: native context window (``max_position_embeddings``).
        dtype_bytes: P, bytes per weight element of the linear layers (2 for bf16, 1 for fp8).
        kv_dtype_bytes: bytes per KV-cache element; 0 = :attr:`activation_bytes` (bf16 for bf16 or fp8 weights).
        mlp_gated: gated MLP (SwiGLU: gate, up, down = 3 matrices) or a plain one (up, down = 2).
        tie_word_embeddings: the LM head is the input embedding (one table).
        attention_bias: Q, K, V projections carry biases (Qwen2, OPT, GPT-2, GPT-NeoX, Phi-2).
        attention_out_bias: the output projection carries a bias (OPT, GPT-2, GPT-NeoX, Phi-2).
        mlp_bias: the MLP's projections carry biases (OPT, GPT-2, GPT-J, GPT-NeoX, Phi-2).
        lm_head_bias: the LM head carries a bias of ``vocab_size`` (GPT-J, Phi-2).
        norms_per_layer: normalisation layers per decoder layer: 2 (pre-attention, pre-MLP), 1 for a parallel
            block (GPT-J, Falcon-7B, Phi-2), 4 for Gemma 2/3 (pre and post each sub-block).
        norm_bias: the norms are LayerNorms with a bias (``2 h`` each: OPT, GPT-2/J/NeoX, Falcon, Phi-2), not
            RMSNorms (``h``).
        qk_norm: per-head RMSNorms of ``head_dim`` on queries and keys (Qwen3, Gemma 3).
        position_embedding_tokens: rows of a learned absolute position embedding (GPT-2 ``n_positions``, OPT
            ``max_position_embeddings + 2``); 0 = rotary or none.
        num_experts: routed experts per MoE layer (0 = dense model).
        num_shared_experts: shared experts per MoE layer (DeepSeek), each ``moe_ffn_size`` wide.
        experts_per_token: routed experts each token runs (top-k).
        moe_ffn_size: intermediate width of one expert.
        first_dense_layers: the first layers are dense MLPs of ``ffn_size`` (DeepSeek ``first_k_dense_replace``).
        kv_lora_rank / qk_rope_head_dim / qk_nope_head_dim / v_head_dim / q_lora_rank: Multi-head Latent
            Attention (DeepSeek-V2/V3); ``kv_lora_rank`` 0 = GQA/MHA. ``q_lora_rank`` 0 = full-rank queries.
        sliding_window_tokens: attention window of the sliding-window layers (0 = none).
        sliding_window_layers: how many layers use the window.
        chunked_attention_tokens / chunked_attention_layers: chunked local attention (Llama 4
            ``attention_chunk_size``): a token attends only to the earlier tokens of its own chunk.
        linear_layers: layers whose mixer is a Mamba / linear-attention block (no KV cache: a constant state
            per request; Jamba, Qwen3-Next); they hold :attr:`linear_state_bytes_per_layer` each.
        linear_state_bytes_per_layer: recurrent + convolution state of one request in one such layer, bytes
            (whole model; divided by ``tp`` per worker: the state is sharded with the heads / channels).
        linear_layer_params: parameters of one such layer's mixer (replacing the attention projections).
        moe_layer_period / moe_layer_offset: with period p > 1 only layers ``i`` with ``i % p == offset`` are MoE,
            the others dense (Jamba ``expert_layer_period`` / ``expert_layer_offset``).
        expert_element_bits / expert_scale_block: block-quantised routed experts (gpt-oss MXFP4: 4-bit elements,
            one 8-bit scale per 32; 0 = the experts at ``dtype_bytes``): bits per weight
            ``element_bits + 8 / scale_block`` (OCP Microscaling Formats v1.0, section 5: MXFP4 = E2M1 elements,
            k = 32, E8M0 scale).
        attention_sinks: one learned sink logit per query head and layer (gpt-oss): ``num_q_heads`` parameters per
            attention layer, no KV token (the sink is a softmax term, not a cached position).
        stage_index / num_stages: the pipeline stage this view is (0 of 1: the whole model); the first stage
            holds the embedding, the last the final norm and the LM head.
        source: where the shape was read from (``catalog.toml`` or the file).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    max_context_tokens: int
    dtype_bytes: int = 2
    kv_dtype_bytes: int = 0
    mlp_gated: bool = True
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    attention_out_bias: bool = False
    mlp_bias: bool = False
    lm_head_bias: bool = False
    norms_per_layer: int = 2
    norm_bias: bool = False
    qk_norm: bool = False
    position_embedding_tokens: int = 0
    num_experts: int = 0
    num_shared_experts: int = 0
    experts_per_token: int = 0
    moe_ffn_size: int = 0
    first_dense_layers: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    sliding_window_tokens: int = 0
    sliding_window_layers: int = 0
    chunked_attention_tokens: int = 0
    chunked_attention_layers: int = 0
    linear_layers: int = 0
    linear_state_bytes_per_layer: int = 0
    linear_layer_params: int = 0
    moe_layer_period: int = 1
    moe_layer_offset: int = 0
    expert_element_bits: int = 0
    expert_scale_block: int = 0
    attention_sinks: bool = False
    stage_index: int = 0
    num_stages: int = 1
    source: str = "catalog.toml"

    # ---- kinds -------------------------------------------------------------------------------------
    @property
    def uses_mla(self) -> bool:
        """Multi-head Latent Attention: one compressed latent per token and layer in the KV cache."""
        return self.kv_lora_rank > 0

    @property
    def uses_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def activation_bytes(self) -> int:
        """Bytes of activations, norms, the embedding and the LM head: the weight dtype, at least 2 (an fp8
        checkpoint keeps them in bf16, as vLLM's fp8 linear method quantizes linear layers only)."""
        return max(self.dtype_bytes, 2)

    @property
    def kv_element_bytes(self) -> int:
        """Bytes per KV-cache element: :attr:`kv_dtype_bytes`, else :attr:`activation_bytes`."""
        return self.kv_dtype_bytes or self.activation_bytes

    @property
    def has_embedding(self) -> bool:
        """This (stage of the) model holds the input embedding (the first pipeline stage)."""
        return self.stage_index == 0

    @property
    def has_lm_head(self) -> bool:
        """This (stage of the) model holds the final norm and the LM head (the last pipeline stage)."""
        return self.stage_index == self.num_stages - 1

    @property
    def num_moe_layers(self) -> int:
        if self.uses_moe and self.moe_layer_period > 1:     # Jamba: layers i with i % period == offset
            return len(range(self.moe_layer_offset, self.num_layers, self.moe_layer_period))
        return self.num_layers - self.first_dense_layers if self.uses_moe else 0

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    # ---- tensor parallelism ---------------------------------------------------------------------------
    def check_tp(self, tp: int) -> None:
        """Raise :class:`CatalogError` unless ``tp`` divides the KV and Q heads (needed to shard them; MLA: the
        Q heads, its latent is replicated)."""
        kv_heads = 1 if self.uses_mla else self.num_kv_heads
        if tp < 1 or (not self.uses_mla and self.num_kv_heads % tp) or self.num_q_heads % tp:
            heads = (f"{self.num_q_heads} query heads" if self.uses_mla else
                     f"{self.num_kv_heads} KV heads and {self.num_q_heads} query heads")
            raise CatalogError(
                f"tp={tp} does not divide {self.name}'s {heads}; use one of "
                f"{[t for t in (1, 2, 4, 8) if (self.uses_mla or kv_heads % t == 0) and self.num_q_heads % t == 0]}",
                "tp")

    DECODER_FIELDS = ("num_layers", "hidden_size", "num_q_heads", "num_kv_heads", "head_dim", "ffn_size", "vocab_size")
    """The sizes a decoder is built from (``hwbackend.replay.model.DecoderModel``; recorded by a replay as
    ``transformer_shape``)."""

    def per_worker(self, tp: int = 1) -> "ModelSpec":
        """The shape one of ``tp`` tensor-parallel workers computes (Megatron sharding): query and KV heads and
        the MLP width divided by ``tp``; layers, hidden size, head size and vocabulary as the model's.

        Raises:
            CatalogError: when ``tp`` does not divide the heads.
        """
        self.check_tp(tp)
        return replace(self, num_q_heads=self.num_q_heads // tp, num_kv_heads=self.num_kv_heads // tp,
                       ffn_size=self.ffn_size // tp)

    def decoder_shape(self) -> dict:
        """The :data:`DECODER_FIELDS` as a dict."""
        return {name: getattr(self, name) for name in self.DECODER_FIELDS}

    # ---- pipeline parallelism ---------------------------------------------------------------------------
    def pipeline_layers(self, pp: int) -> list[int]:
        """Layers of each of ``pp`` pipeline stages, as vLLM partitions them (``vllm/distributed/utils.py``
        ``get_pp_indices``): ``N // pp`` each, the remainder one each to the stages before the last, from the
        second-to-last backwards (the first and last hold the embedding and the head).

        Raises:
            CatalogError: for ``pp < 1`` or more stages than layers.
        """
        if not 1 <= pp <= self.num_layers:
            raise CatalogError(f"pp={pp}: {self.name} has {self.num_layers} layers; pipeline stages must lie in "
                               f"[1, {self.num_layers}]", "pp")
        layers = [self.num_layers // pp] * pp
        for index in range(2, self.num_layers % pp + 2):
            layers[-index] += 1
        return layers

    def pipeline_stages(self, pp: int) -> list["ModelSpec"]:
        """The model as each of ``pp`` pipeline stages holds it: its layers (dense layers first, as in the
        model), embedding on the first, final norm and LM head on the last; sliding-window layers pro rata.

        Raises:
            CatalogError: for an impossible ``pp`` (:meth:`pipeline_layers`).
        """
        if pp == 1 and self.num_stages == 1:
            return [self]
        stages, start = [], 0
        for index, layers in enumerate(self.pipeline_layers(pp)):
            dense = max(0, min(start + layers, self.first_dense_layers) - start)
            sliding = self.sliding_window_layers * layers // self.num_layers
            kinds = {name: getattr(self, name) * layers // self.num_layers     # pro rata, as the sliding layers
                     for name in ("chunked_attention_layers", "linear_layers")}
            stages.append(replace(self, num_layers=layers, first_dense_layers=dense, sliding_window_layers=sliding,
                                  stage_index=index, num_stages=pp, **kinds))
            start += layers
        return stages

    # ---- records -----------------------------------------------------------------------------------------
    def derived_figures(self, tp: int = 1) -> dict:
        """The sizes a run depends on, for ``config.json`` (bytes and parameter counts, per worker where named)."""
        attention = "mla" if self.uses_mla else ("mha" if self.num_kv_heads == self.num_q_heads else "gqa")
        figures = {
            "source": self.source, "attention": attention, "mlp": "gated" if self.mlp_gated else "plain",
            "tie_word_embeddings": self.tie_word_embeddings, "weight_bytes_per_param": self.dtype_bytes,
            "kv_bytes_per_element": self.kv_element_bytes, "total_params": self.total_params(),
            "active_params_per_token": self.active_params(), "weight_bytes_per_worker": self.weight_bytes(tp),
            "kv_bytes_per_token_per_layer_per_worker": self.kv_bytes_per_token_per_layer(tp),
            "kv_bytes_per_token_per_worker": self.kv_bytes_per_token(tp),
            "sub_tensors_per_worker": self.num_sub_tensors(),
            "sliding_window_tokens": self.sliding_window_tokens, "sliding_window_layers": self.sliding_window_layers,
        }
        if self.uses_moe:
            figures.update(experts=self.num_experts, experts_per_token=self.experts_per_token,
                           shared_experts=self.num_shared_experts, moe_layers=self.num_moe_layers,
                           routed_expert_bytes_per_worker=self.routed_expert_bytes(tp))
        if self.sliding_window_tokens and self.sliding_window_layers:
            figures["kv_bytes_per_request_at_context_per_worker"] = self.kv_bytes_for_tokens(self.max_context_tokens, tp)
        return figures


@dataclass(frozen=True)
class GPUSpec:
    """An accelerator from vendor datasheets (sources in catalog.toml). Rates per second, sizes in bytes.

    Attributes:
        name / full_name: catalogue key (or the user file) and the product.
        hbm_bytes: device memory (what the driver reports where measured, else the datasheet's decimal GB).
        bf16_flops / fp8_flops: dense tensor-core peaks (no sparsity); ``fp8_flops`` 0 = no fp8 tensor cores.
        mem_bw_bytes_per_s: device-memory bandwidth.
        nvlink_bytes_per_s: GPU-to-GPU bandwidth per direction inside a server (NVLink, Infinity Fabric, or
            PCIe peer-to-peer for cards without a switch fabric): tensor-parallel all-reduces and pipeline sends.
        pcie_bytes_per_s: host link per direction (swapping).
        usd_per_gpu_hour: public on-demand price per GPU-hour (``None``: no public price recorded).
        price_source: where and when the price was read.
        vmm_measured: the VMM latency distributions were measured on this GPU (only the H200); others borrow them.
        source: the datasheet.
        flops_efficiency / bw_efficiency: achieved fractions of ``bf16_flops`` (GEMMs of many tokens) and of
            ``mem_bw_bytes_per_s`` (GEMMs of few tokens: weight streaming) that become the roofline's defaults on
            this GPU (:class:`sim.timing.compute.RooflineComputeModel`); 0 = not sourced: the H200's measured figures.
        elementwise_bw_efficiency: achieved fraction of the bandwidth of the elementwise operators (informational:
            the roofline has no elementwise term); 0 = not sourced.
        efficiency_source: where those fractions come from (catalog.toml).
    """

    name: str
    full_name: str
    hbm_bytes: int
    bf16_flops: float
    mem_bw_bytes_per_s: float
    nvlink_bytes_per_s: float
    pcie_bytes_per_s: float
    fp8_flops: float = 0.0
    usd_per_gpu_hour: float | None = None
    price_source: str = ""
    vmm_measured: bool = False
    source: str = ""
    flops_efficiency: float = 0.0
    bw_efficiency: float = 0.0
    elementwise_bw_efficiency: float = 0.0
    efficiency_source: str = ""

    VMM_PROFILE_GPU = "h200"
    """The GPU whose measured VMM latencies (``profiles/h200.json``, the built-in defaults) every run uses."""

    @property
    def efficiency_note(self) -> str:
        """Where this GPU's compute efficiencies come from, or that it borrows the H200's."""
        if self.flops_efficiency and self.bw_efficiency:
            return self.efficiency_source
        return ("no sourced efficiencies for this GPU: the H200's measured 788/989 of peak FLOP/s and 4.3/4.8 of "
                "HBM bandwidth are used (docs/models.md)")

    @property
    def vmm_borrowed_from(self) -> str | None:
        """The GPU whose VMM latency measurements this one uses (``None`` when measured on this one)."""
        return None if self.vmm_measured else self.VMM_PROFILE_GPU


GPU_FIELDS = tuple(f.name for f in fields(GPUSpec) if f.name != "name")
MODEL_FIELDS = tuple(f.name for f in fields(ModelSpec) if f.name not in ("name", "stage_index", "num_stages", "source"))


