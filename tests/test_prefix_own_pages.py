"""A request preempted by recompute keeps its own full blocks cached for its re-admission, as vLLM v1 does
(``Request.block_hashes`` covers the prompt's and the output's full blocks; ``KVCacheManager.free`` leaves them
cached; the re-admission looks up ``num_tokens - 1`` tokens): paged prefix caching only. Expected values are
hand-computed from the block sizes in each test."""
import pandas as pd
import pytest

import traces
from sim.core.runner import run_simulation
from sim.frontend.policy_spec import parse_policy
from sim.memory import PrefixCachingPolicy, VAttentionConfig
from sim.setup.config import SimConfig


def _policy(pool: int, cow: bool = False, per_page: int = 16) -> PrefixCachingPolicy:
    config = VAttentionConfig(num_slots=3, max_pages_per_slot=4096 // per_page, pool_page_groups=pool,
                              tokens_per_page=per_page, admission_watermark_frac=0.0,
                              low_watermark_frac=0.0, eager_page_groups=0, deferred_reclaim=False)
    return PrefixCachingPolicy(config, block_tokens=512, cow_partial=cow)


def _run_then_preempt(p: PrefixCachingPolicy, ids, prompt: int, generated: int, owner: int) -> int:
    """Admit a prompt, compute it and ``generated`` more tokens (donating its hash-block pages), then preempt it
    by recompute: its own pages are kept and the slot freed. Returns the pages kept."""
    slot = p.alloc_slot(prompt)
    p.admit_prefix(slot, ids, prompt)
    computed = prompt + generated
    assert p.step({slot: computed}) is not None
    p.donate(slot, ids, prompt, computed)
    kept = p.keep_own_pages(slot, owner, computed)
    p.free_slot(slot, 0)
    p.iteration_completed(0)
    assert p.conservation_error() == 0
    return kept


def test_the_owner_re_hits_its_prompt_tail_and_output_blocks():
    """Prompt 1,100 tokens with two 512-token hash blocks (64 pages of 16), 200 tokens generated: 1,300 tokens of
    KV = 81 full pages, of which 17 (tokens 1,024-1,295) are the request's own. The owner's re-admission
    (seq_len 1,300) looks up 1,299 tokens: all 81 pages = 1,296 tokens; another request with the same hash ids
    hits the 64 hash-block pages (1,024 tokens) only."""
    p = _policy(pool=200)
    assert _run_then_preempt(p, [1, 2], 1100, 200, owner=7) == 17
    assert p.admission_credit([1, 2], 1100, (7, 1300))[0] == 1296
    assert p.admission_credit([1, 2], 1100)[0] == 1024
    assert p.admission_credit([1, 2], 1100, (8, 1300))[0] == 1024      # another owner's pages are not its own
    slot = p.alloc_slot(1300, cached=p.admission_credit([1, 2], 1100, (7, 1300))[1:])
    hit = p.admit_prefix(slot, [1, 2], 1100, (7, 1300))
    assert hit.hit_tokens == 1296 and p.conservation_error() == 0


def test_the_cap_is_seq_len_minus_one_and_no_hash_ids_still_hit_own_pages():
    """No hash ids, 512 + 288 tokens computed = 50 full pages, all own. A re-admission at seq_len 800 looks up
    799 tokens: 49 pages (784 tokens), never the last page whose last token is the one to compute."""
    p = _policy(pool=100)
    assert _run_then_preempt(p, (), 512, 288, owner=3) == 50
    assert p.admission_credit((), 512, (3, 800))[0] == 784
    assert p.admission_credit((), 512, (3, 801))[0] == 800


def test_an_evicted_hash_block_breaks_the_chain_before_the_own_pages():
    """The chain is contiguous: with the first hash page evicted, neither the rest nor the own pages hit."""
    p = _policy(pool=200)
    _run_then_preempt(p, [1, 2], 1100, 200, owner=7)
    first = next(key for key in p._unmapped if key[0] == 0)
    del p._unmapped[first]
    p._evict_entry(first)
    p._count_evicted(1)
    assert p.admission_credit([1, 2], 1100, (7, 1300))[0] == 0
    assert p.conservation_error() == 0


def test_own_pages_are_evicted_tail_first_before_the_prompt_blocks():
    """Freed tail first (vLLM's free_blocks order): in a pool of the request's 82 pages, taking 6 takes the
    partial last page (freed first) and evicts the 5 own pages freed next (pages 80-76), so the owner re-hits
    76 of 81 pages (1,216 tokens)."""
    p = _policy(pool=82)
    _run_then_preempt(p, [1, 2], 1100, 200, owner=7)
    assert p.free_page_groups == 1 and len(p.cache) == 81
    p._take_pages(6)
    assert p.admission_credit([1, 2], 1100, (7, 1300))[0] == 76 * 16


