"""Models and GPUs from a user's files: a Hugging Face ``config.json`` (read locally, never downloaded), a model
TOML or a GPU TOML. Every problem is one :class:`sim.setup.specs.CatalogError` line naming the file and the field.

Hugging Face ``config.json`` fields read (docs/models.md has the table):

* ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, ``vocab_size``, ``max_position_embeddings``
  (required); ``num_key_value_heads`` (default: ``num_attention_heads``, as transformers does); ``head_dim``
  (default ``hidden_size / num_attention_heads``); ``intermediate_size`` (required unless every layer is MoE with
  its own ``moe_intermediate_size``); ``tie_word_embeddings`` (default: false for the Llama-family
  ``model_type`` values of :data:`UNTIED_BY_DEFAULT`, else transformers' ``PretrainedConfig`` default, true);
  ``attention_bias`` (Qwen2: true).
* dtype: ``torch_dtype`` (or ``dtype``; default bfloat16; float32 is served as 16 bits, as vLLM's ``auto``
  does); ``quantization_config.quant_method = "fp8"`` makes the linear weights 1 byte (other methods are refused:
  pass a TOML instead).
* other families' names (:data:`FIELD_ALIASES`): ``n_layer``, ``n_embd``/``n_embed``, ``n_head``,
  ``ffn_dim`` (OPT), ``n_inner``/``ffn_hidden_size`` (default ``4 x hidden`` for GPT-2, GPT-J, Falcon),
  ``n_positions``, ``num_kv_heads``, ``activation_function``; Falcon's ``multi_query`` (one KV head) and
  ``new_decoder_architecture``.
* biases, norms, learned positions (:func:`family_structure`): by ``model_type`` with ``enable_bias`` (OPT),
  ``bias`` (Falcon), ``attention_bias``, ``mlp_bias``, ``parallel_attn``.
* sliding window: ``sliding_window`` (null = none) on every layer, unless ``use_sliding_window`` is false
  (Qwen2) or ``layer_types`` lists which layers slide.
* MoE: ``num_local_experts`` (Mixtral), ``n_routed_experts`` (DeepSeek) or ``num_experts`` (Qwen-MoE);
  ``num_experts_per_tok``; ``n_shared_experts``; ``moe_intermediate_size`` (default ``intermediate_size``);
  ``first_k_dense_replace``; ``moe_layer_freq`` must be 1.
* MLA: ``kv_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``, ``q_lora_rank``.
* MLP kind: gated (SwiGLU, 3 matrices) for the ``model_type`` values of :data:`GATED_MODEL_TYPES`, plain
  (2 matrices) for :data:`PLAIN_MODEL_TYPES`; other types by ``hidden_act`` (``silu``/``swiglu``: gated).

A model TOML holds the catalogue's keys (:class:`sim.setup.specs.ModelSpec` fields, as in ``sim/setup/catalog.toml``) at
the top level; a GPU TOML the :class:`sim.setup.specs.GPUSpec` fields.
"""
from __future__ import annotations

import json
import math
import tomllib
from functools import cache
from pathlib import Path

from sim.setup.layer_kinds import layer_kind_fields
from sim.setup.specs import GPU_FIELDS, MODEL_FIELDS, CatalogError, GPUSpec, ModelSpec

REPO_ROOT = Path(__file__).resolve().parents[2]

TORCH_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1,
                     "float8_e4m3fn": 1, "float8_e5m2": 1}
"""Bytes per element of the ``torch_dtype`` names a config may hold."""

GATED_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek", "deepseek_v2",
    "deepseek_v3", "gemma", "gemma2", "gemma3", "gemma3_text", "internlm2", "yi", "phi3", "olmo", "olmo2", "cohere",
    "granite", "exaone", "baichuan", "minicpm", "stablelm", "starcoder2_gated", "dbrx", "jamba", "arctic", "gpt_oss"})
"""``model_type`` values whose MLP is gated (gate, up and down projections; SwiGLU or GeGLU)."""

PLAIN_MODEL_TYPES = frozenset({"gpt2", "gpt_neox", "gptj", "opt", "falcon", "bloom", "phi", "starcoder2",
                               "gpt_bigcode", "mpt", "codegen"})
