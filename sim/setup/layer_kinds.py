"""Layer kinds of a Hugging Face ``config.json``: chunked-local attention, Mamba / linear-attention layers, block-
quantised experts and attention sinks (the :class:`sim.setup.specs.ModelSpec` fields of hybrid models; sliding windows
are read by :func:`sim.setup.model_files._sliding`). The per-group shapes built from these fields are
:mod:`sim.memory.layer_groups`.

Fields read (docs/hybrid.md has the table):

* chunked local attention (Llama 4, ``Llama4TextConfig``): ``attention_chunk_size``; the chunked layers are those
  with ``no_rope_layers[i] == 1`` (RoPE layers attend locally, NoPE layers globally), by default all but every
  ``nope_layer_interval``-th (4).
* Mamba layers (Jamba, ``JambaConfig``): ``layers_block_type`` or ``attn_layer_period`` / ``attn_layer_offset``
  (layer ``i`` is attention when ``i % period == offset``; defaults 8 and 4); ``mamba_d_state``, ``mamba_d_conv``,
  ``mamba_expand``, ``mamba_dt_rank`` (default ``ceil(hidden / 16)``), ``mamba_conv_bias``, ``mamba_proj_bias``;
  MoE on layers ``i % expert_layer_period == expert_layer_offset``.
* Gated DeltaNet linear attention (Qwen3-Next, ``Qwen3NextConfig``): ``layer_types`` entries
  ``linear_attention``, ``linear_num_key_heads``, ``linear_num_value_heads``, ``linear_key_head_dim``,
  ``linear_value_head_dim``, ``linear_conv_kernel_dim``.
* ``quantization_config.quant_method = "mxfp4"`` (gpt-oss): routed experts' matrices at 4.25 bits per weight.
* ``model_type = "gpt_oss"``: attention sinks.

State bytes per request and layer follow vLLM's ``MambaStateShapeCalculator`` (vllm/model_executor/layers/mamba/
mamba_utils.py): Mamba-1 ``conv (d_conv - 1) x d_inner + ssm d_inner x d_state``; Gated DeltaNet ``conv
(kernel - 1) x (2 key_dim + value_dim) + recurrent num_v_heads x k_dim x v_dim``, in the model dtype (vLLM's
``mamba_cache_dtype`` / ``mamba_ssm_cache_dtype`` default ``auto``).
"""
from __future__ import annotations

import math

MXFP4_ELEMENT_BITS = 4
MXFP4_SCALE_BLOCK = 32
"""OCP Microscaling Formats (MX) v1.0 (2023), section 5.3: MXFP4 = FP4 (E2M1) elements in blocks of k = 32 sharing
one 8-bit E8M0 scale: 4 + 8 / 32 = 4.25 bits per weight. gpt-oss stores its MoE weights so (gpt-oss model card,
section 2.1; ``quantization_config.quant_method = "mxfp4"``, ``*_blocks`` / ``*_scales`` tensors)."""


def layer_kind_fields(f, data: dict, layers: int, hidden: int, dtype_bytes: int, model_type: str) -> dict:
    """The :class:`sim.setup.specs.ModelSpec` fields of chunked-local, Mamba / linear layers, MoE period, block-quantised
    experts and attention sinks of one parsed ``config.json`` (``f``: the file's typed field reader).

    Raises:
        CatalogError: a mistyped or out-of-range field, naming the file and the field.
    """
    out: dict = {}
    if f.has("attention_chunk_size"):
        out["chunked_attention_tokens"] = f.integer("attention_chunk_size")
        out["chunked_attention_layers"] = _chunked_layers(f, data, layers)
    mamba = _mamba(f, data, layers, hidden, dtype_bytes, model_type)
    out.update(mamba or _gated_delta_net(f, data, layers, hidden, dtype_bytes) or {})
    if f.has("expert_layer_period"):
        out["moe_layer_period"] = f.integer("expert_layer_period")
        out["moe_layer_offset"] = f.integer("expert_layer_offset", 0, minimum=0)
    quantization = data.get("quantization_config")
    if isinstance(quantization, dict) and quantization.get("quant_method") == "mxfp4":
        out.update(expert_element_bits=MXFP4_ELEMENT_BITS, expert_scale_block=MXFP4_SCALE_BLOCK)
    if model_type == "gpt_oss":
        out["attention_sinks"] = True
    return out