def test_vattention_pages_are_not_kept_but_its_hash_blocks_are_capped_at_seq_len():
    """vAttention keeps no own pages (the engine never asks it to), but its re-admission's hash blocks are capped
    at ``seq_len - 1`` as vLLM's: a 1,024-token prompt of two hash blocks in one 1,024-token page, resumed at 1,025
    tokens, hits the whole page (its first admission: 1,023 tokens copied into a fresh page)."""
    assert not _policy(pool=10, cow=True, per_page=512).caches_own_pages
    assert _policy(pool=10).caches_own_pages
    p = _policy(pool=10, cow=True, per_page=1024)
    slot = p.alloc_slot(1024)
    p.admit_prefix(slot, [1, 2], 1024)
    assert p.step({slot: 1025}) is not None
    assert p.donate(slot, [1, 2], 1024, 1025) == 1
    p.free_slot(slot, 0)
    p.iteration_completed(0)
    assert p.lookup([1, 2], 1024) == ([], 1023)                       # a first admission: copy-on-write
    assert p.lookup([1, 2], 1024, (5, 1025)) == ([(0, p.block_chain([1, 2])[1])], 0)
    assert p.admission_credit([1, 2], 1024, (5, 1025))[0] == 1024


def test_a_preempted_request_re_hits_its_blocks_in_a_run(tmp_path):
    """Three 600 + 700-token requests in a 282 MiB pool (141 blocks of 16 tokens, llama-3-8b: 128 KiB a token):
    the vLLM scheduler preempts; under ``paged:prefix=on`` (no hash ids in the trace) a re-admitted request hits
    its own blocks, counted apart (``prefix_hit_tokens_preempted``), in whole blocks, never more than it
    recomputes, and nothing else changes in the memory rules: the same preemptions as plain ``paged``."""
    path = tmp_path / "pre.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,600,700\n0.001,600,700\n0.002,600,700\n")
    rows = {}
    for policy in ("paged", "paged:prefix=on"):
        config = SimConfig(memory_util_frac=0.1085, scheduler="vllm").with_overrides(parse_policy(policy))
        rows[policy] = run_simulation(config, traces.load_trace(path)).requests
    plain, prefix = rows["paged"], rows["paged:prefix=on"]
    assert list(plain["preemptions"]) == list(prefix["preemptions"]) and plain["preemptions"].sum() > 0
    hits = prefix["prefix_hit_tokens_preempted"]
    assert hits.sum() > 0 and (hits % 16 == 0).all() and (hits <= prefix["recomputed_tokens"]).all()
    assert (prefix["prefix_hit_tokens"] == 0).all()
    assert prefix["e2e_us"].sum() < plain["e2e_us"].sum()


# ---- whole runs against vLLM v1 (helper-60 derived each value by hand from vllm/v1/core/sched/scheduler.py,
# kv_cache_manager.py and block_pool.py, and checked it with a reimplementation of the v1 scheduler) ----------

def _simulate(tmp_path, name: str, text: str, *args):
    import json

    from cli import main
    path = tmp_path / name
    path.write_text(text)
    out = tmp_path / f"run-{name}"
    assert main(["simulate", "--trace", str(path), *args, "--out", str(out), "--quiet"]) == 0
    return (json.loads((out / "summary.json").read_text()), pd.read_parquet(out / "requests.parquet"),
            pd.read_parquet(out / "iterations.parquet"))


def _prefills(iterations) -> dict:
    rows = iterations[iterations["prefill_tokens"] > 0]
    return dict(zip(rows["iteration"], rows["prefill_tokens"]))


@pytest.mark.parametrize("policy", ["paged:block=512,prefix=on", "vattention:page=1MiB,prefix=on"])
def test_a_resumed_request_hits_up_to_num_tokens_minus_one(tmp_path, policy):
    """Blocks of 512, a pool of 3: request 1 (512 tokens, hash [2]) is preempted after its prefill and re-admitted
    at 513 tokens; vLLM caps the hit at num_tokens - 1 = 512 (not prompt - 1 = 511, which missed its one block),
    so it computes 1 token, a decode. vAttention with 1 MiB pages (512 tokens of llama-3-8b's 2 KiB per token
    and sub-tensor) runs the same (it copied 511 tokens and recomputed 2)."""
    trace = ('{"timestamp":0,"input_length":512,"output_length":100,"hash_ids":[1]}\n'
             '{"timestamp":0,"input_length":512,"output_length":10,"hash_ids":[2]}\n')
    _, requests, iterations = _simulate(tmp_path, "cap.jsonl", trace, "--policy", policy,
                                        "--memory-util", "0.10809208959039027")
    assert list(requests["prefix_hit_tokens_preempted"]) == [0, 512]
    assert list(requests["recomputed_tokens"]) == [0, 512]
    assert _prefills(iterations) == {0: 1024}


