"""The sizes derived from a model's shape on one worker: KV bytes per token, sub-tensors and tokens per page,
parameter counts and weight bytes (:class:`ModelSizes`, mixed into :class:`sim.setup.specs.ModelSpec`; the
formulas and their sources: :mod:`sim.setup.specs`'s module docstring and each method's)."""
from __future__ import annotations


class ModelSizes:
    """KV-cache and parameter sizes of a :class:`sim.setup.specs.ModelSpec` (which it is mixed into: ``self``
    is that spec; it holds no fields and reads the spec's, and ``check_tp`` is the spec's)."""

    # ---- KV cache ------------------------------------------------------------------------------------
    def kv_heads_per_worker(self, tp: int = 1) -> int:
        """H', KV heads held by one tensor-parallel worker (MLA: 1, the latent, replicated on every worker)."""
        self.check_tp(tp)
        return 1 if self.uses_mla else self.num_kv_heads // tp

    def sub_tensor_bytes_per_token(self, tp: int = 1) -> int:
        """Bytes one token occupies in one per-layer K (or V) tensor on one worker: ``H' * D * P_kv``; MLA: the
        latent, ``(kv_lora_rank + qk_rope_head_dim) * P_kv`` (one tensor per layer)."""
        if self.uses_mla:
            self.check_tp(tp)
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.kv_element_bytes
        return self.kv_heads_per_worker(tp) * self.head_dim * self.kv_element_bytes

    def kv_bytes_per_token_per_layer(self, tp: int = 1) -> int:
        """KV bytes one token adds to one layer on one worker: GQA ``2 H' D P_kv``; MLA the latent."""
        return (1 if self.uses_mla else 2) * self.sub_tensor_bytes_per_token(tp)

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV-cache bytes per token on one worker, all layers: GQA ``2 * N * H' * D * P_kv``; MLA
        ``N * (kv_lora_rank + qk_rope_head_dim) * P_kv``."""
        if self.uses_mla:
            return self.num_layers * self.sub_tensor_bytes_per_token(tp)
        return 2 * self.num_layers * self.sub_tensor_bytes_per_token(tp)

    def kv_bytes_for_tokens(self, tokens: int, tp: int = 1) -> int:
        """KV bytes of one request holding ``tokens`` tokens on one worker, with sliding-window layers capped at
        their window: ``full layers * per_layer * tokens + sliding layers * per_layer * min(tokens, window)``."""
        per_layer = self.kv_bytes_per_token_per_layer(tp)
        sliding = self.sliding_window_layers if self.sliding_window_tokens else 0
        window = min(tokens, self.sliding_window_tokens) if sliding else 0
        return (self.num_layers - sliding) * per_layer * tokens + sliding * per_layer * window

    def num_sub_tensors(self) -> int:
        """2N' per-layer K and V virtual tensors on one worker (MLA: N', one latent tensor per layer); a page
        group maps one page in each."""
        return self.num_layers if self.uses_mla else 2 * self.num_layers

    def tokens_per_page(self, page_size_bytes: int, tp: int = 1) -> int:
        """Tokens that fit in one page of one sub-tensor: ``floor(G / (H' * D * P_kv))`` (0 if none fits)."""
        return page_size_bytes // self.sub_tensor_bytes_per_token(tp)

    # ---- parameters ----------------------------------------------------------------------------------
    def mlp_params(self, width: int) -> int:
        """Parameters of one MLP of intermediate ``width``: ``3 h w`` gated (SwiGLU), ``2 h w`` plain; with
        :attr:`mlp_bias` the up (and gate) biases ``w`` (``2 w`` gated) and the down bias ``h``."""
        h, matrices = self.hidden_size, 3 if self.mlp_gated else 2
        bias = (matrices - 1) * width + h if self.mlp_bias else 0
        return matrices * h * width + bias

    def attention_params(self) -> tuple[int, int]:
        """``(sharded, replicated)`` parameters of one layer's attention: GQA Q, K, V, O (+ QKV biases);
        MLA (DeepSeek-V2 section 2.1): ``q_a`` (``h x q_lora``, replicated) with its norm and ``q_b``
        (``q_lora x Hq (nope + rope)``), or one ``h x Hq (nope + rope)`` without ``q_lora_rank``; ``kv_a``
        (``h x (kv_lora + rope)``, replicated) with its norm; ``kv_b`` (``kv_lora x Hq (nope + v)``);
        ``o`` (``Hq v x h``). Replicated parts are vLLM's ``ReplicatedLinear`` layers; the output projection's
        bias (:attr:`attention_out_bias`, ``h``) is replicated (vLLM's ``RowParallelLinear`` keeps it whole)."""
        h, heads = self.hidden_size, self.num_q_heads
        out_bias = h if self.attention_out_bias else 0
        if not self.uses_mla:
            sharded = 2 * h * heads * self.head_dim + 2 * h * self.num_kv_heads * self.head_dim
            if self.attention_bias:
                sharded += heads * self.head_dim + 2 * self.num_kv_heads * self.head_dim
            return sharded, out_bias
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.q_lora_rank:
            q_sharded, q_replicated = self.q_lora_rank * heads * qk, h * self.q_lora_rank + self.q_lora_rank
        else:
            q_sharded, q_replicated = h * heads * qk, 0
        kv_replicated = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv_b = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        out = heads * self.v_head_dim * h
        return q_sharded + kv_b + out, q_replicated + kv_replicated + out_bias

    def _layer_params(self, moe: bool, active: bool) -> tuple[int, int]:
        """``(sharded, replicated)`` linear parameters of one dense or MoE layer; ``active``: only the experts
        one token runs (top-k routed + shared) instead of all resident ones."""
        sharded, replicated = self.attention_params()
        if not moe:
            return sharded + self.mlp_params(self.ffn_size), replicated
        experts = (self.experts_per_token if active else self.num_experts) + self.num_shared_experts
        router = self.hidden_size * self.num_experts
        return sharded + experts * self.mlp_params(self.moe_ffn_size), replicated + router

    def linear_params_per_layer(self, tp: int = 1, moe: bool = False) -> int:
        """Parameters of one layer's projections and MLP (all experts, for a MoE layer) on one worker."""
        sharded, replicated = self._layer_params(moe, active=False)
        return sharded // tp + replicated

    def linear_params(self, tp: int = 1) -> int:
        """Resident linear parameters of all layers on one worker (every expert)."""
        dense = self.num_dense_layers * self.linear_params_per_layer(tp)
        moe = self.num_moe_layers * self.linear_params_per_layer(tp, moe=True) if self.uses_moe else 0
        return dense + moe + self._mixer_params_delta(tp)

    def _mixer_params_delta(self, tp: int) -> int:
        """Parameters that layer kinds add to the per-layer counts on one worker: a Mamba / linear-attention layer's
        mixer (:attr:`linear_layer_params`, sharded) replaces its attention projections; attention sinks add
        ``num_q_heads`` per attention layer (gpt-oss ``self_attn.sinks``)."""
        if not (self.linear_layers or self.attention_sinks):
            return 0
        sharded, replicated = self.attention_params()
        sinks = self.num_q_heads // tp if self.attention_sinks else 0
        return (self.linear_layers * (self.linear_layer_params // tp - sharded // tp - replicated)
                + (self.num_layers - self.linear_layers) * sinks)

    def quantised_expert_params(self, tp: int = 1) -> int:
        """Routed experts' matrix parameters stored block-quantised on one worker (0 unless
        :attr:`expert_element_bits`); their biases stay at ``dtype_bytes``."""
        if not (self.expert_element_bits and self.uses_moe):
            return 0
        matrices = 3 if self.mlp_gated else 2
        return self.num_moe_layers * self.num_experts * matrices * self.hidden_size * self.moe_ffn_size // tp

    def _quantised_saving_bytes(self, params: int) -> int:
        """Bytes saved by storing ``params`` at ``element_bits + 8 / scale_block`` bits instead of ``dtype_bytes``."""
        if not params:
            return 0
        block = self.expert_scale_block or 1
        bits_x_block = self.expert_element_bits * block + (8 if self.expert_scale_block else 0)
        return params * self.dtype_bytes - -(-params * bits_x_block // (8 * block))

    def active_linear_params(self, tp: int = 1) -> int:
        """Linear parameters one token runs through on one worker (FLOPs ``2 x`` this): dense layers, and in MoE
        layers attention, router, ``experts_per_token`` routed and the shared experts."""
        if not self.uses_moe:
            return self.num_layers * self.linear_params_per_layer(tp) + self._mixer_params_delta(tp)
        sharded, replicated = self._layer_params(moe=True, active=True)
        return (self.num_dense_layers * self.linear_params_per_layer(tp) + self.num_moe_layers * (sharded // tp + replicated)
                + self._mixer_params_delta(tp))

    def routed_expert_bytes(self, tp: int = 1) -> int:
        """Bytes of the routed experts of all MoE layers on one worker (read only for the experts a batch picks)."""
        full = self.num_moe_layers * (self.num_experts * self.mlp_params(self.moe_ffn_size) // tp) * self.dtype_bytes
        return full - self._quantised_saving_bytes(self.quantised_expert_params(tp))

    def embedding_params(self, tp: int = 1) -> int:
        """Embedding and LM-head parameters on one worker (vocab-parallel): two tables, one when tied, and the
        head's bias (:attr:`lm_head_bias`); a pipeline stage holds the embedding (first) and/or the head (last).
        A learned position embedding is :meth:`position_embedding_params`."""
        tables = (int(self.has_embedding) + int(self.has_lm_head) if not self.tie_word_embeddings
                  else int(self.has_embedding or self.has_lm_head))
        head_bias = self.vocab_size if self.lm_head_bias and self.has_lm_head else 0
        return (tables * self.vocab_size * self.hidden_size + head_bias) // tp

    def position_embedding_params(self) -> int:
        """Learned absolute position embedding on the first stage: ``position_embedding_tokens x h``, whole on
        every worker (vLLM's GPT-2 and OPT keep it an unsharded ``nn.Embedding``)."""
        return self.position_embedding_tokens * self.hidden_size if self.has_embedding else 0

    def norm_params(self) -> int:
        """Norm weights: :attr:`norms_per_layer` per layer (and Qwen3/Gemma-3 query and key norms of
        ``head_dim`` each), and the final norm on the stage holding the LM head; LayerNorms
        (:attr:`norm_bias`) hold a weight and a bias, RMSNorms a weight."""
        per_norm = self.hidden_size * (2 if self.norm_bias else 1)
        per_layer = self.norms_per_layer * per_norm + (2 * self.head_dim if self.qk_norm else 0)
        return self.num_layers * per_layer + (per_norm if self.has_lm_head else 0)

    def _unsharded_small_params(self, tp: int) -> int:
        """Norms, embedding and head (vocab-parallel) and learned positions held by one worker."""
        return self.norm_params() + self.embedding_params(tp) + self.position_embedding_params()

    def weight_bytes(self, tp: int = 1) -> int:
        """Weight bytes held by one worker: linear layers at ``dtype_bytes`` (all experts resident); norms,
        embedding and LM head (vocab-parallel, one table when tied) at :attr:`activation_bytes`.

        Raises:
            CatalogError: when ``tp`` does not divide the heads.
        """
        self.check_tp(tp)
        return (self.linear_params(tp) * self.dtype_bytes + self._unsharded_small_params(tp) * self.activation_bytes
                - self._quantised_saving_bytes(self.quantised_expert_params(tp)))

    def unread_embedding_bytes(self, tp: int = 1) -> int:
        """Weight bytes an iteration does not stream: the input embedding (only the batch's rows are gathered),
        unless it is tied to an LM head on this worker (then it is read as the head), and a learned position
        embedding (gathered by position)."""
        positions = self.position_embedding_params() * self.activation_bytes
        if not self.has_embedding or (self.tie_word_embeddings and self.has_lm_head):
            return positions
        return self.vocab_size * self.hidden_size * self.activation_bytes // tp + positions

    def total_params(self) -> int:
        """All parameters of the (stage of the) model: linear (with biases), norms, embedding, head and learned
        positions."""
        return self.linear_params(1) + self._unsharded_small_params(1)

    def active_params(self) -> int:
        """Parameters one token runs through (MoE: top-k and shared experts; the LM head counted once)."""
        return self.active_linear_params(1) + self._unsharded_small_params(1)

    @property
    def attention_qk_dim(self) -> int:
        """Elements per (query, key) dot product: ``head_dim``; MLA absorbed (vLLM's decode path):
        ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim if self.uses_mla else self.head_dim

    @property
    def attention_v_dim(self) -> int:
        """Elements per value row: ``head_dim``; MLA absorbed: ``kv_lora_rank``."""
        return self.kv_lora_rank if self.uses_mla else self.head_dim