"""``model_type`` values whose MLP is plain (up and down projections)."""

GATED_ACTIVATIONS = frozenset({"silu", "swiglu", "swish"})
"""``hidden_act`` values taken as a gated MLP for a ``model_type`` in neither list."""

PLAIN_ACTIVATIONS = frozenset({"gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "quick_gelu"})
"""``hidden_act`` values taken as a plain MLP for a ``model_type`` in neither list (any other is refused)."""

UNTIED_BY_DEFAULT = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                               "deepseek_v2", "deepseek_v3", "yi", "internlm2", "phi3", "olmo2", "granite",
                               "gptj", "gpt_neox", "phi", "gpt_oss", "jamba"})
"""``model_type`` values whose transformers config class defaults ``tie_word_embeddings`` to false
(``GPTJConfig``, ``GPTNeoXConfig`` and ``PhiConfig`` set it false too)."""

FIELD_ALIASES = {
    "num_hidden_layers": ("n_layer",),                          # GPT-2, GPT-J, Falcon (RefinedWeb)
    "hidden_size": ("n_embd", "n_embed"),                       # GPT-2, GPT-J; Falcon (RefinedWeb)
    "num_attention_heads": ("n_head",),                         # GPT-2, GPT-J, Falcon (RefinedWeb)
    "num_key_value_heads": ("num_kv_heads",),                   # Falcon (new decoder architecture)
    "intermediate_size": ("ffn_dim", "n_inner", "ffn_hidden_size"),   # OPT; GPT-2, GPT-J; Falcon
    "max_position_embeddings": ("n_positions",),                # GPT-2, GPT-J
    "hidden_act": ("activation_function", "hidden_activation"),  # GPT-2, GPT-J, OPT; Gemma
}
"""Other families' names of the fields kvsim reads (transformers' ``attribute_map`` of each config class);
the Llama-style name is used when both are present, and a message names the field the file holds."""

FFN_4H_MODEL_TYPES = frozenset({"gpt2", "gptj", "falcon"})
"""``model_type`` values whose MLP width defaults to ``4 x hidden_size`` (``n_inner: null``, Falcon without
``ffn_hidden_size``)."""

CONTEXT_DEFAULTS = {"falcon": 2048}
"""Context windows of config classes whose ``config.json`` may omit ``max_position_embeddings``
(``FalconConfig``: 2048)."""


def resolve_file(path_text: str) -> Path:
    """``path_text`` as given if it exists, else relative to the repository root (so the shipped
    ``models/*.json`` resolve from any working directory).

    Raises:
        CatalogError: when neither exists.
    """
    path = Path(path_text).expanduser()
    if path.is_file():
        return path
    if not path.is_absolute() and (REPO_ROOT / path).is_file():
        return REPO_ROOT / path
    if path.is_dir():
        raise CatalogError(f"{path_text}: a directory without a config.json in it (a model is a catalogue name, a "
                           "Hugging Face config.json or a directory holding one, or a TOML file; a GPU is a "
                           "catalogue name or a TOML file)")
    raise CatalogError(f"{path_text}: no such file (a model is a catalogue name, a Hugging Face config.json or a "
                       "TOML file; a GPU is a catalogue name or a TOML file)")


def load_model_file(path_text: str) -> ModelSpec:
    """The :class:`ModelSpec` in a Hugging Face ``config.json`` (or a model directory holding one) or a model TOML
    (see the module docstring).

    Raises:
        CatalogError: a missing or unreadable file, a missing, mistyped or out-of-range field, or fields that
            contradict each other; one line naming the file and the field.
    """
    given = Path(path_text).expanduser()
    if given.is_dir() and (given / "config.json").is_file():     # a Hugging Face model directory
        path_text = str(given / "config.json")
    path = resolve_file(path_text)
    return _load_model(str(path), path.stat().st_mtime_ns, path_text)


