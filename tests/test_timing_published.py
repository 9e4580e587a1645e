"""Checks of kvsim's built-in roofline against published decode-iteration times (issue 31, item 5).

Figures: issue 31's reading of Sarathi-Serve (Agrawal et al., OSDI'24): a Mistral-7B decode iteration of 32
sequences x 4K context on one A100 takes ~20 ms; Yi-34B at TP2 on two A100s ~40 ms (the paper's exact figure or
table was not located in the searchable corpora; the batch of the Yi-34B figure is taken as the same 32 x 4K).
Tolerance 15%: the figures are read off plots ("~"), and issue 31's done-when bound is 15%. A check that misses
it is an xfail with its measured error (strict), never a looser bound. The table with and without the per-GPU
defaults is in docs/models.md.
"""
from __future__ import annotations

import pytest

from sim.setup.catalog import get_gpu, get_model
from sim.timing.compute import H200_BW_EFFICIENCY, H200_FLOPS_EFFICIENCY, RooflineComputeModel, decode_batch

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
