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


def test_block_form_splits_a_gpt_oss_decode_by_group_by_hand():
    """The block form (``attention_key_us > 0``, e.g. profiles/h200-cross-workload.json) on a hybrid batch: each
    group of attention layers over its own reads. Four decodes at 1,000 tokens, no key split, tau0 = 10 us,
    kappa = 0.1 us/key, P = 100 block slots, H' = 8 KV heads; per layer ``max(H' (tau0 b + kappa (keys + b)) / P,
    tau0 + kappa longest)`` (longest: 1,001 tokens with the new one): full 12 x max(35.232, 110.1) us, sliding (127
    cached keys each, a lone block reads the window's 128) 12 x max(7.296, 22.8) us: 1,594.8 us of attention
    against 2,642.4 with every layer full."""
    from dataclasses import replace

    spec = load_model_file("models/gpt-oss-20b.json")
    model = replace(RooflineComputeModel(spec, get_gpu("h200")), attention_block_us=10.0, attention_key_us=0.1,
                    attention_slots=100.0, split_kv_slot_tokens=0, decode_graphs=1.0)
    reads = batch_reads(read_groups(spec), [(1000, 1)] * 4)
    plain = decode_batch(4, 1000)
    hybrid = BatchShape(plain.new_tokens, plain.attention_pairs, plain.kv_read_tokens, plain.logit_sequences,
                        plain.max_context_tokens, group_reads=reads)
    factor = model.paged_attention_factor * model.layout_attention_factor
    assert model.iteration_us(plain) - model.iteration_us(hybrid) == pytest.approx((2642.4 - 1594.8) * factor,
                                                                                   rel=1e-9)
    # within the window every group reads what a full layer reads: the same time
    short = decode_batch(4, 50)
    short_hybrid = BatchShape(short.new_tokens, short.attention_pairs, short.kv_read_tokens, short.logit_sequences,
                              short.max_context_tokens, group_reads=batch_reads(read_groups(spec), [(50, 1)] * 4))
    assert model.iteration_us(short_hybrid) == pytest.approx(model.iteration_us(short), rel=1e-12)


def test_block_form_prefill_keys_scale_with_the_groups_pairs():
    """A 2,048-token prefill chunk after 2,048 cached tokens: the sliding layers' query blocks read
    ``K x pairs_g / pairs`` keys, fewer than the full layers'; the hybrid iteration is shorter, and every
    group-weighted term is bounded by the all-full one."""
    from dataclasses import replace

    spec = load_model_file("models/gpt-oss-20b.json")
    model = replace(RooflineComputeModel(spec, get_gpu("h200")), attention_block_us=10.0, attention_key_us=0.1,
                    attention_slots=100.0, split_kv_slot_tokens=0)
    reads = batch_reads(read_groups(spec), [(2048, 2048)])
    pairs = 2048 * (2048 + (2048 + 1) / 2)
    plain = BatchShape(2048, pairs, 2048, 1, 4096)
    hybrid = BatchShape(2048, pairs, 2048, 1, 4096, group_reads=reads)
    assert reads[1].attention_pairs < reads[0].attention_pairs == pytest.approx(pairs)
    assert model.iteration_us(hybrid) < model.iteration_us(plain)
