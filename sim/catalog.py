"""Catalogue of models and GPUs, read from ``catalog.toml`` (data, not code).

Every derived size is a property computed from the public shapes, never typed twice:

* weights per worker ``weight_bytes(tp)``: embedding + LM head + per layer (Q, K, V, O projections,
  gated MLP with three ``hidden x ffn`` matrices, two RMSNorm vectors) + final norm, at ``dtype_bytes``;
  K/V projections and KV heads are divided by the tensor-parallel degree ``tp``.
* KV bytes per token per worker ``kv_bytes_per_token(tp) = 2 * N * H' * D * P`` (domain.md, "The problem"),
  ``H' = num_kv_heads / tp``.
* bytes per token in one K or V sub-tensor ``sub_tensor_bytes_per_token(tp) = H' * D * P``; tokens per page
  ``floor(G / (H' * D * P))`` (domain.md, "Mechanism").
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources


class CatalogError(ValueError):
    """An unknown model or GPU, or an impossible tensor-parallel degree; the message lists the choices."""


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer (public config). All sizes in elements unless named ``*_bytes``.

    Attributes:
        name: catalogue key, e.g. ``"llama-3-8b"``.
        num_layers: N, decoder layers.
        hidden_size: model width.
        num_q_heads / num_kv_heads: attention heads (GQA when KV heads < Q heads).
        head_dim: D, elements per head.
        ffn_size: MLP intermediate width (gated MLP: 3 matrices).
        vocab_size: embedding rows (LM head untied).
        max_context_tokens: native context window.
        dtype_bytes: P, bytes per element (2 for bf16).
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

    def check_tp(self, tp: int) -> None:
        """Raise :class:`CatalogError` unless ``tp`` divides the KV and Q heads (needed to shard them)."""
        if tp < 1 or self.num_kv_heads % tp or self.num_q_heads % tp:
            raise CatalogError(
                f"--tp {tp} does not divide {self.name}'s {self.num_kv_heads} KV heads and "
                f"{self.num_q_heads} query heads; use one of "
                f"{[t for t in (1, 2, 4, 8) if self.num_kv_heads % t == 0 and self.num_q_heads % t == 0]}")

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

    def kv_heads_per_worker(self, tp: int = 1) -> int:
        """H', KV heads held by one tensor-parallel worker."""
        self.check_tp(tp)
        return self.num_kv_heads // tp

    def sub_tensor_bytes_per_token(self, tp: int = 1) -> int:
        """Bytes one token occupies in one per-layer K (or V) tensor on one worker: ``H' * D * P``."""
        return self.kv_heads_per_worker(tp) * self.head_dim * self.dtype_bytes

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV-cache bytes per token on one worker, all layers, K and V: ``2 * N * H' * D * P``."""
        return 2 * self.num_layers * self.sub_tensor_bytes_per_token(tp)

    def num_sub_tensors(self) -> int:
        """2N': the number of per-layer K and V virtual tensors on one worker (a page group maps one page in each)."""
        return 2 * self.num_layers

    def linear_params_per_layer(self, tp: int = 1) -> int:
        """Parameters of one layer's projections and MLP on one worker (elements)."""
        q_and_o = 2 * self.hidden_size * self.num_q_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        mlp = 3 * self.hidden_size * self.ffn_size
        return (q_and_o + k_and_v + mlp) // tp

    def weight_bytes(self, tp: int = 1) -> int:
        """Weight bytes held by one worker: layers + norms + embedding and LM head (vocab-parallel)."""
        self.check_tp(tp)
        per_layer = self.linear_params_per_layer(tp) + 2 * self.hidden_size
        embed_and_head = 2 * self.vocab_size * self.hidden_size // tp
        return (self.num_layers * per_layer + embed_and_head + self.hidden_size) * self.dtype_bytes

    def tokens_per_page(self, page_size_bytes: int, tp: int = 1) -> int:
        """Tokens that fit in one page of one sub-tensor: ``floor(G / (H' * D * P))`` (0 if none fits)."""
        return page_size_bytes // self.sub_tensor_bytes_per_token(tp)


@dataclass(frozen=True)
class GPUSpec:
    """An accelerator from vendor datasheets (see catalog.toml for sources). Rates per second, sizes in bytes."""

    name: str
    full_name: str
    hbm_bytes: int
    bf16_flops: float
    mem_bw_bytes_per_s: float
    nvlink_bytes_per_s: float
    pcie_bytes_per_s: float


@cache
def _catalog() -> dict:
    with resources.files("sim").joinpath("catalog.toml").open("rb") as handle:
        return tomllib.load(handle)


def model_names() -> list[str]:
    """Names of the catalogued models."""
    return sorted(_catalog()["models"])


def gpu_names() -> list[str]:
    """Names of the catalogued GPUs."""
    return sorted(_catalog()["gpus"])


def get_model(name: str) -> ModelSpec:
    """Look a model up by name (case-insensitive).

    Raises:
        CatalogError: for an unknown name; the message lists the known models.
    """
    entry = _catalog()["models"].get(name.lower())
    if entry is None:
        raise CatalogError(f"unknown model {name!r}; known models: {', '.join(model_names())}")
    return ModelSpec(name=name.lower(), **entry)


def get_gpu(name: str) -> GPUSpec:
    """Look a GPU up by name (case-insensitive).

    Raises:
        CatalogError: for an unknown name; the message lists the known GPUs.
    """
    entry = _catalog()["gpus"].get(name.lower())
    if entry is None:
        raise CatalogError(f"unknown GPU {name!r}; known GPUs: {', '.join(gpu_names())}")
    return GPUSpec(name=name.lower(), **{k: (int(v) if k == "hbm_bytes" else v) for k, v in entry.items()})
