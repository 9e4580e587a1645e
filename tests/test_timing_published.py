"""Checks of kvsim's built-in roofline against published iteration times, TTFTs and throughputs (issue 31, item 5).

Figures: issue 31's reading of Sarathi-Serve (Agrawal et al., OSDI'24): a Mistral-7B decode iteration of 32
sequences x 4K context on one A100 takes ~20 ms; Yi-34B at TP2 on two A100s ~40 ms (the paper's exact figure or
table was not located in the searchable corpora; the batch of the Yi-34B figure is taken as the same 32 x 4K).
Tolerance 15%: the figures are read off plots ("~"), and issue 31's done-when bound is 15%. A check that misses
it is an xfail with its measured error (strict), never a looser bound. The table with and without the per-GPU
defaults is in docs/models.md.

Further checks (issue 31 item 5; each source's exact setup is beside its table below):
* TensorRT-LLM's published performance tables (NVIDIA/TensorRT-LLM ``docs/source/performance.md`` at commit
  138f96d45f90b9667426f7c47297d8c06bafac73, "Performance of TensorRT-LLM"): "Low Latency", A100 GPUs (FP16),
  first-token latency at batch 1 (TensorRT-LLM v0.5), and "Peak Throughput", A100 GPUs (FP16), output tokens/s of
  static batches (``gptSessionBenchmark``, v0.6.1); "LLaMA 7B" is Llama-2-7B and "LLaMA 70B" Llama-2-70B (the
  page's "Engine Building Setups": "Llama2-7b, and Llama2-70b"); one H100 FP8 row. The A100 is the 80 GB card
  (60 sequences of 2,176 tokens of Llama-2-7B hold 68.4 GB of KV beside 13.5 GB of weights). TensorRT-LLM has no
  kvsim preset: kvsim's built-in defaults are used, per-iteration overhead 1.3 ms (eager PyTorch's, more than
  TensorRT-LLM's C++ runtime pays; docs/models.md gives the errors with 0 as well).
* vLLM on one A100 40GB (J. Musgrave, "vLLM throughput-latency sweep on NVIDIA A100",
  johnmusgrave.com/p/vllm-throughput-latency-sweep-on: vLLM 0.23.0 defaults, Llama-3.1-8B-Instruct BF16,
  ``vllm bench serve`` random 1,024 in / 128 out, ``--max-concurrency 1``): "decode at one request per time runs
  at about 75 tokens/sec", i.e. a TPOT of ~13.3 ms; kvsim with the ``--engine vllm-v1`` preset's CUDA-graphed
  decodes.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sim.setup.catalog import get_gpu, get_model
from sim.timing.compute import (H200_BW_EFFICIENCY, H200_FLOPS_EFFICIENCY, BatchShape, RooflineComputeModel,
                                decode_batch)
from sim.setup.engines import engine_preset

TOLERANCE = 0.15

CHECKS = [  # (name, model, gpu, tp, batch, context tokens, published ms)
    ("sarathi-serve mistral-7b a100 32x4k decode", "mistral-7b", "a100", 1, 32, 4096, 20.0),
    ("sarathi-serve yi-34b a100 tp2 32x4k decode", "yi-34b", "a100", 2, 32, 4096, 40.0),
]


def _iteration_ms(model: str, gpu: str, tp: int, batch: int, context: int, h200_efficiencies: bool = False) -> float:
    fields = dict(flops_efficiency=H200_FLOPS_EFFICIENCY, bw_efficiency=H200_BW_EFFICIENCY) if h200_efficiencies else {}
    compute = RooflineComputeModel(get_model(model), get_gpu(gpu), tp, **fields)
    return compute.iteration_us(decode_batch(batch, context)) / 1e3


@pytest.mark.parametrize("name, model, gpu, tp, batch, context, published_ms", CHECKS, ids=[c[0] for c in CHECKS])
def test_decode_iteration_within_15_percent_of_the_published_figure(name, model, gpu, tp, batch, context, published_ms):
    """Measured 2026-12-02 (this test's function): Mistral-7B 21.33 ms (+6.7%), Yi-34B TP2 34.50 ms (-13.8%) with
    the A100's Vidur-derived efficiencies; 18.52 (-7.4%) and 30.02 (-25.0%) with the H200's."""
    assert _iteration_ms(model, gpu, tp, batch, context) == pytest.approx(published_ms, rel=TOLERANCE)


def test_the_h200_keeps_its_measured_efficiencies_and_other_gpus_without_a_source_borrow_them():
    h200 = RooflineComputeModel(get_model("llama-3-8b"), get_gpu("h200"))
    assert (h200.flops_efficiency, h200.bw_efficiency) == (788 / 989, 4.3 / 4.8)
    l40s = RooflineComputeModel(get_model("llama-3-8b"), get_gpu("l40s"))
    assert (l40s.flops_efficiency, l40s.bw_efficiency) == (788 / 989, 4.3 / 4.8)
    assert "H200" in get_gpu("l40s").efficiency_note and "vidur" in get_gpu("a100").efficiency_note


@pytest.mark.parametrize("gpu, flops, bw", [("a100", 0.735, 0.770), ("h100", 0.698, 0.843), ("a40", 0.765, 0.786)])
def test_sourced_gpus_use_the_vidur_medians_and_an_explicit_value_wins(gpu, flops, bw):
    """The medians over profiles/vidur-<gpu>-*.json's roofline sections (TP1 fits), rounded to 3 places."""
    import json
    import statistics
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "profiles"
    fits = [json.loads(p.read_text())["compute"]["roofline"] for p in sorted(root.glob(f"vidur-{gpu}-*.json"))]
    assert statistics.median(f["flops_efficiency"] for f in fits) == pytest.approx(flops, abs=6e-4)
    assert statistics.median(f["bw_efficiency"] for f in fits) == pytest.approx(bw, abs=6e-4)
    compute = RooflineComputeModel(get_model("llama-3-8b"), get_gpu(gpu))
    assert (compute.flops_efficiency, compute.bw_efficiency) == (flops, bw)
    assert RooflineComputeModel(get_model("llama-3-8b"), get_gpu(gpu), flops_efficiency=0.5).flops_efficiency == 0.5


# ---- TensorRT-LLM's published tables (module docstring) -------------------------------------------------------------

def _llama_2_70b():
    """Llama-2-70B: the Hugging Face config (80 layers, hidden 8192, 64 query / 8 KV heads of 128, MLP 28672) is
    the catalogue's Llama-3-70B with a 32,000-token vocabulary and a 4,096-token context."""
    return dataclasses.replace(get_model("llama-3-70b"), vocab_size=32000, max_context_tokens=4096)


def _fp8(model):
    """fp8 weights and fp8 KV cache (TensorRT-LLM's ``--enable_fp8 --fp8_kv_cache`` H100 builds)."""
    return dataclasses.replace(model, dtype_bytes=1, kv_dtype_bytes=1)


def prefill_batch(batch_size: int, prompt_tokens: int) -> BatchShape:
    """Shape of one iteration prefilling ``batch_size`` prompts of ``prompt_tokens`` tokens, nothing cached: causal
    attention pairs ``q (q + 1) / 2`` per prompt, one logit per sequence."""
    return BatchShape(new_tokens=batch_size * prompt_tokens,
                      attention_pairs=batch_size * prompt_tokens * (prompt_tokens + 1) / 2, kv_read_tokens=0,
                      logit_sequences=batch_size, max_context_tokens=prompt_tokens)


def static_batch_us(compute: RooflineComputeModel, batch_size: int, input_tokens: int, output_tokens: int):
    """A static batch as ``gptSessionBenchmark`` runs it: one context iteration of the whole batch (it emits the
    first token), then ``output_tokens - 1`` decode steps with ``input_tokens + k - 1`` cached at step ``k``.
    Returns ``(ttft_us, mean_tpot_us, e2e_us)``."""
    ttft_us = compute.iteration_us(prefill_batch(batch_size, input_tokens))
    decode_us = [compute.iteration_us(decode_batch(batch_size, input_tokens + k - 1)) for k in range(1, output_tokens)]
    return ttft_us, float(np.mean(decode_us)), ttft_us + float(np.sum(decode_us))


TTFT_CHECKS = [  # (name, model, gpu, tp, prompt tokens, published ms, measured error when it misses)
    ("trt-llm a100 fp16 llama-2-7b ttft 2048", lambda: get_model("llama-2-7b"), "a100", 1, 2048, 133.0, None),
    ("trt-llm a100 fp16 llama-2-70b tp4 ttft 2048", _llama_2_70b, "a100", 4, 2048, 377.0, None),
    ("trt-llm a100 fp16 llama-2-7b ttft 128", lambda: get_model("llama-2-7b"), "a100", 1, 128, 16.0,
     "kvsim 9.76 ms, -39.0%: a 128-token GEMM runs between the two regimes the roofline has (tile shapes; "
     "docs/models.md: up to ~50% low there), and 16 ms holds fixed costs of TensorRT-LLM v0.5 not modelled"),
    ("trt-llm h100 fp8 llama-2-7b ttft 2048", lambda: _fp8(get_model("llama-2-7b")), "h100", 1, 2048, 36.0,
     "kvsim 23.69 ms, -34.2%: fp8 GEMMs are costed at the bf16 GEMM fraction (Vidur's H100 0.698) of the fp8 peak, "
     "no fp8 efficiency being sourced; the published 36 ms lies between that and the bf16 rate (42.91 ms, +19.2%)"),
]


def _ttft_params():
    for name, model, gpu, tp, prompt, published_ms, miss in TTFT_CHECKS:
        marks = [pytest.mark.xfail(strict=True, reason=miss)] if miss else []
        yield pytest.param(model, gpu, tp, prompt, published_ms, id=name, marks=marks)


@pytest.mark.parametrize("model, gpu, tp, prompt, published_ms", list(_ttft_params()))
def test_first_token_latency_within_15_percent_of_tensorrt_llm(model, gpu, tp, prompt, published_ms):
    """Batch-1 first-token latency (one prefill iteration). Measured 2026-12-02 (this test's function): Llama-2-7B
    2,048 tokens 126.57 ms (-4.8%), Llama-2-70B TP4 350.40 ms (-7.1%); misses: their xfail reasons."""
    compute = RooflineComputeModel(model(), get_gpu(gpu), tp)
    assert compute.iteration_us(prefill_batch(1, prompt)) / 1e3 == pytest.approx(published_ms, rel=TOLERANCE)


THROUGHPUT_CHECKS = [  # (name, batch, input, output tokens, published output tokens/s); Llama-2-7B, one A100, FP16
    ("trt-llm a100 fp16 llama-2-7b 60x128/2048", 60, 128, 2048, 1928.0),
    ("trt-llm a100 fp16 llama-2-7b 52x2048/128", 52, 2048, 128, 591.0),
    ("trt-llm a100 fp16 llama-2-7b 384x128/128", 384, 128, 128, 5586.0),
]


@pytest.mark.parametrize("batch, input_tokens, output_tokens, published_tokens_per_s",
                         [c[1:] for c in THROUGHPUT_CHECKS], ids=[c[0] for c in THROUGHPUT_CHECKS])
def test_static_batch_throughput_within_15_percent_of_tensorrt_llm(batch, input_tokens, output_tokens,
                                                                    published_tokens_per_s):
    """Output tokens/s of a static batch, ``batch x output / E2E``. Measured 2026-12-02: 1,815 (-5.8%), 536
    (-9.3%), 5,526 (-1.1%). The table's TP rows (Llama-2-7B TP2, Llama-2-70B TP4) are left out: for A100 the page
    heads them "out tok/s" while its H100 table is per GPU, and which one the A100 TP rows are is not stated."""
    compute = RooflineComputeModel(get_model("llama-2-7b"), get_gpu("a100"), 1)
    _, _, e2e_us = static_batch_us(compute, batch, input_tokens, output_tokens)
    assert batch * output_tokens / (e2e_us / 1e6) == pytest.approx(published_tokens_per_s, rel=TOLERANCE)


# ---- vLLM on one A100 40GB (module docstring) ----------------------------------------------------------------------

def _vllm_a100_40gb_tpot_us(bw_efficiency=None):
    graphs = engine_preset("vllm-v1", get_gpu("a100-40gb"))["cuda_graph_decodes"]
    compute = RooflineComputeModel(get_model("llama-3.1-8b"), get_gpu("a100-40gb"), 1, decode_graphs=float(graphs),
                                   bw_efficiency=bw_efficiency)
    _, tpot_us, _ = static_batch_us(compute, 1, 1024, 128)
    return tpot_us


def test_vllm_single_request_decode_speed_on_a100_40gb_within_15_percent():
    assert 1e6 / _vllm_a100_40gb_tpot_us() == pytest.approx(75.0, rel=TOLERANCE)


def test_vllm_a100_40gb_uses_the_a100_fractions():
    """The check above passes because a100-40gb carries the A100-80GB's Vidur-derived fractions (same GA100
    silicon): 79.0 tokens/s (+5.3%); with the H200's borrowed 0.896 it was 91.9 tokens/s (+22.5%, a miss)."""
    assert get_gpu("a100-40gb").bw_efficiency == get_gpu("a100").bw_efficiency == 0.77
    assert 1e6 / _vllm_a100_40gb_tpot_us(bw_efficiency=H200_BW_EFFICIENCY) == pytest.approx(91.9, rel=0.01)
