"""Attention reads per layer group (sim.timing.layer_reads): a hybrid model's window layers read at most their
window, checked by hand on gpt-oss-20b and by brute force on the per-sequence rule."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.memory.layer_groups import LayerGroup
from sim.setup.catalog import get_gpu
from sim.setup.model_files import load_model_file
from sim.timing.compute import BatchShape, RooflineComputeModel, decode_batch
from sim.timing.layer_reads import batch_reads, read_groups, sequence_reads


def test_gpt_oss_decode_beyond_window_by_hand():
    """Four decodes at 1,000 cached tokens: the 12 full layers read 1,000 keys per sequence, the 12 sliding
    layers (W = 128, FlashAttention window (127, 0)) 127 cached keys and attend to 128."""
    spec = load_model_file("models/gpt-oss-20b.json")
    model = RooflineComputeModel(spec, get_gpu("h200"))
    groups = read_groups(spec)
    batch, context = 4, 1000
    reads = batch_reads(groups, [(context, 1)] * batch)
    full, sliding = reads
    assert (full.kv_read_tokens, full.attention_pairs) == (4000, 4004)
    assert (sliding.kv_read_tokens, sliding.attention_pairs) == (4 * 127, 4 * 128)
    plain = decode_batch(batch, context)
    hybrid = BatchShape(plain.new_tokens, plain.attention_pairs, plain.kv_read_tokens, plain.logit_sequences,
                        plain.max_context_tokens, group_reads=reads)
    bytes_per_us = model.bw_efficiency * 4.8e12 / 1e6
    flops_per_us = model.flops_efficiency * 989e12 / 1e6 * model.attention_flops_efficiency
    per_token_layer = 2 * 8 * 64 * 2                      # K and V, 8 KV heads x 64, bf16: 2,048 B
    flops_per_pair = 4 * 64 * 64                          # 4 x 64 query heads x head_dim 64
    every_layer_us = max(flops_per_pair * 24 * 4004 / flops_per_us, (4000 + 4) * 24 * per_token_layer / bytes_per_us)
    split_us = max(flops_per_pair * 12 * (4004 + 512) / flops_per_us,
                   ((4000 + 4) + (508 + 4)) * 12 * per_token_layer / bytes_per_us)
    assert split_us == pytest.approx(25.81, abs=0.01)     # memory-bound: 110,985,216 B at 4.30 TB/s
    assert model.iteration_us(plain) - model.iteration_us(hybrid) == pytest.approx(every_layer_us - split_us, rel=1e-9)


def test_all_full_model_has_no_read_groups():
    """A full-attention model never takes the split (its results stay the plain roofline's)."""
    assert read_groups(load_model_file("models/llama-3.1-70b.json")) is None


def test_linear_layers_read_their_state():
    """Jamba: the 28 Mamba layers read no keys; each sequence reads and writes their state once."""
    spec = load_model_file("models/jamba-v0.1.json")
    reads = batch_reads(read_groups(spec), [(5000, 1), (10, 1)])
    linear = [r for r in reads if r.group.kind == "linear"][0]
    assert (linear.kv_read_tokens, linear.attention_pairs, linear.sequences) == (0, 0, 2)


def _brute(kind, window, context, tokens):
    keys_of = {"full": lambda p: range(p + 1),
               "sliding": lambda p: range(max(0, p - window + 1), p + 1),
               "chunked": lambda p: range(p // window * window, p + 1)}[kind]
    cached = set(k for k in keys_of(context) if k < context)
    return len(cached), float(sum(len(keys_of(p)) for p in range(context, context + tokens)))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["full", "sliding", "chunked"]), st.integers(1, 40), st.integers(0, 120), st.integers(1, 50))
def test_sequence_reads_match_the_masks(kind, window, context, tokens):
    """The closed forms equal counting the keys each query's mask admits (the module's table)."""
    group = LayerGroup(kind, 2, 0 if kind == "full" else window, 100)
    assert sequence_reads(group, context, tokens) == _brute(kind, window, context, tokens)