def load_gpu_file(path_text: str) -> GPUSpec:
    """The :class:`GPUSpec` in a GPU TOML: ``full_name``, ``hbm_bytes``, ``bf16_flops``, ``mem_bw_bytes_per_s``,
    ``nvlink_bytes_per_s``, ``pcie_bytes_per_s`` (required), ``fp8_flops``, ``usd_per_gpu_hour``,
    ``price_source``, ``vmm_measured``, ``source`` (optional).

    Raises:
        CatalogError: a missing or unreadable file, an unknown, missing or out-of-range field (naming it).
    """
    path = resolve_file(path_text)
    return _load_gpu(str(path), path.stat().st_mtime_ns, path_text)


# ---- reading ------------------------------------------------------------------------------------------
def _read(path: Path, shown: str) -> dict:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CatalogError(f"{shown}: cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode().removeprefix("\ufeff")      # a BOM (Windows editors) as the CSV and JSON readers allow
        data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except UnicodeDecodeError:
        raise CatalogError(f"{shown}: not a text file") from None
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{shown}: not valid TOML: {exc}") from None
    except json.JSONDecodeError as exc:
        read_as = ("" if path.suffix.lower() == ".json" else
                   " (read as JSON: a name not ending in .toml; a model or GPU file is .toml or .json)")
        raise CatalogError(f"{shown}: not valid JSON{read_as}: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{shown}: expected a JSON object / TOML table of fields, got {type(data).__name__}")
    return data


INTEGER_FIELD_MAX = 2 ** 40
"""The largest whole number a model or GPU file's field may hold (about 1.1e12: no layer count, width, head
count or token length of a real model comes near it), so that sizes built from them stay exact in the 64-bit
integers of the records."""

HBM_BYTES_MAX = 2 ** 48
"""The largest ``hbm_bytes`` a GPU file may give (256 TiB, a thousand times today's largest GPU memory): page
and block counts of such a pool, and byte figures, stay within 64-bit integers."""


GPU_RATE_BOUNDS = {"bf16_flops": (1e11, 1e18, "FLOP/s"), "fp8_flops": (1e11, 1e18, "FLOP/s"),
                   "mem_bw_bytes_per_s": (1e9, 1e16, "B/s"), "nvlink_bytes_per_s": (1e6, 1e16, "B/s"),
                   "pcie_bytes_per_s": (1e6, 1e16, "B/s")}
"""The range a GPU file's peak rates must lie in (0.1 TFLOP/s to 1 EFLOP/s; memory 1 GB/s to 10 PB/s; links 1 MB/s
to 10 PB/s: three or more orders of magnitude around every GPU of the catalogue, whose datasheets give 0.15-2.25
PFLOP/s bf16 and 0.7-8 TB/s). Outside it iteration times overflow to infinity or vanish (a 1e-300 FLOP/s GPU
gave infinite times reported as finished requests)."""


class _Fields:
    """Typed access to one file's fields; every failure names the file and the field (the name the file uses:
    a field of :data:`FIELD_ALIASES` is looked up under its other families' names too)."""

    def __init__(self, data: dict, shown: str, aliases: dict | None = None):
        self.data, self.shown, self.aliases = data, shown, aliases or {}

    def name(self, field: str) -> str:
        """``field``, or the first of its aliases the file sets (``field`` when none is set)."""
        for candidate in (field, *self.aliases.get(field, ())):
            if self.data.get(candidate) is not None:
                return candidate
        return field

    def fail(self, field: str, problem: str) -> CatalogError:
        return CatalogError(f"{self.shown}: field {self.name(field)} {problem}")

    def has(self, field: str) -> bool:
        return self.data.get(self.name(field)) is not None

    def integer(self, field: str, default=None, minimum: int = 1, maximum: int = INTEGER_FIELD_MAX) -> int:
        value = self.data.get(self.name(field))
        if value is None:
            if default is None:
                raise self.fail(field, "is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise self.fail(field, f"must be a whole number, got {json.dumps(value)}")
        if value < minimum:
            raise self.fail(field, f"must be >= {minimum}, got {value}")
        if value > maximum:
            shown = f"{value:,}" if value < 10 ** 16 else f"{value:.6g}"     # exact near the bound, short far above
            raise self.fail(field, f"must be <= {maximum:,} ({maximum:.3g}), got {shown}")
        return value

    def number(self, field: str, default=None, positive: bool = True) -> float:
        value = self.data.get(field)
        if value is None:
            if default is None:
                raise self.fail(field, "is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(field, f"must be a finite number, got {json.dumps(value)}")
        if positive and value <= 0:
            raise self.fail(field, f"must be > 0, got {value}")
        return float(value)

    def flag(self, field: str, default: bool) -> bool:
        value = self.data.get(self.name(field))
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(field, f"must be true or false, got {json.dumps(value)}")
        return value

    def text(self, field: str, default: str | None = None) -> str:
        value = self.data.get(self.name(field))
        if value is None:
            if default is None:
                raise self.fail(field, "is missing")
            return default
        if not isinstance(value, str):
            raise self.fail(field, f"must be a string, got {json.dumps(value)}")
        return value


@cache
def _load_model(path_text: str, _mtime_ns: int, shown: str) -> ModelSpec:
    path = Path(path_text)
    data = _read(path, shown)
    if path.suffix.lower() == ".toml":
        return _model_from_toml(data, shown, path)
    return model_from_hf_config(data, shown, name=path.stem if path.stem != "config" else path.parent.name)


def _model_from_toml(data: dict, shown: str, path: Path) -> ModelSpec:
    fields = _Fields(data, shown)
    unknown = sorted(set(data) - set(MODEL_FIELDS) - {"name"})
    if unknown:
        raise fields.fail(unknown[0], f"is not a model field (known: {', '.join(MODEL_FIELDS)})")
    values = {}
    for name in MODEL_FIELDS:
        default = ModelSpec.__dataclass_fields__[name].default
        if isinstance(default, bool):
            values[name] = fields.flag(name, default)
        elif name == "max_context_tokens":          # a slot must hold a prompt token and an output token
            values[name] = fields.integer(name, minimum=2)
        elif name in ("num_layers", "hidden_size", "num_q_heads", "num_kv_heads", "head_dim", "ffn_size",
                      "vocab_size"):
            values[name] = fields.integer(name)
        else:
            values[name] = fields.integer(name, default, minimum=0 if default == 0 else 1)
    if values["dtype_bytes"] not in (1, 2, 4) or values["kv_dtype_bytes"] not in (0, 1, 2, 4):
        bad = "dtype_bytes" if values["dtype_bytes"] not in (1, 2, 4) else "kv_dtype_bytes"
        raise fields.fail(bad, f"must be 1, 2 or 4 bytes, got {values[bad]}")
    spec = ModelSpec(name=fields.text("name", path.stem), source=shown, **values)
    _check_consistent(spec, fields)
    return spec


def model_from_hf_config(data: dict, shown: str, name: str = "model") -> ModelSpec:
    """The :class:`ModelSpec` of a parsed Hugging Face ``config.json`` (``shown`` names it in messages).

    Raises:
        CatalogError: as :func:`load_model_file`.
    """
    f = _Fields(data, shown, FIELD_ALIASES)
    model_type = f.text("model_type", "")
    layers = f.integer("num_hidden_layers")
    hidden = f.integer("hidden_size")
    heads = f.integer("num_attention_heads")
    kv_heads = _kv_heads(f, model_type, heads)
    if heads % kv_heads:
        raise f.fail("num_key_value_heads", f"({kv_heads}) must divide num_attention_heads ({heads})")
    mla = f.has("kv_lora_rank")
    if mla:
        kv_lora = f.integer("kv_lora_rank")
        rope = f.integer("qk_rope_head_dim")
        nope = f.integer("qk_nope_head_dim")
        v_dim = f.integer("v_head_dim")
        q_lora = f.integer("q_lora_rank", 0, minimum=0)
        head_dim = nope + rope
    else:
        for field in ("qk_rope_head_dim", "qk_nope_head_dim", "q_lora_rank"):
            if f.has(field):
                raise f.fail("kv_lora_rank", f"is missing while {field} is set (MLA needs both)")
        kv_lora = rope = nope = v_dim = q_lora = 0
        if f.has("head_dim"):
            head_dim = f.integer("head_dim")
        elif hidden % heads:
            raise f.fail("head_dim", f"is missing and hidden_size {hidden} is not a multiple of num_attention_heads "
                                     f"{heads}")
        else:
            head_dim = hidden // heads
    experts, expert_field = 0, None
    for field in ("num_local_experts", "n_routed_experts", "num_experts"):
        if f.has(field):
            count = f.integer(field)
            if experts and count != experts:
                raise f.fail(field, f"({count}) contradicts {expert_field} ({experts})")
            experts, expert_field = count, field
    if experts == 1:
        experts = 0          # one "expert" is a dense MLP
    if experts:
        top_k = f.integer("num_experts_per_tok")
        if top_k > experts:
            raise f.fail("num_experts_per_tok", f"({top_k}) exceeds the {experts} experts of {expert_field}")
        shared = f.integer("n_shared_experts", 0, minimum=0)
        first_dense = f.integer("first_k_dense_replace", 0, minimum=0)
        if first_dense > layers:
            raise f.fail("first_k_dense_replace", f"({first_dense}) exceeds num_hidden_layers ({layers})")
        if f.integer("moe_layer_freq", 1) != 1 and not f.has("expert_layer_period"):
            raise f.fail("moe_layer_freq", f"must be 1 (every layer after first_k_dense_replace is MoE), got "
                                           f"{data['moe_layer_freq']}")
        moe_ffn = f.integer("moe_intermediate_size", f.integer("intermediate_size", 0, minimum=0) or None)
        ffn = f.integer("intermediate_size", moe_ffn if first_dense == 0 else None)
    else:
        top_k = shared = first_dense = moe_ffn = 0
        ffn = f.integer("intermediate_size", 4 * hidden if model_type in FFN_4H_MODEL_TYPES else None)
    vocab = f.integer("vocab_size")
    context = f.integer("max_position_embeddings", CONTEXT_DEFAULTS.get(model_type), minimum=2)
    dtype_name = data.get("torch_dtype", data.get("dtype")) or "bfloat16"
    dtype_field = "torch_dtype" if "torch_dtype" in data else "dtype"
    if not isinstance(dtype_name, str) or dtype_name.replace("torch.", "") not in TORCH_DTYPE_BYTES:
        raise f.fail(dtype_field, f"must be one of {', '.join(TORCH_DTYPE_BYTES)}, got {json.dumps(dtype_name)}")
    # a float32 checkpoint is served in 16 bits (vLLM's dtype "auto", vllm/config.py _get_and_verify_dtype)
    dtype_bytes = min(TORCH_DTYPE_BYTES[dtype_name.replace("torch.", "")], 2)
    quantization = data.get("quantization_config")
    if quantization is not None:
        if not isinstance(quantization, dict):
            raise f.fail("quantization_config", f"must be an object with a quant_method (fp8, mxfp4), got "
                                                f"{json.dumps(quantization)}")
        method = quantization.get("quant_method")
        if method not in ("fp8", "mxfp4"):
            raise f.fail("quantization_config.quant_method", f"{json.dumps(method)} is not supported (fp8, mxfp4 are); "
                                                             "give the model as a TOML with its dtype_bytes instead")
        if method == "fp8":
            dtype_bytes = 1
    _check_layer_types(f, data, layers)
    sliding_window, sliding_layers = _sliding(f, layers, model_type)
    kinds = layer_kind_fields(f, data, layers, hidden, dtype_bytes, model_type)   # sim.setup.layer_kinds
    gated = _mlp_gated(f, model_type)
    tied = f.flag("tie_word_embeddings", model_type not in UNTIED_BY_DEFAULT)
    structure = family_structure(f, model_type, hidden, context)
    spec = ModelSpec(
        name=name, num_layers=layers, hidden_size=hidden, num_q_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        ffn_size=ffn, vocab_size=vocab, max_context_tokens=context, dtype_bytes=dtype_bytes, mlp_gated=gated,
        tie_word_embeddings=tied, **structure, num_experts=experts, num_shared_experts=shared,
        experts_per_token=top_k, moe_ffn_size=moe_ffn, first_dense_layers=first_dense, kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope, qk_nope_head_dim=nope, v_head_dim=v_dim, q_lora_rank=q_lora,
        sliding_window_tokens=sliding_window, sliding_window_layers=sliding_layers, source=shown, **kinds)
    _check_consistent(spec, f)
    return spec


def _kv_heads(f: _Fields, model_type: str, heads: int) -> int:
    """KV heads: ``num_key_value_heads`` (Falcon's new decoder architecture: ``num_kv_heads``); Falcon-7B's
    ``multi_query`` (default true, ``FalconConfig``) means one KV head; else ``num_attention_heads`` (MHA)."""
    if model_type == "falcon" and not f.flag("new_decoder_architecture", False):
        return 1 if f.flag("multi_query", True) else heads
    return f.integer("num_key_value_heads", heads)


LAYERNORM_MODEL_TYPES = frozenset({"opt", "gpt2", "gptj", "gpt_neox", "falcon", "phi"})
"""``model_type`` values whose norms are LayerNorms (weight and bias) rather than RMSNorms."""

BIASED_MODEL_TYPES = frozenset({"opt", "gpt2", "gpt_neox", "phi"})
"""``model_type`` values whose Q, K, V, output and MLP projections all carry biases (OPT ``enable_bias``, GPT-2
``Conv1D``, GPT-NeoX ``attention_bias``, Phi ``Linear``)."""


def family_structure(f: _Fields, model_type: str, hidden: int, context: int) -> dict:
    """The :class:`sim.setup.specs.ModelSpec` fields of biases, norms and learned positions a family's modelling file
    fixes (transformers ``modeling_<type>.py``), with the config flags that change them:

    ========= ============ ============ ============================ ======================= ==================
    type      norms/layer  norm         biases                       LM head bias            positions
    ========= ============ ============ ============================ ======================= ==================
    opt       2            LayerNorm    all (``enable_bias``)        no                      context + 2
    gpt2      2            LayerNorm    all                          no                      ``n_positions``
    gptj      1 (parallel) LayerNorm    MLP only                     yes                     rotary
    gpt_neox  2            LayerNorm    all (``attention_bias``)     no                      rotary
    falcon    1 parallel,  LayerNorm    all if ``bias``              no                      rotary / ALiBi
              2 otherwise
    phi       1 (parallel) LayerNorm    all                          yes                     rotary
    gemma2/3  4            RMSNorm      none (gemma3: Q/K norms)     no                      rotary
    qwen2     2            RMSNorm      Q, K, V                      no                      rotary
    qwen3     2            RMSNorm      none; Q/K norms              no                      rotary
    other     2            RMSNorm      ``attention_bias`` (Q, K, V, O), ``mlp_bias``         rotary
    ========= ============ ============ ============================ ======================= ==================

    Raises:
        CatalogError: OPT with ``word_embed_proj_dim`` unlike ``hidden_size`` (OPT-350m's projected embedding
            is not modelled), naming the field.
    """
    if model_type == "opt" and f.integer("word_embed_proj_dim", hidden) != hidden:
        raise f.fail("word_embed_proj_dim", f"({f.data['word_embed_proj_dim']}) differs from hidden_size ({hidden}): "
                                            "OPT's projected embeddings (opt-350m) are not modelled")
    biased = model_type in BIASED_MODEL_TYPES
    if model_type == "opt":
        biased = f.flag("enable_bias", True)
    elif model_type == "gpt_neox":
        biased = f.flag("attention_bias", True)
    elif model_type == "falcon":
        biased = f.flag("bias", False)
    qkv_bias = biased or f.flag("attention_bias", model_type in ("qwen2", "qwen2_moe"))
    out_bias = biased or (model_type not in ("qwen2", "qwen2_moe") and f.flag("attention_bias", False))
    positions = {"opt": context + 2, "gpt2": context}.get(model_type, 0)
    return {"attention_bias": qkv_bias, "attention_out_bias": out_bias,
            "mlp_bias": biased or model_type in ("gptj", "gpt_oss") or f.flag("mlp_bias", False),
            "lm_head_bias": model_type in ("gptj", "phi"), "norms_per_layer": _norms_per_layer(f, model_type),
            "norm_bias": model_type in LAYERNORM_MODEL_TYPES,
            "qk_norm": model_type in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"),
            "position_embedding_tokens": positions}


def _norms_per_layer(f: _Fields, model_type: str) -> int:
    """Norms per decoder layer: one shared by the parallel attention and MLP (GPT-J, Phi-2; Falcon with
    ``parallel_attn``, default true), two for Falcon's new decoder architecture (``ln_attn``, ``ln_mlp``), four
    for Gemma 2/3, else two."""
    if model_type in ("gptj", "phi"):
        return 1
    if model_type == "falcon":
        return 2 if f.flag("new_decoder_architecture", False) or not f.flag("parallel_attn", True) else 1
    return 4 if model_type in ("gemma2", "gemma3", "gemma3_text") else 2


LAYER_TYPES = {"layer_types": ("full_attention", "sliding_attention", "linear_attention", "chunked_attention"),
               "layers_block_type": ("attention", "mamba")}
"""The per-layer type names Hugging Face configurations use (``layer_types``: Gemma 2/3, gpt-oss, Qwen3-Next,
Llama 4; ``layers_block_type``: Jamba); any other entry is refused (a misspelt one was counted as full attention)."""


def _check_layer_types(f: _Fields, data: dict, layers: int) -> None:
    """Each per-layer type list, when present, holds one known name (:data:`LAYER_TYPES`) per layer."""
    for key, known in LAYER_TYPES.items():
        types = data.get(key)
        if types is None:
            continue
        if not isinstance(types, list) or len(types) != layers or not all(isinstance(t, str) for t in types):
            raise f.fail(key, f"must be a list of {layers} strings (one per layer)")
        for index, name in enumerate(types):
            if name not in known:
                raise f.fail(f"{key}[{index}]", f"{json.dumps(name)} is not a layer type kvsim knows "
                                                f"({', '.join(known)})")


def _sliding(f: _Fields, layers: int, model_type: str = "") -> tuple[int, int]:
    """``(window tokens, sliding layers)`` from ``sliding_window``, ``use_sliding_window``, ``layer_types``;
    without ``layer_types`` Gemma 2 slides every other layer (from the first) and Gemma 3 all but every
    ``sliding_window_pattern``-th (default 6), as their config classes define ``layer_types``; other families
    slide every layer."""
    if not f.has("sliding_window") or not f.flag("use_sliding_window", True):
        return 0, 0
    window = f.integer("sliding_window")
    types = f.data.get("layer_types")
    if types is None and model_type == "gemma2":
        return window, (layers + 1) // 2
    if types is None and model_type in ("gemma3", "gemma3_text"):
        return window, layers - layers // f.integer("sliding_window_pattern", 6)
    if types is None:
        return window, layers
    if not isinstance(types, list) or len(types) != layers or not all(isinstance(t, str) for t in types):
        raise f.fail("layer_types", f"must be a list of {layers} strings (one per layer)")
    return window, sum(t == "sliding_attention" for t in types)


def _mlp_gated(f: _Fields, model_type: str) -> bool:
    act = f.data.get(f.name("hidden_act"))
    if model_type in GATED_MODEL_TYPES:
        return True
    if model_type in PLAIN_MODEL_TYPES:
        return False
    if not isinstance(act, str):
        raise f.fail("hidden_act", f"is missing and model_type {json.dumps(model_type)} is not one kvsim knows: "
                                   "cannot tell whether the MLP is gated (give the model as a TOML with mlp_gated)")
    if act.lower() in GATED_ACTIVATIONS:
        return True
    if act.lower() in PLAIN_ACTIVATIONS:
        return False
    raise f.fail("hidden_act", f"{json.dumps(act)} with model_type {json.dumps(model_type)}: kvsim knows neither, so "
                               "cannot tell whether the MLP is gated (give the model as a TOML with mlp_gated)")


def _check_consistent(spec: ModelSpec, f: _Fields) -> None:
    if spec.num_q_heads % spec.num_kv_heads:
        raise f.fail("num_kv_heads", f"({spec.num_kv_heads}) must divide num_q_heads ({spec.num_q_heads})")
    if spec.num_experts and not (spec.experts_per_token and spec.moe_ffn_size):
        raise f.fail("experts_per_token" if not spec.experts_per_token else "moe_ffn_size",
                     "must be > 0 for a MoE model (num_experts > 0)")
    if spec.experts_per_token > max(spec.num_experts, 0) and spec.num_experts:
        raise f.fail("experts_per_token", f"({spec.experts_per_token}) exceeds num_experts ({spec.num_experts})")
    if spec.first_dense_layers > spec.num_layers:
        raise f.fail("first_dense_layers", f"({spec.first_dense_layers}) exceeds num_layers ({spec.num_layers})")
    if spec.sliding_window_layers > spec.num_layers:
        raise f.fail("sliding_window_layers", f"({spec.sliding_window_layers}) exceeds num_layers ({spec.num_layers})")
    if spec.kv_lora_rank and not spec.qk_rope_head_dim:
        raise f.fail("qk_rope_head_dim", "must be > 0 with kv_lora_rank (MLA)")


@cache
def _load_gpu(path_text: str, _mtime_ns: int, shown: str) -> GPUSpec:
    path = Path(path_text)
    data = _read(path, shown)
    f = _Fields(data, shown)
    unknown = sorted(set(data) - set(GPU_FIELDS) - {"name"})
    if unknown:
        raise f.fail(unknown[0], f"is not a GPU field (known: {', '.join(GPU_FIELDS)})")
    price = f.number("usd_per_gpu_hour", 0.0, positive=False) if f.has("usd_per_gpu_hour") else None
    if price is not None and price <= 0:
        raise f.fail("usd_per_gpu_hour", f"must be > 0 $/GPU-hour, got {price}")
    fp8 = f.number("fp8_flops", 0.0, positive=False)
    if fp8 < 0:
        raise f.fail("fp8_flops", f"must be >= 0 FLOP/s, got {fp8}")
    bf16 = f.number("bf16_flops")
    for field, (low, high, unit) in GPU_RATE_BOUNDS.items():
        value = fp8 if field == "fp8_flops" else f.number(field)
        if (field != "fp8_flops" or value) and not low <= value <= high:
            raise f.fail(field, f"{value:g} {unit} lies outside [{low:g}, {high:g}] {unit}: no GPU is that "
                                f"{'slow' if value < low else 'fast'} (docs/models.md lists the catalogue's GPUs)")
    if 0 < fp8 < bf16:   # fp8 tensor cores run at least the bf16 rate (2x on Hopper and Blackwell datasheets)
        raise f.fail("fp8_flops", f"{fp8:g} FLOP/s is below bf16_flops ({bf16:g}): an fp8 peak is at least the "
                                  "bf16 one (twice it on H100/H200/B200 datasheets); 0 or absent = no fp8 tensor cores")
    efficiencies = {}
    for field in ("flops_efficiency", "bw_efficiency", "elementwise_bw_efficiency"):
        value = f.number(field, 0.0, positive=False)
        if not 0 <= value <= 1:
            raise f.fail(field, f"must lie in (0, 1] (an achieved fraction of the datasheet peak; 0 or absent: the "
                                f"H200's measured fractions), got {value:g}")
        efficiencies[field] = value
    if bool(efficiencies["flops_efficiency"]) != bool(efficiencies["bw_efficiency"]):
        given, missing = (("flops_efficiency", "bw_efficiency") if efficiencies["flops_efficiency"]
                          else ("bw_efficiency", "flops_efficiency"))
        raise f.fail(missing, f"is missing beside {given}: the roofline takes a GPU's fractions as a pair")
    if efficiencies["flops_efficiency"] and not f.has("efficiency_source"):
        raise f.fail("efficiency_source", "is missing: say where flops_efficiency and bw_efficiency were measured")
    return GPUSpec(
        **efficiencies, efficiency_source=f.text("efficiency_source", ""),
        name=f.text("name", path.stem), full_name=f.text("full_name"),
        hbm_bytes=f.integer("hbm_bytes", maximum=HBM_BYTES_MAX),
        bf16_flops=f.number("bf16_flops"), mem_bw_bytes_per_s=f.number("mem_bw_bytes_per_s"),
        nvlink_bytes_per_s=f.number("nvlink_bytes_per_s"), pcie_bytes_per_s=f.number("pcie_bytes_per_s"),
        fp8_flops=fp8, usd_per_gpu_hour=price, price_source=f.text("price_source", ""),
        vmm_measured=f.flag("vmm_measured", False), source=f.text("source", shown))