def _chunked_layers(f, data: dict, layers: int) -> int:
    """Llama 4: layers with ``no_rope_layers[i] == 1`` use chunked attention (``Llama4TextAttention``
    ``use_rope``); without the list all but every ``nope_layer_interval``-th (default 4) layer."""
    flags = data.get("no_rope_layers")
    if flags:
        if not isinstance(flags, list) or len(flags) != layers:
            raise f.fail("no_rope_layers", f"must be a list of {layers} 0/1 entries (one per layer)")
        return sum(1 for flag in flags if flag)
    interval = f.integer("nope_layer_interval", 4)
    return layers - layers // interval


def _mamba(f, data: dict, layers: int, hidden: int, dtype_bytes: int, model_type: str) -> dict | None:
    """Jamba's Mamba-1 layers: count, state bytes per request per layer, mixer parameters (``JambaMambaMixer``)."""
    if model_type != "jamba" and not f.has("mamba_d_state"):
        return None
    types = data.get("layers_block_type")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise f.fail("layers_block_type", f"must be a list of {layers} strings (one per layer)")
        mamba_layers = sum(t == "mamba" for t in types)
    else:
        period, offset = f.integer("attn_layer_period", 8), f.integer("attn_layer_offset", 4, minimum=0)
        mamba_layers = layers - len(range(offset, layers, period))
    d_state, d_conv, expand = f.integer("mamba_d_state", 16), f.integer("mamba_d_conv", 4), f.integer("mamba_expand", 2)
    d_inner, dt_rank = expand * hidden, f.integer("mamba_dt_rank", math.ceil(hidden / 16))
    state_bytes = ((d_conv - 1) * d_inner + d_inner * d_state) * dtype_bytes
    params = (hidden * 2 * d_inner + d_inner * d_conv
              + (d_inner if f.flag("mamba_conv_bias", True) else 0) + d_inner * (dt_rank + 2 * d_state)
              + dt_rank * d_inner + d_inner + d_inner * d_state + d_inner + d_inner * hidden
              + dt_rank + 2 * d_state)
    if f.flag("mamba_proj_bias", False):
        params += 2 * d_inner + hidden
    return {"linear_layers": mamba_layers, "linear_state_bytes_per_layer": state_bytes, "linear_layer_params": params}


def _gated_delta_net(f, data: dict, layers: int, hidden: int, dtype_bytes: int) -> dict | None:
    """Qwen3-Next's Gated DeltaNet layers (``layer_types`` ``linear_attention``; ``Qwen3NextGatedDeltaNet``)."""
    types = data.get("layer_types")
    if not isinstance(types, list) or "linear_attention" not in types:
        return None
    k_heads, v_heads = f.integer("linear_num_key_heads"), f.integer("linear_num_value_heads")
    k_dim, v_dim, kernel = f.integer("linear_key_head_dim"), f.integer("linear_value_head_dim"), f.integer(
        "linear_conv_kernel_dim", 4)
    key_dim, value_dim = k_heads * k_dim, v_heads * v_dim
    conv_dim = 2 * key_dim + value_dim
    state_bytes = ((kernel - 1) * conv_dim + v_heads * k_dim * v_dim) * dtype_bytes
    # in_proj_qkvz (q, k, v, z), in_proj_ba (b, a per value head), conv1d, dt_bias, A_log, norm, out_proj
    params = (hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * v_heads + conv_dim * kernel + 2 * v_heads
              + v_dim + value_dim * hidden)
    return {"linear_layers": sum(t == "linear_attention" for t in types),
            "linear_state_bytes_per_layer": state_bytes, "linear_layer_params": params}