def test_generated_blocks_are_re_hit_tail_first_evicted(tmp_path):
    """20 blocks of 16; prompts of 160, 16, 16 tokens, 100 outputs each, no hash ids. At iteration 100 requests
    1 and 2 are re-admitted: request 1 hits its prompt block and two blocks of generated tokens (48 tokens; its two
    tail blocks were evicted first) and computes 33, request 2 computes 49: 82 prefill tokens (kvsim prefilled 130)."""
    _, requests, iterations = _simulate(tmp_path, "pre3.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n"
                                        "0.0,160,100\n0.0,16,100\n0.0,16,100\n",
                                        "--policy", "paged:prefix=on,admission=chunk",
                                        "--memory-util", "0.10681923206332875")
    assert list(requests["prefix_hit_tokens_preempted"]) == [0, 48, 0]
    assert _prefills(iterations) == {0: 192, 100: 82}


def test_hash_blocks_then_generated_blocks(tmp_path):
    """80 blocks of 16; prompts 512 [1], 16 [2], 512 [3]. Request 2 is preempted twice; at its second
    re-admission (iteration 200) it hits 32 prompt blocks and 3 generated ones and computes 44 tokens; over the
    run 992 tokens are hit after preemption (kvsim hit 928 and computed 108 there)."""
    trace = ('{"timestamp": 0.0, "input_length": 512, "output_length": 200, "hash_ids": [1]}\n'
             '{"timestamp": 0.0, "input_length": 16, "output_length": 150, "hash_ids": [2]}\n'
             '{"timestamp": 0.0, "input_length": 512, "output_length": 120, "hash_ids": [3]}\n')
    summary, requests, iterations = _simulate(tmp_path, "g3.jsonl", trace, "--policy",
                                              "paged:prefix=on,admission=chunk",
                                              "--memory-util", "0.10765389273898657")
    assert summary["prefill_tokens_saved_preempted"] == 992
    assert list(requests["preemptions"]) == [0, 0, 2]
    assert _prefills(iterations)[200] == 44


def test_the_vllm_v1_preset_admits_on_the_first_chunk_without_a_watermark(tmp_path):
    """``--engine vllm-v1`` on an H200 (budget 8,192), 520 blocks of 16: step 0 runs the 8,000-token prompt and a
    192-token chunk of the 1,000-token one (vLLM v1 allocates the scheduled tokens' blocks: 500 + 12 of 520);
    request 1 is preempted at step 1 and re-admitted with a 192-token hit on its own blocks. And with 100 usable
    blocks (101, less vLLM's null block), 1,000 + 592 tokens need exactly 100: both are admitted in step 0 (no 1%
    watermark held back); with 100 (99 usable) request 1's 37 blocks do not fit beside request 0's 63, and vLLM v1
    schedules no smaller chunk for want of blocks: step 0 runs request 0 alone."""
    csv = "arrived_at,num_prefill_tokens,num_decode_tokens\n"
    _, requests, iterations = _simulate(tmp_path, "wp.csv", csv + "0.0,8000,20\n0.0,1000,5\n", "--engine",
                                        "vllm-v1", "--max-batch", "256", "--memory-util", "0.11377473769381055")
    assert _prefills(iterations)[0] == 8192
    assert list(requests["preemptions"]) == [0, 1]
    assert list(requests["prefix_hit_tokens_preempted"]) == [0, 192]
    _, requests, iterations = _simulate(tmp_path, "wm.csv", csv + "0.0,1000,20\n0.0,592,5\n", "--engine",
                                        "vllm-v1", "--max-batch", "100", "--memory-util", "0.1079460239754668")
    assert _prefills(iterations)[0] == 1592
    assert iterations["batch_size"].iloc[0] == 2
    _, requests, iterations = _simulate(tmp_path, "wm99.csv", csv + "0.0,1000,20\n0.0,592,5\n", "--engine",
                                        "vllm-v1", "--max-batch", "99", "--memory-util", "0.10793211296420584")
    assert _prefills(iterations)[0] == 1000
